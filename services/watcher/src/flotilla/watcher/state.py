"""The watcher's durable memory: watch positions and published records, each in one of
the watcher's buckets (declared in `flotilla.common.topology`) through
`flotilla.common.store`.

The watcher holds no state that a restart loses:

* **positions** — the last resourceVersion handled per watched type, under
  ``pos.<group>.<version>.<Kind>``; a restarted watcher resumes its watches there
  instead of re-listing.
* **records** — per published object, the `observations.Record` of what was last
  published, under ``obj.<hash of the key>`` (bounded length whatever the key).
  They let a re-list after downtime (410 Expired) publish deletions of objects
  that vanished meanwhile, and keep fingerprints across restarts so a restart
  republishes nothing that did not change.

Writes are last-writer-wins puts: one watcher replica is active at a time (a
second replica would publish the same events with the same ids, which JetStream
deduplicates, but it is not the intended setup). A forgotten record or position
leaves a tombstone, purged after the retention period (`WatchState.forget_deleted`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from pydantic import BaseModel, ConfigDict

from flotilla.common.api import GroupVersionKind
from flotilla.common.bus import Bus
from flotilla.common.store import Store, Unreadable
from flotilla.watcher.observations import Record

log = logging.getLogger(__name__)


class Position(BaseModel):
    """Where the watch of one type resumes."""

    model_config = ConfigDict(frozen=True)

    resource_version: str


def position_key(gvk: GroupVersionKind) -> str:
    group = (gvk.group or "core").replace(".", "_")
    return f"pos.{group}.{gvk.version}.{gvk.kind}"


def record_key(key: str) -> str:
    return "obj." + hashlib.sha256(key.encode()).hexdigest()[:40]


class WatchState:
    """Positions by watched type and records by object key (create with `open`)."""

    def __init__(self, positions: Store[Position], records: Store[Record]) -> None:
        self.positions = positions
        self.records = records
        self._saved: dict[GroupVersionKind, str] = {}

    @classmethod
    async def open(cls, bus: Bus) -> WatchState:
        topology = bus.topology
        return cls(
            await bus.store(topology.bucket("positions"), Position),
            await bus.store(topology.bucket("watcher-records"), Record),
        )

    async def get(self, gvk: GroupVersionKind) -> str | None:
        try:
            entry = await self.positions.get(position_key(gvk))
        except Unreadable as error:
            log.warning("re-listing %s: %s", gvk, error)
            return None
        if entry is None or not entry.value.resource_version:
            return None
        self._saved[gvk] = entry.value.resource_version
        return entry.value.resource_version

    async def put(self, gvk: GroupVersionKind, resource_version: str) -> None:
        if self._saved.get(gvk) == resource_version:
            return
        await self.positions.put(position_key(gvk), Position(resource_version=resource_version))
        self._saved[gvk] = resource_version

    async def forget_position(self, gvk: GroupVersionKind) -> None:
        self._saved.pop(gvk, None)
        await self.positions.delete(position_key(gvk))

    async def load_records(self) -> dict[str, Record]:
        """Every record, by object key (unreadable ones are logged and dropped)."""
        return {entry.value.key: entry.value for entry in (await self.records.load()).values()}

    async def save(self, record: Record) -> None:
        await self.records.put(record_key(record.key), record)

    async def forget(self, key: str) -> None:
        await self.records.delete(record_key(key))

    async def forget_deleted(self, retention: float) -> None:
        """Purge tombstones older than `retention` from both buckets, now and then
        (run under `Runtime.spawn`)."""
        while True:
            await asyncio.sleep(max(retention / 4, 0.05))
            await self.positions.purge_tombstones(retention)
            await self.records.purge_tombstones(retention)
