"""The watcher's durable memory in JetStream KV: watch positions and published records.

The watcher holds no state that a restart loses (ARCHITECTURE.md section 2):

* **positions** — the last resourceVersion handled per watched type, in the
  topology's positions bucket under ``pos.<group>.<version>.<Kind>``; a restarted
  watcher resumes its watches there instead of re-listing.
* **records** — per published object, the `observations.Record` of what was last
  published, in the bucket ``<prefix>-watcher-records`` under ``obj.<hash of the
  key>``. They let a re-list after downtime (410 Expired) publish deletions of
  objects that vanished meanwhile, and keep fingerprints across restarts so a
  restart republishes nothing that did not change.

Writes are last-writer-wins puts: one watcher replica is active at a time (a
second replica would publish the same events with the same ids, which JetStream
deduplicates, but it is not the intended setup).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import nats.errors
import nats.js.errors

from flotilla.common.api import GroupVersionKind
from flotilla.common.bus import Bus
from flotilla.common.errors import Unavailable
from flotilla.common.topology import BucketSpec
from flotilla.watcher.observations import Record

log = logging.getLogger(__name__)

INITIAL_LOAD_TIMEOUT = 10.0


def records_bucket(prefix: str) -> BucketSpec:
    return BucketSpec(name=f"{prefix}-watcher-records")


def position_key(gvk: GroupVersionKind) -> str:
    group = (gvk.group or "core").replace(".", "_")
    return f"pos.{group}.{gvk.version}.{gvk.kind}"


def record_key(key: str) -> str:
    return "obj." + hashlib.sha256(key.encode()).hexdigest()[:40]


class WatchState:
    """Positions and records over two KV buckets (create with `open`)."""

    def __init__(self, positions: Any, records: Any) -> None:
        self._positions = positions
        self._records = records
        self._saved: dict[GroupVersionKind, str] = {}

    @classmethod
    async def open(cls, bus: Bus) -> WatchState:
        topology = bus.topology
        try:
            positions = await bus.bucket(topology.positions_bucket)
            records = await bus.bucket(records_bucket(topology.prefix))
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"watcher state buckets unavailable: {exc}") from exc
        return cls(positions, records)

    async def get(self, gvk: GroupVersionKind) -> str | None:
        try:
            entry = await self._positions.get(position_key(gvk))
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"reading the watch position of {gvk}: {exc}") from exc
        value = entry.value.decode() if entry.value else ""
        if value:
            self._saved[gvk] = value
        return value or None

    async def put(self, gvk: GroupVersionKind, resource_version: str) -> None:
        if self._saved.get(gvk) == resource_version:
            return
        try:
            await self._positions.put(position_key(gvk), resource_version.encode())
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"saving the watch position of {gvk}: {exc}") from exc
        self._saved[gvk] = resource_version

    async def forget_position(self, gvk: GroupVersionKind) -> None:
        self._saved.pop(gvk, None)
        try:
            await self._positions.delete(position_key(gvk))
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"dropping the watch position of {gvk}: {exc}") from exc

    async def load_records(self) -> dict[str, Record]:
        """Every record, by object key."""
        try:
            watcher = await self._records.watch("obj.>", ignore_deletes=True)
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"reading watcher records: {exc}") from exc
        found: dict[str, Record] = {}
        try:
            while True:
                try:
                    entry = await watcher.updates(timeout=INITIAL_LOAD_TIMEOUT)
                except nats.errors.TimeoutError as exc:
                    raise Unavailable("reading watcher records timed out") from exc
                if entry is None:
                    return found
                if not entry.value:
                    continue
                try:
                    record = Record.model_validate_json(entry.value)
                except ValueError:
                    log.warning("dropping unreadable watcher record %s", entry.key)
                    continue
                found[record.key] = record
        finally:
            await watcher.stop()

    async def save(self, record: Record) -> None:
        try:
            await self._records.put(record_key(record.key), record.model_dump_json().encode())
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"saving the record of {record.key}: {exc}") from exc

    async def forget(self, key: str) -> None:
        try:
            await self._records.delete(record_key(key))
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"dropping the record of {key}: {exc}") from exc
