"""The coordinator's records over in-memory stores (no hub, no NATS): compare-and-set
from the newest record it knows, and which cluster changes plan objects again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from flotilla.common.api import PlacementState
from flotilla.common.events import ClusterPlacement, ObjectRef
from flotilla.common.membus import MemoryBus
from flotilla.common.store import MemoryBucket, Raw, Store
from flotilla.drain import service
from flotilla.drain.draining import ClusterRecord, Member, ObjectRecord

NOW = datetime(2026, 1, 1, tzinfo=UTC)
REF = ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="shop")


class CountingBucket(MemoryBucket):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, key: str) -> Raw | None:
        self.reads += 1
        return await super().get(key)

    async def create(self, key: str, data: bytes) -> int:
        self.reads -= 1  # MemoryBucket.create reads once itself
        return await super().create(key, data)


class Quiet(service.Coordinator):
    """Writes no cluster conditions (there is no hub)."""

    async def _write_conditions(self, cluster: ClusterRecord, now: datetime) -> None:
        pass


class Running:
    def __init__(self) -> None:
        self.bucket = CountingBucket()
        self.objects: Store[ObjectRecord] = Store(self.bucket, ObjectRecord)
        self.clusters: Store[ClusterRecord] = Store(MemoryBucket(), ClusterRecord)
        self.app = Quiet(MemoryBus(), cast(Any, None), self.objects, self.clusters)

    def reported(self, cluster: str, available: int) -> Any:
        def change(record: ObjectRecord) -> ObjectRecord:
            members = {**record.members, cluster: Member(ready=True, available=available)}
            return record.model_copy(update={"members": members})

        return change

    async def stored(self) -> ObjectRecord:
        entry = await self.objects.get(REF.key)
        assert entry is not None
        return entry.value


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    r = Running()
    await r.clusters.create("a", ClusterRecord(name="a", revision=1, since=NOW))
    placed = ClusterPlacement(cluster="a", replicas=3, state=PlacementState.ACTIVE)
    await r.objects.create(REF.key, ObjectRecord(key=REF.key, ref=REF, clusters=[placed]))
    followers = [
        asyncio.create_task(r.app.objects_view.run()),
        asyncio.create_task(r.app.clusters_view.run()),
    ]
    try:
        await r.app.objects_view.caught_up(timeout=5)
        await r.app.clusters_view.caught_up(timeout=5)
        yield r
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)


async def test_a_report_is_recorded_without_reading_the_record_first(running: Running) -> None:
    r = running
    reads = r.bucket.reads
    await r.app._update(REF.key, REF, r.reported("a", 1))
    await r.app._update(REF.key, REF, r.reported("a", 2))  # before the follower has the first
    await r.app._update(REF.key, REF, r.reported("a", 3))
    assert r.bucket.reads == reads
    assert (await r.stored()).members["a"].available == 3


async def test_a_record_another_writer_changed_is_read_again_not_overwritten(
    running: Running,
) -> None:
    r = running
    await r.app.objects_view.sync(timeout=5)
    entry = await r.objects.get(REF.key)
    assert entry is not None
    # Another replica records b's report; this replica's follower has not seen it.
    other = entry.value.model_copy(update={"members": {"b": Member(ready=True, available=2)}})
    await r.objects.update(REF.key, other, entry.revision)
    await r.app._update(REF.key, REF, r.reported("a", 1))
    assert set((await r.stored()).members) == {"a", "b"}


async def test_a_change_that_writes_nothing_is_only_trusted_on_a_fresh_read(
    running: Running,
) -> None:
    """By this replica's view a's report is already recorded; by the bucket another
    one is (another replica wrote it): the report must still be written."""
    r = running
    await r.app._update(REF.key, REF, r.reported("a", 3))
    await r.app.objects_view.sync(timeout=5)
    entry = await r.objects.get(REF.key)
    assert entry is not None
    other = entry.value.model_copy(update={"members": {"a": Member(ready=False, available=0)}})
    await r.objects.update(REF.key, other, entry.revision)
    await r.app._update(REF.key, REF, r.reported("a", 3))
    assert (await r.stored()).members["a"] == Member(ready=True, available=3)


async def test_only_a_change_plans_read_plans_the_cluster_s_objects_again(
    running: Running,
) -> None:
    """The coordinator's own conditions and placement count coming back from the hub
    change the cluster record, but no plan reads them: only the conditions are
    looked at again. A cordon or a drain plans every object there."""
    r = running
    app = r.app
    await app.tick(NOW)
    assert (app._dirty, app._dirty_clusters) == (set(), set())

    async def change(**update: Any) -> None:
        entry = await r.clusters.get("a")
        assert entry is not None
        await r.clusters.update("a", entry.value.model_copy(update=update), entry.revision)
        await app.clusters_view.sync(timeout=5)

    await change(placements=1, revision=2)
    assert (app._dirty, app._dirty_clusters) == (set(), {"a"})
    await app.tick(NOW)
    await change(unschedulable=True, evict_after=NOW, revision=3)
    assert (app._dirty, app._dirty_clusters) == ({REF.key}, {"a"})
