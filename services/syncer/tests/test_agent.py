"""When the agent releases the scheduler's reservations: only after a capacity record
whose Pods were listed once the object's member copy was ready. How its status
reports go out: the last of quick changes only, a handler's at once."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from flotilla.common.api import DECISION_ANNOTATION as DECISION
from flotilla.common.capacity import ClusterCapacity, FakeCapacityCache
from flotilla.common.errors import Unavailable
from flotilla.common.events import Envelope, MemberStatusObserved, ObjectRef
from flotilla.common.membus import MemoryBus
from flotilla.syncer import observation
from flotilla.syncer.agent import ClusterAgent
from flotilla.syncer.service import WorkRecord

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
    report_delay: float = 0.05
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
    await agent.flush()
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
    await agent.flush()
    syncer.now += 5
    assert not await agent.release_counted(syncer.now)
    assert len(await cache.reservations("east")) == 3


class RecordingBus:
    """Records each batch of reports; fails the first `failures` batches."""

    producer = "test"

    def __init__(self, failures: int = 0) -> None:
        self.batches: list[list[MemberStatusObserved]] = []
        self.failures = failures

    async def publish_batch(self, batch: Sequence[Envelope]) -> list[None]:
        if self.failures:
            self.failures -= 1
            raise Unavailable("the bus is down")
        self.batches.append(
            [e.payload for e in batch if isinstance(e.payload, MemberStatusObserved)]
        )
        return [None] * len(batch)


def _status(available: int) -> dict[str, Any]:
    live = deployment(replicas=2)
    live["status"] = {"replicas": 2, "availableReplicas": available}
    return live


async def test_quick_changes_of_an_object_are_reported_once_as_the_last() -> None:
    bus = RecordingBus()
    agent = ClusterAgent("east", StubSyncer(cache=FakeCapacityCache(), bus=bus))  # type: ignore[arg-type]
    for available in (0, 1, 2):
        await agent.report(f"{WEB.key}@east", WEB, _status(available))
    await agent.report(f"{OTHER.key}@east", OTHER, _status(1))
    assert bus.batches == []  # nothing yet: a newer status may come
    await asyncio.sleep(0.2)
    (batch,) = bus.batches
    assert [(r.ref, r.status["availableReplicas"], r.ready) for r in batch] == [
        (WEB, 2, True),
        (OTHER, 1, False),
    ]
    await agent.report(f"{WEB.key}@east", WEB, _status(2))  # the same again: no report
    await asyncio.sleep(0.2)
    assert len(bus.batches) == 1
    await agent.stop()


async def test_a_handlers_report_goes_out_at_once_instead_of_the_waiting_one() -> None:
    bus = RecordingBus()
    agent = ClusterAgent("east", StubSyncer(cache=FakeCapacityCache(), bus=bus))  # type: ignore[arg-type]
    await agent.report(f"{WEB.key}@east", WEB, _status(2))
    await agent.report_now(f"{WEB.key}@east", WEB, None)
    assert [[(r.ref, r.exists) for r in b] for b in bus.batches] == [[(WEB, False)]]
    await asyncio.sleep(0.2)
    assert len(bus.batches) == 1  # the superseded status never follows the removal
    await agent.stop()


async def test_reports_the_bus_refused_are_published_again() -> None:
    bus = RecordingBus(failures=1)
    agent = ClusterAgent("east", StubSyncer(cache=FakeCapacityCache(), bus=bus))  # type: ignore[arg-type]
    await agent.report(f"{WEB.key}@east", WEB, _status(1))
    await asyncio.sleep(0.2)
    assert bus.batches == [] and bus.failures == 0
    await agent.report(f"{OTHER.key}@east", OTHER, _status(2))
    for _ in range(40):
        if bus.batches:
            break
        await asyncio.sleep(0.05)
    assert [[r.ref for r in b] for b in bus.batches] == [[WEB, OTHER]]
    await agent.stop()


async def test_status_changes_at_a_checked_generation_are_checked_by_metadata_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[bool] = []
    real = observation.drifted

    def drifted(manifest: Any, live: Any, *, content: bool = True) -> bool:
        checks.append(content)
        return real(manifest, live, content=content)

    monkeypatch.setattr(observation, "drifted", drifted)
    record = WorkRecord(ref=WEB, cluster="east", manifest=deployment(replicas=2))
    repaired: list[str] = []

    class Works:
        def work_for(self, cluster: str, obj: Any) -> tuple[str, WorkRecord]:
            return f"{WEB.key}@east", record

    syncer = StubSyncer(cache=FakeCapacityCache(), bus=RecordingBus())
    syncer.work_for = Works().work_for  # type: ignore[attr-defined]
    agent = ClusterAgent("east", syncer)  # type: ignore[arg-type]

    async def repair(key: str, record: WorkRecord, why: str) -> None:
        repaired.append(why)

    agent.repair = repair  # type: ignore[method-assign]
    live = copy.deepcopy(record.manifest)
    live["metadata"].update(generation=1, resourceVersion="1")
    for available in (0, 1, 2):
        live["status"] = {"availableReplicas": available}
        await agent.seen(copy.deepcopy(live))
    assert checks == [True, False, False] and repaired == []
    # Someone edits an annotation Flotilla applied (no new generation): seen at once.
    live["metadata"]["annotations"] = {**live["metadata"]["annotations"], DECISION: "edited"}
    live["metadata"]["resourceVersion"] = "2"
    await agent.seen(copy.deepcopy(live))
    assert repaired == ["edited"]
    live["metadata"].update(
        generation=2, resourceVersion="3", labels=record.manifest["metadata"]["labels"]
    )
    live["spec"]["replicas"] = 7  # a new generation is compared whole again
    await agent.seen(copy.deepcopy(live))
    assert checks[-1] is True and repaired == ["edited", "edited"]
    agent.forget(f"{WEB.key}@east")
    await agent.seen(copy.deepcopy(live))
    assert checks[-1] is True
    await agent.stop()
