"""The coordinator's loop over in-memory stores (no hub, no NATS): what one `tick`
writes when the views change while it is working."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

from flotilla.common.api import PlacementState
from flotilla.common.events import ClusterPlacement, ObjectRef
from flotilla.common.membus import MemoryBus
from flotilla.common.store import Entry, MemoryBucket, Store
from flotilla.drain import draining, service
from flotilla.drain.draining import ClusterRecord, ObjectRecord

NOW = datetime(2026, 1, 1, tzinfo=UTC)
REF = ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="shop")


class Recording(service.Coordinator):
    """Records the cluster records its conditions would be written from; the first
    plan's write lets the admin's cordon of "a" arrive while it is awaited."""

    def __init__(self, objects: Store[ObjectRecord], clusters: Store[ClusterRecord]) -> None:
        super().__init__(MemoryBus(), cast(Any, None), objects, clusters)
        self.written: list[ClusterRecord] = []
        self.cordon_during_plan = True

    async def _act(self, key: str, entry: Entry[ObjectRecord], result: draining.Plan) -> None:
        if self.cordon_during_plan:
            self.cordon_during_plan = False
            stored = await self.clusters.get("a")
            assert stored is not None
            cordoned = stored.value.model_copy(update={"unschedulable": True, "revision": 2})
            await self.clusters.update("a", cordoned, stored.revision)
            await self.clusters_view.sync(timeout=5)
        await super()._act(key, entry, result)

    async def _write_conditions(self, cluster: ClusterRecord, now: datetime) -> None:
        self.written.append(cluster)


async def test_a_cluster_change_arriving_while_planning_is_written_from_the_news() -> None:
    objects: Store[ObjectRecord] = Store(MemoryBucket(), ObjectRecord)
    clusters: Store[ClusterRecord] = Store(MemoryBucket(), ClusterRecord)
    # Drained at NOW: planning moves the object, so the tick awaits its write.
    await clusters.create("a", ClusterRecord(name="a", revision=1, since=NOW, evict_after=NOW))
    placed = ClusterPlacement(cluster="a", replicas=3, state=PlacementState.ACTIVE)
    await objects.create(REF.key, ObjectRecord(key=REF.key, ref=REF, clusters=[placed]))
    coordinator = Recording(objects, clusters)
    followers = [
        asyncio.create_task(coordinator.objects_view.run()),
        asyncio.create_task(coordinator.clusters_view.run()),
    ]
    try:
        await coordinator.objects_view.caught_up(timeout=5)
        await coordinator.clusters_view.caught_up(timeout=5)
        coordinator._dirty.add(REF.key)
        coordinator._dirty_clusters.add("a")

        await coordinator.tick(NOW)
        # The one write of this tick is from the cordoned record, not from the
        # snapshot taken before planning; otherwise the cordon's mark is consumed
        # by a write of the old state and Cordoned never turns True.
        assert [c.unschedulable for c in coordinator.written] == [True]
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
