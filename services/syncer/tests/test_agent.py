"""When the agent releases the scheduler's reservations: only after a capacity record
whose Pods were listed once the object's member copy was ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla.common.capacity import ClusterCapacity, FakeCapacityCache
from flotilla.common.events import ObjectRef
from flotilla.common.membus import MemoryBus
from flotilla.syncer.agent import ClusterAgent

from .builders import deployment

WEB = ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="shop")
OTHER = ObjectRef(api_version="apps/v1", kind="Deployment", name="other", namespace="shop")


@dataclass
class StubSyncer:
    """What an agent reads of its syncer for reports and releases."""

    cache: FakeCapacityCache
    bus: Any
    now: float = 100.0
    heartbeat_interval: float = 1.0
    missed_heartbeats: int = 3
    hub: Any = None
    members: Any = None
    applying: set[str] = field(default_factory=set)

    def clock(self) -> float:
        return self.now


async def _cluster(cache: FakeCapacityCache) -> None:
    figures = {"cpu": 8000, "pods": 110}
    await cache.put(
        ClusterCapacity(cluster="east", allocatable=figures, available=figures, observed_at=0)
    )
    for name in (WEB.key, f"{WEB.key}#worker", OTHER.key):
        assert await cache.reserve("east", name, {"cpu": 100}, 1, ttl=300)


async def test_reservations_go_only_with_a_record_listed_after_ready() -> None:
    cache = FakeCapacityCache()
    await _cluster(cache)
    syncer = StubSyncer(cache=cache, bus=MemoryBus())
    agent = ClusterAgent("east", syncer)  # type: ignore[arg-type]
    live = deployment(replicas=1)
    live["status"] = {"availableReplicas": 1}

    listed_before = syncer.now
    syncer.now += 1
    await agent.report(f"{WEB.key}@east", WEB, live)  # ready now
    # A record whose Pods were listed before the copy was ready may not count them.
    assert not await agent.release_counted(listed_before)
    assert len(await cache.reservations("east")) == 3

    syncer.now += 1
    assert await agent.release_counted(syncer.now)
    # Both of web's reservations (its own and its component's) went; other's stays.
    assert [r.id for r in await cache.reservations("east")] == [OTHER.key]
    # Released once: a later record releases nothing more.
    assert not await agent.release_counted(syncer.now + 1)


async def test_an_unready_copy_keeps_its_reservation() -> None:
    cache = FakeCapacityCache()
    await _cluster(cache)
    syncer = StubSyncer(cache=cache, bus=MemoryBus())
    agent = ClusterAgent("east", syncer)  # type: ignore[arg-type]
    live = deployment(replicas=3)
    live["status"] = {"availableReplicas": 1}
    await agent.report(f"{WEB.key}@east", WEB, live)
    syncer.now += 5
    assert not await agent.release_counted(syncer.now)
    assert len(await cache.reservations("east")) == 3
