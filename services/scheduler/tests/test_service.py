"""The scheduler service's handlers against a real NATS (KV + stream) and the fake
capacity cache: records, reservations, what gets published, what a change re-evaluates.

Handlers are called directly with envelopes, and the commands they send
(``RescheduleRequested``) are read back from the stream and handed to the handler
by the test, so every step is explicit and nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flotilla.common import events
from flotilla.common.api import STRATEGY_ANNOTATION, Strategy
from flotilla.common.bus import Bus
from flotilla.common.capacity import CapacityCache, FakeCapacityCache
from flotilla.common.dispatch import Received
from flotilla.common.errors import InvalidObject, Unavailable
from flotilla.common.events import (
    CapacityChanged,
    ClusterObserved,
    ClusterPlacement,
    Envelope,
    PlacementDecided,
    RescheduleRequested,
    ResourceAnalyzed,
)
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.store import Conflict
from flotilla.common.testing import eventually
from flotilla.common.topology import Topology
from flotilla.scheduler import core
from flotilla.scheduler.model import Decision, SchedulingInput
from flotilla.scheduler.records import ClusterRecord, PlacementRecord
from flotilla.scheduler.service import Cause, Scheduler

from .builders import (
    ClusterBuilder,
    make_cluster,
    make_daemonset,
    make_deployment,
    make_pod,
    make_policy,
)

pytestmark = pytest.mark.integration


class FakeReporter:
    """Collects the Warning Events the scheduler would record on hub objects."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str]] = []

    async def warning(self, obj: dict[str, Any], reason: str, message: str) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self.warnings.append((name, reason, message))


class Harness:
    """One scheduler replica's handlers, fed by hand."""

    def __init__(self, bus: Bus, scheduler: Scheduler, cache: FakeCapacityCache) -> None:
        self.bus = bus
        self.scheduler = scheduler
        self.cache = cache
        self.revision = 0
        self.handled: set[str] = set()
        self.reporter = FakeReporter()
        self.dispatch = scheduler.router().dispatch()

    def _next(self) -> int:
        self.revision += 1
        return self.revision

    async def cluster(self, builder: ClusterBuilder, *, capacity: bool = True) -> None:
        record = builder.record()
        if capacity and record is not None:
            await self.cache.put(record)
        await self.handle(self.cluster_event(builder))

    def cluster_event(self, builder: ClusterBuilder) -> Envelope:
        payload = ClusterObserved(
            cluster=builder.name, object=builder.build().model_dump(mode="json", by_alias=True)
        )
        return events.envelope(payload, key=builder.name, producer="test", revision=self._next())

    async def remove_cluster(self, name: str) -> None:
        payload = ClusterObserved(cluster=name, object={}, deleted=True)
        await self.handle(
            events.envelope(payload, key=name, producer="test", revision=self._next())
        )

    def analyzed_event(self, analyzed: ResourceAnalyzed, revision: int | None = None) -> Envelope:
        return events.envelope(
            analyzed,
            key=analyzed.ref.key,
            producer="test",
            uid=str(analyzed.object["metadata"]["uid"]),
            revision=self._next() if revision is None else revision,
        )

    async def analyzed(self, analyzed: ResourceAnalyzed) -> Envelope:
        envelope = self.analyzed_event(analyzed)
        await self.handle(envelope)
        return envelope

    async def handle(self, envelope: Envelope) -> None:
        await self.dispatch(Received.of(envelope))

    async def published(self, event_type: str) -> list[Envelope]:
        return [e.envelope async for e in self.bus.replay(event_types=[event_type])]

    async def decided(self, key: str | None = None) -> list[PlacementDecided]:
        found = []
        for envelope in await self.published("PlacementDecided"):
            assert isinstance(envelope.payload, PlacementDecided)
            if key is None or envelope.key == key:
                found.append(envelope.payload)
        return found

    async def run_requests(self) -> list[str]:
        """Hand every not yet handled ``RescheduleRequested`` to the scheduler; their keys."""
        keys = []
        for envelope in await self.published("RescheduleRequested"):
            if envelope.id in self.handled:
                continue
            self.handled.add(envelope.id)
            keys.append(envelope.key)
            await self.handle(envelope)
        return sorted(keys)

    async def record(self, key: str) -> PlacementRecord:
        stored = await self.scheduler.placements.get(key)
        assert stored is not None
        record = stored[0]
        assert isinstance(record, PlacementRecord)
        return record

    def active(self, record: PlacementRecord) -> dict[str, int | None]:
        return {p.cluster: p.replicas for p in record.clusters if p.state == "Active"}

    def active_of(self, choice: Any) -> dict[str, int | None]:
        return {p.cluster: p.replicas for p in choice.decision.clusters if p.state == "Active"}


async def open_scheduler(
    url: str,
    prefix: str,
    cache: CapacityCache,
    reporter: FakeReporter | None = None,
    *,
    snapshot_max_age: float = 0.0,
    instance: str = "",
) -> tuple[Bus, Scheduler, list[asyncio.Task[None]]]:
    bus = await Bus.connect(
        url,
        topology=Topology(prefix=prefix, partitions=2),
        producer=f"scheduler/{prefix}{instance}",
    )
    scheduler = await Scheduler.open(
        bus,
        cache,
        reservation_ttl=600.0,
        sync_timeout=5.0,
        snapshot_max_age=snapshot_max_age,
        reporter=reporter,
    )
    tasks = [
        asyncio.create_task(scheduler.follow_placements()),
        asyncio.create_task(scheduler.follow_clusters()),
    ]
    await scheduler.ready(5.0)
    return bus, scheduler, tasks


async def close(bus: Bus, tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await bus.close()


@contextlib.asynccontextmanager
async def two_replicas(
    nats_server: NatsServer, unique: str
) -> AsyncIterator[tuple[Harness, Harness]]:
    """Two scheduler replicas on one bus prefix and one capacity cache."""
    cache = FakeCapacityCache()
    prefix = f"s{unique}"
    one = await open_scheduler(nats_server.url, prefix, cache)
    two = await open_scheduler(nats_server.url, prefix, cache)
    try:
        yield Harness(one[0], one[1], cache), Harness(two[0], two[1], cache)
    finally:
        await close(one[0], one[2])
        await close(two[0], two[2])


@pytest.fixture
async def harness(nats_server: NatsServer, unique: str) -> AsyncIterator[Harness]:
    cache = FakeCapacityCache()
    reporter = FakeReporter()
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache, reporter)
    try:
        harness = Harness(bus, scheduler, cache)
        harness.reporter = reporter
        yield harness
    finally:
        await close(bus, tasks)


def reschedule(
    analyzed: ResourceAnalyzed, reason: str, *, avoid: list[str] | None = None
) -> Envelope:
    """A ``RescheduleRequested`` as the drain coordinator sends it."""
    command = RescheduleRequested(ref=analyzed.ref, reason=reason, avoid_clusters=avoid or [])
    return events.envelope(command, key=analyzed.ref.key, producer="test", dedupe=(reason,))


def small(name: str, cpu: str = "1", labels: dict[str, str] | None = None) -> ClusterBuilder:
    """A Ready cluster with one node of `cpu` CPUs."""
    return make_cluster(name).with_labels(**(labels or {})).with_room(1, cpu=cpu, memory="64Gi")


async def test_places_records_reserves_and_publishes_once(harness: Harness) -> None:
    await harness.cluster(small("a", "2"))
    await harness.cluster(small("b", "2"))
    web = make_deployment("web", replicas=4).with_requests(cpu="500m").build()
    envelope = await harness.analyzed(web)

    record = await harness.record(web.ref.key)
    assert harness.active(record) == {"a": 2, "b": 2}
    assert [r.replicas for r in await harness.cache.reservations("a")] == [2]
    assert [r.id for r in await harness.cache.reservations("b")] == [web.ref.key]
    decided = await harness.decided(web.ref.key)
    assert [d.decision_id for d in decided] == [record.decided.decision_id]
    assert decided[0] == record.decided

    # Redelivered: the recorded decision again, same id (JetStream drops the copy).
    await harness.handle(envelope)
    # The same object re-announced with the same placement: nothing new.
    await harness.analyzed(web)
    assert [d.decision_id for d in await harness.decided(web.ref.key)] == [
        record.decided.decision_id
    ]


async def test_stale_event_is_dropped(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.handle(harness.analyzed_event(web, revision=10))
    older = web.model_copy(update={"replicas": 7})
    await harness.handle(harness.analyzed_event(older, revision=9))
    record = await harness.record(web.ref.key)
    assert harness.active(record) == {"a": 2}
    assert record.revision == 10


async def test_scale_up_reserves_the_new_count_and_publishes_previous(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).with_requests(cpu="500m").build()
    await harness.analyzed(web)
    await harness.analyzed(web.model_copy(update={"replicas": 5}))
    decided = await harness.decided(web.ref.key)
    assert [[(p.cluster, p.replicas) for p in d.clusters] for d in decided] == [
        [("a", 2)],
        [("a", 5)],
    ]
    assert [(p.cluster, p.replicas) for p in decided[1].previous] == [("a", 2)]
    assert [r.replicas for r in await harness.cache.reservations("a")] == [5]


async def test_unschedulable_is_pending_and_retried_when_a_record_could_help(
    harness: Harness,
) -> None:
    await harness.cluster(small("a", "1"))
    big = make_deployment("big", replicas=1).with_requests(cpu="2").build()
    await harness.analyzed(big)
    record = await harness.record(big.ref.key)
    assert not record.schedulable and record.clusters == ()
    assert record.decided.reason.startswith("no cluster can take it")
    assert harness.scheduler.index.waiting() == {big.ref.key}
    assert harness.reporter.warnings == [], "never written on the decision path"
    assert await harness.scheduler.notices.flush() == 1
    assert harness.reporter.warnings == [("big", "Unschedulable", record.decided.reason)]

    await harness.cache.put(small("a", "4").record())  # type: ignore[arg-type]
    grown = CapacityChanged(cluster="a", available={"cpu": 4000}, allocatable={"cpu": 4000})
    await harness.handle(events.envelope(grown, key="a", producer="test", revision=1))
    # The same record reported again: nothing is re-tried (no loop on repeated reports).
    await harness.handle(events.envelope(grown, key="a", producer="test", revision=2))
    assert await harness.run_requests() == [big.ref.key]
    record = await harness.record(big.ref.key)
    assert harness.active(record) == {"a": 1}
    assert harness.scheduler.index.waiting() == set()
    assert len(await harness.decided(big.ref.key)) == 2
    await harness.scheduler.notices.flush()
    assert len(harness.reporter.warnings) == 1, "a placed object is not warned about"


async def test_cordon_and_evict_after_reevaluate_nothing_and_avoid_clusters_moves(
    harness: Harness,
) -> None:
    """The drain coordinator decides when a cluster drains: the scheduler ignores
    ``evictAfter`` and moves what runs there when asked with ``avoid_clusters``."""
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    await harness.cluster(small("b", "4"))
    await harness.run_requests()  # a new cluster re-tries Pending and copy objects: none here
    assert harness.active(await harness.record(web.ref.key)) == {"a": 2}

    await harness.cluster(small("a", "4").cordoned())
    assert await harness.run_requests() == []

    await harness.cluster(small("a", "4").cordoned().draining())
    assert await harness.run_requests() == []
    assert harness.active(await harness.record(web.ref.key)) == {"a": 2}
    await harness.handle(reschedule(web, "drain cluster a", avoid=["a"]))
    record = await harness.record(web.ref.key)
    assert harness.active(record) == {"b": 2}
    assert {p.cluster: p.state for p in record.clusters}["a"] == "Retiring"


async def test_release_retiring_drops_the_retiring_copy_and_nothing_else(
    harness: Harness,
) -> None:
    """``release_retiring`` removes the Retiring entry by compare-and-set, publishes
    the placement without it, and a redelivered command publishes the same again."""
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    await harness.cluster(small("b", "4"))
    old = "a"
    await harness.handle(reschedule(web, "drain", avoid=[old]))
    moved = await harness.record(web.ref.key)
    command = RescheduleRequested(ref=web.ref, reason="ready", release_retiring=[old])
    release = events.envelope(command, key=web.ref.key, producer="test", dedupe=("release",))
    await harness.handle(release)
    released = await harness.record(web.ref.key)
    assert [(p.cluster, p.state) for p in released.clusters] == [
        (p.cluster, p.state) for p in moved.clusters if p.state == "Active"
    ]
    assert released.analyzed == moved.analyzed
    last = (await harness.decided(web.ref.key))[-1]
    assert last == released.decided and old not in {p.cluster for p in last.clusters}
    count = len(await harness.decided(web.ref.key))
    await harness.handle(release)  # redelivered: the same decision again, deduplicated
    assert len(await harness.decided(web.ref.key)) == count
    assert (await harness.record(web.ref.key)).decided == released.decided


async def test_label_change_reevaluates_objects_whose_selector_mentions_it(
    harness: Harness,
) -> None:
    await harness.cluster(small("a", "4", {"region": "eu", "tier": "gold"}))
    await harness.cluster(small("b", "4", {"region": "us", "tier": "gold"}))
    eu = make_deployment("eu", replicas=1).governed_by(make_policy().selecting(region="eu")).build()
    free = make_deployment("free", replicas=1).build()
    await harness.analyzed(eu)
    await harness.analyzed(free)
    assert harness.active(await harness.record(eu.ref.key)) == {"a": 1}

    await harness.cluster(small("a", "4", {"region": "eu", "tier": "silver"}))
    assert await harness.run_requests() == []
    await harness.cluster(small("a", "4", {"region": "us"}))
    await harness.cluster(small("b", "4", {"region": "eu"}))
    assert set(await harness.run_requests()) == {eu.ref.key}
    assert harness.active(await harness.record(eu.ref.key)) == {"b": 1}


async def test_new_cluster_gets_a_copy(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    agent = make_daemonset("agent").build()
    await harness.analyzed(agent)
    assert set(harness.active(await harness.record(agent.ref.key))) == {"a"}
    await harness.cluster(small("b", "4"))
    assert await harness.run_requests() == [agent.ref.key]
    assert set(harness.active(await harness.record(agent.ref.key))) == {"a", "b"}


async def test_refused_reservation_redecides_with_a_fresh_snapshot(harness: Harness) -> None:
    await harness.cluster(small("a", "8"))
    await harness.cluster(small("b", "2"))
    # Someone else (another replica) holds all of "a" by the time we reserve, though
    # the snapshot we decide from first still shows it free.
    real_snapshot = harness.cache.snapshot
    calls = 0

    async def stale_once(clusters: Any = None) -> Any:
        nonlocal calls
        calls += 1
        snap = await real_snapshot(clusters)
        if calls == 1:
            await harness.cache.reserve("a", "someone-else", {"cpu": 8000}, 1, 600)
        return snap

    harness.cache.snapshot = stale_once  # type: ignore[method-assign]
    pod = make_deployment("p", replicas=1).with_requests(cpu="1500m").build()
    await harness.analyzed(pod)
    assert calls == 2
    record = await harness.record(pod.ref.key)
    assert harness.active(record) == {"b": 1}
    assert [r.id for r in await harness.cache.reservations("a")] == ["someone-else"]


async def test_deleted_object_releases_its_reservations(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    assert await harness.cache.reservations("a")
    await harness.analyzed(web.model_copy(update={"deleted": True}))
    assert await harness.cache.reservations("a") == []
    decided = await harness.decided(web.ref.key)
    assert decided[-1].deleted and decided[-1].clusters == []
    # A reschedule for a deleted object does nothing.
    command = RescheduleRequested(ref=web.ref, reason="test")
    await harness.handle(events.envelope(command, key=web.ref.key, producer="test"))
    assert len(await harness.decided(web.ref.key)) == 2


async def test_removed_cluster_moves_its_objects(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    await harness.cluster(small("b", "4"))
    await harness.run_requests()
    await harness.remove_cluster("a")
    assert await harness.run_requests() == [web.ref.key]
    record = await harness.record(web.ref.key)
    assert [p.cluster for p in record.clusters] == ["b"]


async def test_an_invalid_cluster_is_refused_as_the_users_to_fix(harness: Harness) -> None:
    """(The kit turns the refusal into a dead letter and a Warning Event on the Cluster:
    `test_setup.py` checks that through the composed service.)"""
    body = small("bad", "4").build().model_dump(mode="json", by_alias=True)
    body["spec"]["taints"] = [{"key": "gpu", "effect": "Sometimes"}]
    invalid = ClusterObserved(cluster="bad", object=body)
    with pytest.raises(InvalidObject, match=r"spec\.taints\[0\]\.effect") as raised:
        await harness.handle(events.envelope(invalid, key="bad", producer="test", revision=1))
    assert raised.value.reason == "InvalidCluster"
    assert harness.scheduler.clusters.get("bad") is None


async def test_annotation_any_over_a_copy_policy_places_on_one_cluster(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    await harness.cluster(small("b", "4"))
    web = (
        make_deployment("web", replicas=2)
        .with_annotation(STRATEGY_ANNOTATION, "any")
        .governed_by(make_policy().strategy("copy"))
        .detected_as(Strategy.ANY)
        .build()
    )
    await harness.analyzed(web)
    record = await harness.record(web.ref.key)
    assert list(harness.active(record).values()) == [2], "one cluster runs every replica"
    assert harness.scheduler.index.copies() == set()

    # A new cluster is a reason to extend a copy, not to move an `any` object.
    await harness.cluster(small("c", "4"))
    assert await harness.run_requests() == []
    assert harness.active(await harness.record(web.ref.key)) == harness.active(record)


async def test_lost_compare_and_set_redecides_from_the_winner(
    nats_server: NatsServer, unique: str
) -> None:
    """Two replicas decide the same object from the same record; one write wins and
    the other decides again from it instead of overwriting it."""
    async with two_replicas(nats_server, unique) as (first, second):
        await first.cluster(small("a", "8"))
        web = make_deployment("web", replicas=2).build()
        await first.analyzed(web)
        stored = await first.scheduler.placements.get(web.ref.key)
        assert stored is not None
        # Replica two has not seen replica one's write yet (its index is behind).
        second.scheduler.index.entries.pop(web.ref.key, None)
        await second.handle(second.analyzed_event(web.model_copy(update={"replicas": 3}), 50))
        record = await second.record(web.ref.key)
        assert harness_active(record) == {"a": 3}
        decided = await first.decided(web.ref.key)
        assert [[(p.cluster, p.replicas) for p in d.previous] for d in decided] == [
            [],
            [("a", 2)],
        ]


def harness_active(record: PlacementRecord) -> dict[str, int | None]:
    return {p.cluster: p.replicas for p in record.clusters if p.state == "Active"}


async def test_cluster_records_are_written_by_compare_and_set(
    nats_server: NatsServer, unique: str
) -> None:
    bus = await Bus.connect(
        nats_server.url, topology=Topology(prefix=f"r{unique}", partitions=1), producer="t"
    )
    try:
        scheduler = await Scheduler.open(bus, FakeCapacityCache())
        clusters = scheduler.clusters_store
        record = ClusterRecord(name="x", cluster=None)
        first = await clusters.write("x", record, last=0)
        with pytest.raises(Conflict):
            await clusters.write("x", record, last=0)
        second = await clusters.write("x", record, last=first)
        with pytest.raises(Conflict):
            await clusters.write("x", record, last=first)
        assert await clusters.get("x") == (record, second)
        assert await clusters.get("missing") is None
    finally:
        await bus.close()


async def test_scale_up_in_place_that_cannot_fit_keeps_the_placement_pending(
    harness: Harness,
) -> None:
    """The core keeps an ``any`` object where it runs without re-checking room; the
    service's reservation refuses it, and the object waits as Pending instead of
    overcommitting or retrying in a loop."""
    await harness.cluster(small("a", "2"))
    pod = make_pod("p").with_requests(cpu="1").build()
    await harness.analyzed(pod)
    assert harness.active(await harness.record(pod.ref.key)) == {"a": 1}

    await harness.analyzed(pod.model_copy(update={"replicas": 4}))
    record = await harness.record(pod.ref.key)
    assert harness.active(record) == {"a": 1}
    assert record.pending == 3 and record.waiting
    assert "does not fit now" in record.held_back
    assert record.analyzed.replicas == 4
    assert [r.replicas for r in await harness.cache.reservations("a")] == [1]
    assert len(await harness.decided(pod.ref.key)) == 1

    await harness.cache.put(small("a", "8").record())  # type: ignore[arg-type]
    grown = CapacityChanged(cluster="a", available={"cpu": 8000}, allocatable={"cpu": 8000})
    await harness.handle(events.envelope(grown, key="a", producer="test", revision=1))
    assert await harness.run_requests() == [pod.ref.key]
    record = await harness.record(pod.ref.key)
    assert harness.active(record) == {"a": 4}
    assert not record.waiting and record.held_back == ""
    assert [r.replicas for r in await harness.cache.reservations("a")] == [4]


def count_snapshots(cache: FakeCapacityCache) -> list[list[str] | None]:
    """Record every snapshot read of `cache` from now on (None: a whole read)."""
    reads: list[list[str] | None] = []
    real_snapshot = cache.snapshot

    async def counting(clusters: Any = None) -> Any:
        reads.append(None if clusters is None else list(clusters))
        return await real_snapshot(clusters)

    cache.snapshot = counting  # type: ignore[method-assign]
    return reads


async def test_shared_snapshot_sees_the_replicas_own_claims(
    nats_server: NatsServer, unique: str
) -> None:
    """Within `snapshot_max_age` the snapshot is not read again, not even partly, yet
    the next decision sees the previous one's claim: the replica counts its own
    claims in locally, so the second decision knew the cluster was full."""
    cache = FakeCapacityCache()
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache)
    scheduler.snapshot_max_age = 3600.0
    reads = count_snapshots(cache)
    refusals: list[set[str]] = []
    real_claim = cache.claim

    async def claiming(*args: Any, **kwargs: Any) -> set[str]:
        refusals.append(await real_claim(*args, **kwargs))
        return refusals[-1]

    cache.claim = claiming  # type: ignore[method-assign]
    try:
        harness = Harness(bus, scheduler, cache)
        await harness.cluster(small("a", "3"))
        await harness.cluster(small("b", "3"))
        first = make_pod("first").with_requests(cpu="3").build()
        second = make_pod("second").with_requests(cpu="3").build()
        await harness.analyzed(first)
        await harness.analyzed(second)
        (where_first,) = harness.active(await harness.record(first.ref.key))
        (where_second,) = harness.active(await harness.record(second.ref.key))
        assert {where_first, where_second} == {"a", "b"}
        # One whole read (the fleet built once), then nothing: one claim script per
        # decision, and neither was refused.
        assert reads == [None]
        assert refusals == [set(), set()]
    finally:
        await close(bus, tasks)


async def test_a_refused_claim_rereads_only_the_clusters_it_touched(
    nats_server: NatsServer, unique: str
) -> None:
    """Another replica's claim is not in this replica's read model: the refused claim
    changes nothing, the clusters it touched are re-read, and the object goes where
    there is room."""
    cache = FakeCapacityCache()
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache)
    scheduler.snapshot_max_age = 3600.0
    try:
        harness = Harness(bus, scheduler, cache)
        await harness.cluster(small("a", "8"))
        await harness.cluster(small("b", "2"))
        warm = make_pod("warm").with_requests(cpu="100m").build()
        await harness.analyzed(warm)  # builds the fleet
        assert await cache.reserve("a", "other-replica", {"cpu": 7000}, 1, 600)
        reads = count_snapshots(cache)
        pod = make_pod("p").with_requests(cpu="1500m").build()
        await harness.analyzed(pod)
        assert harness.active(await harness.record(pod.ref.key)) == {"b": 1}
        assert reads == [["a"]]
        assert {r.id for r in await cache.reservations("a")} >= {"other-replica"}
        assert pod.ref.key not in {r.id for r in await cache.reservations("a")}
    finally:
        await close(bus, tasks)


async def test_redelivered_cluster_change_sends_its_requests_again(harness: Harness) -> None:
    """The cluster was written but the requests never went out (the replica died):
    the redelivered event must still send them, though the cluster is unchanged now."""
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    await harness.cluster(small("b", "4"))
    await harness.run_requests()
    drain = harness.cluster_event(small("a", "4").with_taint("gone", "", "NoExecute"))
    sending = harness.scheduler._request

    async def bus_down(*args: Any, **kwargs: Any) -> None:
        raise Unavailable("bus down")

    harness.scheduler._request = bus_down  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        await harness.handle(drain)
    harness.scheduler._request = sending  # type: ignore[method-assign]
    await harness.handle(drain)
    assert await harness.run_requests() == [web.ref.key]
    assert harness.active(await harness.record(web.ref.key)) == {"b": 2}


async def test_a_deleted_object_is_forgotten_after_the_retention(harness: Harness) -> None:
    scheduler = harness.scheduler
    await harness.cluster(small("a", "4"))
    web = make_deployment("web", replicas=1).build()
    await harness.analyzed(web)
    await harness.analyzed(web.model_copy(update={"deleted": True}))
    # Within the retention the deleted record stays: a late event is judged stale by it.
    assert await scheduler.forget_deleted_once(retention=3600) == 0
    assert (await harness.record(web.ref.key)).deleted
    assert await scheduler.forget_deleted_once(retention=0) == 1
    assert scheduler.index.get(web.ref.key) is None
    assert await scheduler.placements.get(web.ref.key) is None
    await scheduler.placements_view.sync(5)
    assert scheduler.placements_view.get(web.ref.key) is None
    # Created again later, it is placed like a new object.
    await harness.analyzed(web)
    assert harness.active(await harness.record(web.ref.key)) == {"a": 1}


async def test_a_removed_cluster_is_forgotten_after_the_retention(harness: Harness) -> None:
    await harness.cluster(small("a", "4"))
    await harness.handle(
        events.envelope(
            CapacityChanged(cluster="a", available={"cpu": 4}, allocatable={"cpu": 4}),
            key="a",
            producer="test",
        )
    )
    await harness.remove_cluster("a")
    assert "a" in harness.scheduler.clusters.entries
    assert await harness.scheduler.forget_deleted_once(retention=0) == 1
    assert "a" not in harness.scheduler.clusters.entries
    assert await harness.scheduler.clusters_store.get("a") is None
    assert "a" not in harness.scheduler._capacity_seen


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_ten_thousand_created_and_deleted_objects_leave_nothing_behind(
    nats_server: NatsServer, unique: str
) -> None:
    """Memory and buckets return to their baseline once deleted objects are forgotten.

    The records are written through the store (as `Scheduler.decide` writes them);
    the whole handler path for one object is covered above."""
    objects, chunk, retention = 10_000, 500, 0.5
    cache = FakeCapacityCache()
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"f{unique}", cache)
    try:
        harness = Harness(bus, scheduler, cache)
        await harness.cluster(small("a", "4"))
        await scheduler.placements_view.sync(5)
        baseline = (scheduler.index.footprint(), len(scheduler.placements_view))
        baseline_bucket = await scheduler.placements.size()
        records = [placement(make_deployment(f"web-{i}").build(), "a") for i in range(objects)]
        revisions: dict[str, int] = {}
        for start in range(0, objects, chunk):
            part = records[start : start + chunk]
            written = await asyncio.gather(*(scheduler.placements.create(r.key, r) for r in part))
            revisions.update((r.key, w) for r, w in zip(part, written, strict=True))
        await scheduler.placements_view.sync(30)
        assert len(scheduler.index) == objects and scheduler.index.placed_on("a")
        for start in range(0, objects, chunk):
            part = [deleted(r) for r in records[start : start + chunk]]
            await asyncio.gather(
                *(scheduler.placements.update(r.key, r, revisions[r.key]) for r in part)
            )
        await scheduler.placements_view.sync(30)
        assert len(scheduler.placements_view) == objects
        assert len(scheduler.index.deleted_before(time.monotonic())) == objects
        full_bucket = await scheduler.placements.size()
        assert full_bucket >= 2 * objects

        await asyncio.sleep(retention)  # the retention passes
        assert await scheduler.forget_deleted_once(retention) == objects
        await scheduler.placements_view.sync(30)
        assert (scheduler.index.footprint(), len(scheduler.placements_view)) == baseline
        await asyncio.sleep(retention)  # every follower has had the retention to see them
        await scheduler.forget_deleted_once(retention)
        # Only the newest tombstone stays (the bucket's last sequence must exist).
        assert await scheduler.placements.size() == baseline_bucket + 1
    finally:
        await close(bus, tasks)


async def test_an_unchanged_placement_in_another_order_publishes_nothing(
    harness: Harness,
) -> None:
    """Strategies list clusters in score order; scores follow capacity. The same
    clusters listed in another order are the same placement: nothing is announced."""
    for name in ("a", "b", "c"):
        await harness.cluster(small(name, "4"))
    agent = make_daemonset("agent").with_requests(cpu="100m").build()
    await harness.analyzed(agent)
    first = await harness.decided(agent.ref.key)
    assert len(first) == 1
    order = [p.cluster for p in first[0].clusters]

    # The last-ranked cluster becomes the roomiest: the score order changes.
    await harness.cache.put(small(order[-1], "64").record())  # type: ignore[arg-type]
    await harness.handle(reschedule(agent, "look again"))
    await harness.handle(reschedule(agent, "and again"))
    assert await harness.decided(agent.ref.key) == first
    record = await harness.record(agent.ref.key)
    assert record.decided == first[0]


def capacity_changed(name: str, cpu: int, revision: int) -> Envelope:
    """What the syncer publishes after writing a capacity record."""
    figures = {"cpu": cpu, "memory": 64 * 2**30, "pods": 110}
    payload = CapacityChanged(cluster=name, available=figures, allocatable=figures)
    return events.envelope(payload, key=name, producer="test", revision=revision)


async def test_pending_objects_are_placed_when_redis_comes_back_with_the_same_figures(
    nats_server: NatsServer, fresh_redis: RedisServer, unique: str
) -> None:
    """Redis restarts empty; objects decided meanwhile see no capacity record and
    wait. The syncer writes the record again with the same figures as before: that
    must place them, with no other trigger."""
    cache = RedisCapacityCache.from_url(fresh_redis.url, prefix=f"t{unique}:")
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache)
    try:
        harness = Harness(bus, scheduler, cache)  # type: ignore[arg-type]
        await harness.cluster(small("a", "8"))
        await harness.handle(capacity_changed("a", 8000, 1))
        first = make_pod("first").with_requests(cpu="1").build()
        await harness.analyzed(first)
        assert harness.active(await harness.record(first.ref.key)) == {"a": 1}

        fresh_redis.kill()
        fresh_redis.start()
        late = [make_pod(f"late-{i}").with_requests(cpu="1").build() for i in range(3)]
        for obj in late:
            envelope = harness.analyzed_event(obj)

            async def decided(envelope: Envelope = envelope) -> bool:
                try:
                    await harness.handle(envelope)
                except Unavailable:
                    return False  # the client reconnects to the restarted Redis
                return True

            await eventually(decided, what="a decision against the restarted Redis")
            assert (await harness.record(obj.ref.key)).waiting

        await cache.put(small("a", "8").record())  # type: ignore[arg-type]
        await harness.handle(capacity_changed("a", 8000, 2))
        assert await harness.run_requests() == sorted(o.ref.key for o in late)
        for obj in late:
            assert harness.active(await harness.record(obj.ref.key)) == {"a": 1}
    finally:
        await close(bus, tasks)
        await cache.aclose()


async def test_a_capacity_retry_decides_on_the_new_capacity_on_any_replica(
    nats_server: NatsServer, unique: str
) -> None:
    """Replica A takes the ``CapacityChanged``; replica B, whose shared snapshot is
    young enough to be reused, decides the retry: it must see the new record."""
    cache = FakeCapacityCache()
    prefix = f"s{unique}"
    bus_a, replica_a, tasks_a = await open_scheduler(nats_server.url, prefix, cache, instance="a")
    bus_b, replica_b, tasks_b = await open_scheduler(
        nats_server.url, prefix, cache, snapshot_max_age=3600.0, instance="b"
    )
    try:
        on_a = Harness(bus_a, replica_a, cache)
        on_b = Harness(bus_b, replica_b, cache)
        await on_a.cluster(small("a", "1"))
        big = make_pod("big").with_requests(cpu="2").build()
        await on_b.analyzed(big)
        assert (await on_b.record(big.ref.key)).waiting

        await cache.put(small("a", "4").record())  # type: ignore[arg-type]
        await on_a.handle(capacity_changed("a", 4000, 1))
        assert await on_b.run_requests() == [big.ref.key]
        assert on_b.active(await on_b.record(big.ref.key)) == {"a": 1}
    finally:
        await close(bus_a, tasks_a)
        await close(bus_b, tasks_b)


async def test_replicas_without_requests_are_bounded_by_pods_and_absurd_counts_do_not_stall(
    harness: Harness,
) -> None:
    """Every replica needs a pod slot, requests or not; a replica count of ten
    million is placed as far as capacity allows (or refused), at once, with an Event."""
    started = time.monotonic()

    def only(analyzed: ResourceAnalyzed, *names: str) -> ResourceAnalyzed:
        return analyzed.model_copy(update={"policy_spec": make_policy().names(*names).build()})

    def roomy(name: str, nodes: int) -> ClusterBuilder:
        return make_cluster(name).with_room(nodes, cpu="64", memory="64Gi", pods=110)

    for builder in (roomy("a", 5), roomy("b", 5), roomy("m", 2)):
        await harness.cluster(builder)

    many = only(make_deployment("many", replicas=6000).with_requests().build(), "m")
    await harness.analyzed(many)
    record = await harness.record(many.ref.key)
    assert harness.active(record) == {"m": 220}
    assert record.pending == 6000 - 220
    assert [r.replicas for r in await harness.cache.reservations("m")] == [220]

    huge = only(make_deployment("huge", replicas=10_000_000).build(), "a", "b", "c")
    await harness.analyzed(huge)
    record = await harness.record(huge.ref.key)
    assert harness.active(record) == {"a": 550, "b": 550}  # pods, not CPU, run out first
    assert record.pending == 10_000_000 - 1100

    anywhere = only(make_pod("huge-pod").with_requests().with_replicas(10_000_000).build(), "a")
    await harness.analyzed(anywhere)
    record = await harness.record(anywhere.ref.key)
    assert not record.schedulable
    assert record.decided.reasons_for("a") == ["capacity: room for 0 of 10000000 replicas (pods=1)"]

    # A new cluster: the partly placed object grows onto it, as far as its pods go.
    await harness.cluster(roomy("c", 1))
    assert huge.ref.key in await harness.run_requests()
    assert harness.active(await harness.record(huge.ref.key)) == {"a": 550, "b": 550, "c": 110}

    await harness.cluster(small("w", "4"))
    await harness.run_requests()
    web = only(make_deployment("web", replicas=2).build(), "w")
    await harness.analyzed(web)
    assert harness.active(await harness.record(web.ref.key)) == {"w": 2}

    await harness.scheduler.notices.flush()
    reasons = {(name, reason) for name, reason, _ in harness.reporter.warnings}
    assert ("many", "PartiallyScheduled") in reasons
    assert ("huge", "PartiallyScheduled") in reasons
    assert ("huge-pod", "Unschedulable") in reasons
    assert time.monotonic() - started < 30, "a generous bound: replica by replica takes minutes"


async def test_reservations_of_an_abandoned_attempt_are_released(
    nats_server: NatsServer, unique: str
) -> None:
    """A replica reserved on b and died before recording; the redelivered event put
    the object on a. Once older than the grace, the claim on b is released; claims
    a record backs, and young ones (a decision in flight), are kept."""
    now = [1_000_000.0]
    cache = FakeCapacityCache(clock=lambda: now[0])
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache)
    scheduler.reservation_grace = 30.0
    try:
        harness = Harness(bus, scheduler, cache)
        await harness.cluster(small("a", "4"))
        await harness.cluster(small("b", "4"))
        web = make_pod("web").with_requests(cpu="1").build()
        await harness.analyzed(web)
        (held,) = harness.active(await harness.record(web.ref.key))
        other = "b" if held == "a" else "a"
        # What the dead replica left behind, and a claim being made right now.
        assert await cache.reserve(other, web.ref.key, {"cpu": 1000}, 2, 600.0)
        now[0] += 31.0
        fresh = make_pod("fresh").with_requests(cpu="1").build()
        assert await cache.reserve(other, fresh.ref.key, {"cpu": 1000}, 1, 600.0)

        assert await scheduler.reconcile_reservations() == 1
        assert [r.id for r in await cache.reservations(held)] == [web.ref.key]
        assert [r.id for r in await cache.reservations(other)] == [fresh.ref.key]
        now[0] += 31.0  # nothing ever recorded the fresh claim either
        assert await scheduler.reconcile_reservations() == 1
        assert await cache.reservations(other) == []
        assert [r.id for r in await cache.reservations(held)] == [web.ref.key]
    finally:
        await close(bus, tasks)


def placement(analyzed: ResourceAnalyzed, *clusters: str) -> PlacementRecord:
    entries = [ClusterPlacement(cluster=c, replicas=1) for c in clusters]
    return PlacementRecord(
        key=analyzed.ref.key,
        analyzed=analyzed,
        decided=PlacementDecided(ref=analyzed.ref, decision_id="d", clusters=entries),
    )


def deleted(record: PlacementRecord) -> PlacementRecord:
    decided = PlacementDecided(
        ref=record.analyzed.ref, decision_id="gone", clusters=[], deleted=True
    )
    return record.model_copy(update={"decided": decided})


async def test_a_restarted_replica_never_publishes_a_decision_twice(
    nats_server: NatsServer, unique: str
) -> None:
    """The replica died after recording and publishing, before acknowledging: the
    redelivered event and any later look at the unchanged object, on a fresh replica,
    leave exactly one ``PlacementDecided`` on the stream."""
    cache = FakeCapacityCache()
    prefix = f"s{unique}"
    bus, scheduler, tasks = await open_scheduler(nats_server.url, prefix, cache)
    try:
        before = Harness(bus, scheduler, cache)
        for name in ("a", "b", "c"):
            await before.cluster(small(name, "4"))
        agent = make_daemonset("agent").build()
        delivered = await before.analyzed(agent)
    finally:
        await close(bus, tasks)
    bus, scheduler, tasks = await open_scheduler(nats_server.url, prefix, cache, instance="2")
    try:
        after = Harness(bus, scheduler, cache)
        await after.handle(delivered)
        await after.handle(reschedule(agent, "look again"))
        decided = await after.decided(agent.ref.key)
        assert len(decided) == 1
        assert (await after.record(agent.ref.key)).decided == decided[0]
    finally:
        await close(bus, tasks)


async def test_a_new_object_is_decided_without_reading_its_record(harness: Harness) -> None:
    """An index miss is not looked up in the bucket: the create (compare-and-set at
    revision 0) would fail if a record existed, and the decision is then made again."""
    await harness.cluster(small("a", "4"))
    reads: list[str] = []
    real_get = harness.scheduler.placements.get

    async def counting(key: str) -> Any:
        reads.append(key)
        return await real_get(key)

    harness.scheduler.placements.get = counting  # type: ignore[method-assign]
    web = make_deployment("web", replicas=2).build()
    await harness.analyzed(web)
    assert reads == []
    assert harness.active(await harness.record(web.ref.key)) == {"a": 2}


# --- batches ---------------------------------------------------------------------------


def cause_of(envelope: Envelope) -> Cause:
    return Cause(event_id=envelope.id, uid=envelope.uid, generation=0, revision=envelope.revision)


async def test_decisions_asked_together_are_one_batch_with_one_decision_per_key(
    harness: Harness,
) -> None:
    """Decisions asked while none is being made go in one batch, except a second one
    of the same key: it waits for the next batch, so one key's decisions keep their
    order even when they are asked at once."""
    await harness.cluster(small("a", "8"))
    scheduler = harness.scheduler
    web = make_deployment("web", replicas=1).build()
    db = make_deployment("db", replicas=1).build()
    asks = [
        (web, harness.analyzed_event(web)),
        (web.model_copy(update={"replicas": 2}), harness.analyzed_event(web)),
        (db, harness.analyzed_event(db)),
    ]

    async def ask(analyzed: ResourceAnalyzed, envelope: Envelope) -> Any:
        key = analyzed.ref.key
        choice = await scheduler._choose(key, analyzed, cause_of(envelope), None, set())
        scheduler.read_model.settled(choice.plan, applied=True)  # as the claim's answer does
        return choice

    before = scheduler.batches
    choices = await asyncio.gather(*(ask(analyzed, envelope) for analyzed, envelope in asks))
    assert [choice.batch - before for choice in choices] == [1, 2, 1]
    assert [harness.active_of(choice) for choice in choices] == [{"a": 1}, {"a": 2}, {"a": 1}]


async def test_a_batch_shares_one_cluster_sync(harness: Harness) -> None:
    """Every decision must see the clusters written before it was asked; a batch asks
    the bucket once for all of its decisions."""
    await harness.cluster(small("a", "8"))
    scheduler = harness.scheduler
    syncs: list[int] = []
    real_sync = scheduler.clusters_view.sync

    async def counting(timeout: float | None = None) -> int:
        syncs.append(1)
        return await real_sync(timeout)

    scheduler.clusters_view.sync = counting  # type: ignore[method-assign]
    pods = [make_pod(f"p{i}").with_requests(cpu="100m").build() for i in range(12)]
    before = scheduler.batches
    await asyncio.gather(*(harness.analyzed(pod) for pod in pods))
    for pod in pods:
        assert harness.active(await harness.record(pod.ref.key)) == {"a": 1}
    assert scheduler.batches - before == len(syncs) <= 2


async def test_a_lost_compare_and_set_in_a_batch_publishes_nothing_for_it_and_holds_up_nothing(
    nats_server: NatsServer, unique: str
) -> None:
    """Three objects decided in one batch; another replica recorded the middle one
    meanwhile. Its write loses: it is decided again from the winner's record (what it
    publishes says so), while the other two are recorded and published once each."""
    async with two_replicas(nats_server, unique) as (first, second):
        await first.cluster(small("a", "8"))
        await second.scheduler.clusters_view.sync(5.0)
        web, mid, db = (make_deployment(n, replicas=1).build() for n in ("web", "mid", "db"))
        await first.analyzed(mid)
        await second.scheduler.placements_view.sync(5.0)
        # Replica two has not seen replica one's record of `mid` yet.
        second.scheduler.index.entries.pop(mid.ref.key, None)
        before = second.scheduler.batches
        bigger = second.analyzed_event(mid.model_copy(update={"replicas": 3}), revision=50)
        await asyncio.gather(second.analyzed(web), second.handle(bigger), second.analyzed(db))
        assert second.scheduler.batches - before == 2  # the lost one decided again alone
        decided = {k.ref.key: await second.decided(k.ref.key) for k in (web, mid, db)}
        assert [len(decided[k.ref.key]) for k in (web, db)] == [1, 1]
        assert [[(p.cluster, p.replicas) for p in d.previous] for d in decided[mid.ref.key]] == [
            [],
            [("a", 1)],
        ]
        assert harness_active(await second.record(mid.ref.key)) == {"a": 3}


async def test_a_failed_publish_fails_only_its_own_event_and_its_redelivery_publishes(
    harness: Harness,
) -> None:
    """Two objects in one batch; the publish of one fails. Its handler fails (the
    message is not acknowledged: the bus hands it back), the other's succeeds; the
    redelivered event publishes the decision already recorded."""
    await harness.cluster(small("a", "8"))
    web = make_deployment("web", replicas=1).build()
    db = make_deployment("db", replicas=1).build()
    real_publish = harness.bus.publish
    failing = {db.ref.key}

    async def publish(event: Envelope) -> Any:
        if event.key in failing:
            raise Unavailable("publish failed")
        return await real_publish(event)

    harness.bus.publish = publish  # type: ignore[method-assign]
    web_event, db_event = harness.analyzed_event(web), harness.analyzed_event(db)
    results = await asyncio.gather(
        harness.handle(web_event), harness.handle(db_event), return_exceptions=True
    )
    assert results[0] is None
    assert isinstance(results[1], Unavailable)
    assert len(await harness.decided(web.ref.key)) == 1
    assert await harness.decided(db.ref.key) == []
    recorded = await harness.record(db.ref.key)
    failing.clear()
    await harness.handle(db_event)
    assert await harness.decided(db.ref.key) == [recorded.decided]


async def test_a_decision_cancelled_after_its_batch_counted_its_claims_uncounts_them(
    harness: Harness,
) -> None:
    """The handler's deadline cancels it just after the batch decided it: nothing will
    claim what the batch counted into the read model, so the read model stops counting
    it (else it would wait for that claim's answer before every read, for ever)."""
    await harness.cluster(small("a", "8"))
    scheduler = harness.scheduler
    pod = make_pod("p").with_requests(cpu="1").build()
    envelope = harness.analyzed_event(pod)
    real_choose_one = scheduler._choose_one
    loop = asyncio.get_running_loop()

    def choose_then_cancel(*args: Any) -> Any:
        choice = real_choose_one(*args)
        loop.call_soon(asking.cancel)  # after the answer is set, before the caller resumes
        return choice

    scheduler._choose_one = choose_then_cancel  # type: ignore[method-assign,assignment]
    asking = asyncio.ensure_future(
        scheduler._choose(pod.ref.key, pod, cause_of(envelope), None, set())
    )
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert scheduler.read_model._quiet.is_set()
    assert scheduler.read_model._stale == {"a"}


async def test_a_batchs_claims_go_out_in_one_redis_round_trip(
    nats_server: NatsServer, redis_server: RedisServer, unique: str
) -> None:
    """Sixty-four objects decided in one batch: their claims leave together, in one
    Redis pipeline (a bound on claims in flight below the batch size split it)."""
    cache = RedisCapacityCache.from_url(redis_server.url, prefix=f"t{unique}:")
    bus, scheduler, tasks = await open_scheduler(nats_server.url, f"s{unique}", cache)
    try:
        harness = Harness(bus, scheduler, cache)  # type: ignore[arg-type]
        await harness.cluster(small("a", "64"))
        await harness.analyzed(make_pod("warm").with_requests(cpu="100m").build())  # script loaded
        pods = [make_pod(f"p{i}").with_requests(cpu="100m").build() for i in range(64)]
        batches, trips = scheduler.batches, cache.claim_round_trips
        await asyncio.gather(*(harness.analyzed(pod) for pod in pods))
        assert scheduler.batches - batches == 1
        assert cache.claim_round_trips - trips == 1
        assert len(await cache.reservations("a")) == 65
    finally:
        await close(bus, tasks)
        await cache.aclose()


async def test_a_reschedule_decides_under_the_same_policy_object_as_the_events(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core's memos are keyed by the policy object: a reschedule decides from a
    stored record, parsed anew when another replica wrote it, and must use the
    interned policy as events do."""
    policies: list[object] = []
    schedule = core.schedule

    def spy(inp: SchedulingInput) -> Decision:
        policies.append(inp.policy)
        return schedule(inp)

    monkeypatch.setattr(core, "schedule", spy)
    async with two_replicas(nats_server, unique) as (first, second):
        await first.cluster(small("a", "8"))
        await first.cluster(small("b", "8"))
        await second.scheduler.clusters_view.sync(5.0)
        policy = make_policy().max_clusters(1)
        web = make_deployment("web", replicas=2).governed_by(policy).build()
        other = make_deployment("other", replicas=2).governed_by(policy).build()
        await first.analyzed(web)
        await second.scheduler.placements_view.sync(5.0)
        await second.analyzed(other)
        await second.handle(reschedule(web, "drain cluster a", avoid=["a"]))
    assert len(policies) == 3 and policies[1] is not None
    assert policies[2] is policies[1], "the reschedule in replica two used its own copy"
