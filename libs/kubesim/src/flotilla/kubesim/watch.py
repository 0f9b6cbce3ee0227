"""Watch fan-out: one encoded line per event, shared by every watcher of a type.

A watcher is a filter (namespace, label and field selectors) plus a queue of
already-encoded NDJSON lines. Store commits call `WatchHub.publish` synchronously,
so an event is filtered and queued for every watcher before the event loop can
switch; a writer task per HTTP response drains its queue in batches. Encoding is
cached on the store's `WatchRecord`, so 20 watchers of 10,000 pods cost one
`json.dumps` per event, not twenty.

Selector semantics follow upstream: an object that starts matching arrives as
ADDED, one that stops matching as DELETED.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from flotilla.kubesim.resources import ResourceType
from flotilla.kubesim.selectors import ObjectMatcher, labels_of
from flotilla.kubesim.store import WatchRecord

LabelMatcher = Callable[[Mapping[str, str]], bool]

# A watcher further behind than this is cut off; its client re-watches from its last
# resourceVersion (or relists after 410), which is what real API servers do too.
MAX_BACKLOG = 250_000


# One compact encoder for every line (`json.dumps` with arguments builds one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_event(kind: str, obj: Mapping[str, Any], api_version: str | None = None) -> bytes:
    if api_version is not None and obj.get("apiVersion") != api_version:
        obj = {**obj, "apiVersion": api_version}
    return _ENCODER.encode({"type": kind, "object": obj}).encode() + b"\n"


def encode_record(record: WatchRecord, kind: str, rt: ResourceType) -> bytes:
    api_version = rt.api_version if rt.custom else None
    key = (kind, api_version)
    line = record.encoded.get(key)
    if line is None:
        line = encode_event(kind, record.object, api_version)
        record.encoded[key] = line
    return line


# Over TLS each write is encrypted per watcher; batches of 64 lines (~100 KiB of pods)
# keep the lag and the per-connection buffers lower than 256 did, at no cost in
# throughput (bench/kubesim.py).
MAX_LINES_PER_WRITE = 64


class Watcher:
    """One open watch: its filter and its queue of lines to write."""

    def __init__(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelMatcher | None,
        fields: ObjectMatcher | None,
        encode: Callable[[str, Mapping[str, Any]], bytes] | None = None,
    ) -> None:
        self.rt = rt
        # A per-watch encoding (server-side printing) instead of the shared cached line.
        self.encode = encode
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.pending: deque[bytes] = deque()
        self.closed = False
        self.reason = ""
        self._wakeup = asyncio.Event()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        if self.namespace and obj.get("metadata", {}).get("namespace") != self.namespace:
            return False
        if self.labels is not None and not self.labels(labels_of(obj)):
            return False
        return self.fields is None or self.fields(obj)

    def event_type(self, record: WatchRecord) -> str | None:
        """What this watcher sees of a change, or None when it sees nothing."""
        if self.labels is None and self.fields is None:
            if self.namespace and record.object["metadata"].get("namespace") != self.namespace:
                return None
            return record.type
        now = self.matches(record.object)
        if record.type != "MODIFIED":
            return record.type if now else None
        before = record.old is not None and self.matches(record.old)
        if now:
            return "MODIFIED" if before else "ADDED"
        return "DELETED" if before else None

    def offer(self, record: WatchRecord) -> None:
        kind = self.event_type(record)
        if kind is None:
            return
        if self.encode is not None:
            self.push(self.encode(kind, record.object))
        else:
            self.push(encode_record(record, kind, self.rt))

    def push(self, line: bytes) -> None:
        if self.closed:
            return
        self.pending.append(line)
        if len(self.pending) > MAX_BACKLOG:
            self.close("watcher fell too far behind")
        self._wakeup.set()

    def close(self, reason: str = "") -> None:
        self.closed = True
        self.reason = reason
        self._wakeup.set()

    def take(self, limit: int = MAX_LINES_PER_WRITE) -> list[bytes]:
        """At most `limit` queued lines: a slow reader's backlog is written in bounded
        chunks instead of one copy of everything it is behind on."""
        count = min(limit, len(self.pending))
        lines = [self.pending.popleft() for _ in range(count)]
        if not self.pending:
            self._wakeup.clear()
        return lines

    async def wait(self, seconds: float | None) -> None:
        if self.pending or self.closed:
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), seconds)
        except TimeoutError:
            return


class WatchHub:
    """All open watches of one server, so outages and shutdown can end them."""

    def __init__(self) -> None:
        self.watchers: set[Watcher] = set()

    def __len__(self) -> int:
        return len(self.watchers)

    def add(self, watcher: Watcher) -> None:
        self.watchers.add(watcher)

    def discard(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def close_all(self, reason: str) -> None:
        for watcher in list(self.watchers):
            watcher.close(reason)
