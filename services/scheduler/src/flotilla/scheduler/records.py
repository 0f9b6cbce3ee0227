"""The scheduler's durable state in JetStream KV: one placement record per object, and
the fleet's clusters as the scheduler last saw them.

Why KV and compare-and-set: several scheduler replicas may run at once, and any
of them may die between deciding and acknowledging. The placement record is the
one thing that says where an object runs; it is written with ``kv.update(key,
value, last=revision)`` so that of two writers that read the same revision only
one wins, and the loser re-reads and decides again (ARCHITECTURE.md principle 3).
The record also keeps the ``ResourceAnalyzed`` it was decided from, so a
``RescheduleRequested`` (which names only the object) can be decided without
asking the dependency detector again, and the ``PlacementDecided`` it published,
so a redelivered event re-publishes exactly the same decision.

Clusters live in a second bucket (``<prefix>-scheduler-clusters``): a
``ClusterObserved`` reaches only the replica that owns the cluster key's
partition, but every replica decides against every cluster, so the owner writes
the cluster here and every replica follows the bucket with a KV watch
(`flotilla.scheduler.service`).

Keys: an object key such as ``apps/v1/Deployment/default/web`` is a valid NATS KV
key as it is; any character KV keys do not allow is written ``=XX`` (hex), so
the mapping is reversible and readable for the common case.

This module and `flotilla.scheduler.service` are the scheduler's only adapters
that touch NATS; the KV handle is the one `flotilla.common.bus.Bus.bucket` returns.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import nats.errors
import nats.js.errors
from pydantic import BaseModel, ConfigDict, Field

from flotilla.common import api
from flotilla.common.errors import Unavailable
from flotilla.common.events import ClusterPlacement, PlacementDecided, ResourceAnalyzed
from flotilla.common.topology import BucketSpec, Topology

_KEY_SAFE = re.compile(r"[-/_a-zA-Z0-9.]")


def encode_key(key: str) -> str:
    """An object key as a KV key: unsafe characters (and ``=``) become ``=XX``."""
    out = []
    for char in key:
        if _KEY_SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"={byte:02X}" for byte in char.encode())
    text = "".join(out)
    # KV keys may not start or end with a dot, nor hold empty tokens.
    text = text.replace("..", ".=2E")
    if text.startswith("."):
        text = "=2E" + text[1:]
    if text.endswith("."):
        text = text[:-1] + "=2E"
    return text


def decode_key(text: str) -> str:
    """The inverse of `encode_key`."""
    return bytes(_unescape(text)).decode()


def _unescape(text: str) -> bytearray:
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "=":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(text[i].encode())
            i += 1
    return out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacementRecord(_Model):
    """Where one object runs, what it was decided from, and what was published."""

    key: str
    uid: str = ""
    generation: int = 0
    revision: int = Field(default=0, description="the hub resourceVersion last acted on")
    analyzed: ResourceAnalyzed
    decided: PlacementDecided
    """The last ``PlacementDecided`` published for this key (the KV record equals it)."""
    schedulable: bool = True
    pending: int = Field(default=0, description="replicas that fit nowhere yet")
    cause: str = Field(default="", description="id of the event that led to `decided`")
    held_back: str = Field(
        default="",
        description="why the newest decision was not applied (it did not fit); empty if it was",
    )

    @property
    def clusters(self) -> tuple[ClusterPlacement, ...]:
        return tuple(self.decided.clusters)

    @property
    def deleted(self) -> bool:
        return self.decided.deleted

    @property
    def waiting(self) -> bool:
        """Pending: something of the object is not placed and a change may help it."""
        return not self.deleted and (not self.schedulable or self.pending > 0)


class ClusterRecord(_Model):
    """A cluster as last observed, with the hub resourceVersion it was observed at."""

    name: str
    revision: int = 0
    cluster: api.Cluster | None = Field(description="None: the cluster was removed")
    previous: api.Cluster | None = Field(
        default=None, description="the cluster before this change (what the change is judged by)"
    )
    cause: str = Field(default="", description="id of the ClusterObserved that wrote this")


class Conflict(Exception):
    """Another writer changed the record since it was read (compare-and-set lost)."""


Stored = tuple[PlacementRecord, int]
"""A record and its KV revision (what the next compare-and-set must name)."""


@contextlib.contextmanager
def _nats_errors(operation: str) -> Iterator[None]:
    try:
        yield
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise Conflict(operation) from exc
    except (nats.errors.Error, OSError) as exc:
        raise Unavailable(f"{operation}: {exc}") from exc


class KeyValueStore:
    """Typed records in one KV bucket, read and written by compare-and-set."""

    def __init__(self, kv: Any, parse: Callable[[bytes], Any]) -> None:
        self.kv = kv
        self._parse = parse

    async def get(self, key: str) -> tuple[Any, int] | None:
        """The record under `key` and its revision, or None."""
        with _nats_errors(f"read {key}"):
            try:
                entry = await self.kv.get(encode_key(key))
            except nats.js.errors.KeyNotFoundError:
                return None
        if not entry.value:
            return None
        return self._parse(entry.value), int(entry.revision)

    async def write(self, key: str, record: BaseModel, *, last: int) -> int:
        """Write `record` if the stored revision is still `last` (0: must not exist).

        Returns the new revision; raises `Conflict` when another writer got there first.
        """
        data = record.model_dump_json(by_alias=True).encode()
        with _nats_errors(f"write {key}"):
            if last == 0:
                return int(await self.kv.create(encode_key(key), data))
            return int(await self.kv.update(encode_key(key), data, last=last))

    async def last_revision(self) -> int:
        """The bucket's newest revision (a watcher that has seen it is up to date)."""
        with _nats_errors("bucket status"):
            status = await self.kv.status()
        return int(status.stream_info.state.last_seq)

    async def watch(self) -> AsyncIterator[tuple[str, Any | None, int]]:
        """Every record now in the bucket, then every change: (key, record or None, revision).

        A ``("", None, 0)`` marker follows the initial contents (also for an empty
        bucket), so a follower knows when it has caught up.
        """
        with _nats_errors("watch"):
            watcher = await self.kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:
                    yield "", None, 0
                    continue
                value = None if entry.operation or not entry.value else self._parse(entry.value)
                yield decode_key(entry.key), value, int(entry.revision)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()


def clusters_bucket(topology: Topology) -> BucketSpec:
    """The scheduler's own bucket of observed clusters (see the module docstring)."""
    return BucketSpec(name=f"{topology.prefix}-scheduler-clusters", replicas=topology.replicas)


def placements(kv: Any) -> KeyValueStore:
    return KeyValueStore(kv, PlacementRecord.model_validate_json)


def clusters(kv: Any) -> KeyValueStore:
    return KeyValueStore(kv, ClusterRecord.model_validate_json)
