"""Events as a real API server keeps them: one store, two APIs, and a time to live.

Upstream stores `core/v1` and `events.k8s.io/v1` Events as the same objects and
converts field by field between the two shapes (involvedObject <-> regarding,
message <-> note, source <-> deprecatedSource, count <-> deprecatedCount, ...), so an
Event written through one API is read through the other. `to_events_v1`/`to_core`
are that conversion; the store serves `events.k8s.io/v1` as a view over the
`core/v1` objects with them.

Events expire: etcd drops each one `--event-ttl` (default 1 h) after its last write.
`Expiry` tracks the last write of every Event and deletes the ones whose time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flotilla.kubesim.errors import ApiError

if TYPE_CHECKING:
    from flotilla.kubesim.store import Store, WatchRecord

log = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS = 3600.0
CORE = ("v1", "Event")
EVENTS_V1 = ("events.k8s.io/v1", "Event")

# core/v1 field -> events.k8s.io/v1 field; every other key is shared as is.
_RENAMES = {
    "involvedObject": "regarding",
    "message": "note",
    "reportingComponent": "reportingController",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_BACK = {new: old for old, new in _RENAMES.items()}
# core/v1's `source` selects on the reporting component.
_CORE_FIELD_ALIASES = {"source": "source.component"}
_SELECTOR_KEY = re.compile(r"^\s*([A-Za-z0-9_.-]+)(\s*(?:==|!=|=).*)$")


def to_events_v1(event: dict[str, Any]) -> dict[str, Any]:
    """A stored core/v1 Event as events.k8s.io/v1 shows it."""
    out: dict[str, Any] = {"apiVersion": EVENTS_V1[0], "kind": EVENTS_V1[1]}
    for key, value in event.items():
        if key not in ("apiVersion", "kind"):
            out[_RENAMES.get(key, key)] = value
    return out


def to_core(event: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as it is stored (core/v1)."""
    out: dict[str, Any] = {"apiVersion": CORE[0], "kind": CORE[1]}
    for key, value in event.items():
        if key not in ("apiVersion", "kind"):
            out[_BACK.get(key, key)] = value
    return out


def field_selector(api_version: str, kind: str, selector: str | None) -> str | None:
    """The selector with upstream's per-kind field aliases spelled out as paths."""
    if not selector or (api_version, kind) != CORE:
        return selector
    parts = []
    for part in selector.split(","):
        m = _SELECTOR_KEY.match(part)
        if m and m[1] in _CORE_FIELD_ALIASES:
            part = _CORE_FIELD_ALIASES[m[1]] + m[2]
        parts.append(part)
    return ",".join(parts)


class Expiry:
    """Deletes Events `ttl` seconds after their last write (etcd's lease, simulated)."""

    def __init__(
        self,
        store: Store,
        ttl: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._rt = store.resource_type(*CORE)
        # namespace -> name -> time of the last write: no key tuple per Event (a cluster
        # may hold tens of thousands of them).
        self._written: dict[str, dict[str, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def _forget(self, namespace: str, name: str) -> None:
        names = self._written.get(namespace)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self._written[namespace]

    def _on_record(self, record: WatchRecord) -> None:
        meta = record.object["metadata"]
        namespace, name = meta.get("namespace") or "", meta["name"]
        if record.type == "DELETED":
            self._forget(namespace, name)
        else:
            self._written.setdefault(namespace, {})[name] = self.clock()

    def expire(self) -> int:
        """Delete every Event whose time is up; returns how many."""
        deadline = self.clock() - self.ttl
        due = [
            (namespace, name)
            for namespace, names in self._written.items()
            for name, written in names.items()
            if written <= deadline
        ]
        for namespace, name in due:
            self._forget(namespace, name)
            with contextlib.suppress(ApiError):
                self.store.delete(self._rt, namespace or None, name)
        return len(due)

    def start(self) -> None:
        """Track every Event from now on (those already stored from now) and expire them."""
        if self._unsubscribe is not None:
            return
        now = self.clock()
        for event in self.store.iter_frozen(self._rt):
            meta = event["metadata"]
            self._written.setdefault(meta.get("namespace") or "", {}).setdefault(meta["name"], now)
        self._unsubscribe = self.store.add_record_listener(self._rt, self._on_record)
        self._task = asyncio.create_task(self._loop(), name="event-expiry")

    async def stop(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        # A tenth of the TTL keeps expiry within 10% of it without busy-looping.
        interval = min(max(self.ttl / 10, 0.05), 60.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.expire()
            except Exception:
                log.exception("expiring events failed")
