"""Two scheduler processes at once, real NATS and Redis: no overcommit, one placement each.

Two ``flotilla-scheduler`` OS processes (separate bus connections, instance names
and partition leases) share one installation. Five clusters with tight capacity
are announced (``ClusterObserved`` + capacity records in Redis), then 500 objects
(``ResourceAnalyzed`` published directly), then a scale-up of 100 of them while the
first wave is still being decided, and one cluster is drained meanwhile (cordoned,
and every object asked to avoid it, as the drain coordinator does). Demand is well
above what the fleet holds, so reservations are contested and many objects stay
Pending.

Checked once both processes are idle:

* no overcommit: per cluster, the replicas every record places there (times their
  requests) and the live reservations each fit in the cluster's capacity;
* one consistent placement per object: its KV record equals the last
  ``PlacementDecided`` published for its key, and each reservation matches the
  record's replicas on that cluster;
* nothing is Active on the drained cluster any more;
* both processes decided something (the work really was shared).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from flotilla.common import capacity, events
from flotilla.common.api import Strategy
from flotilla.common.bus import Bus
from flotilla.common.events import (
    ClusterObserved,
    ObjectRef,
    PlacementDecided,
    RescheduleRequested,
    ResourceAnalyzed,
)
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.topology import Topology
from flotilla.scheduler.records import PlacementRecord

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

CLUSTERS = 5
OBJECTS = 500
SCALED = 100
PARTITIONS = 8
NODE = {"cpu": 16000, "memory": 64 * 2**30, "pods": 110}
NODES = 10
SHAPES = [{"cpu": 250}, {"cpu": 500}, {"cpu": 1000}, {"cpu": 2000}]


def cluster_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name, "labels": {"region": f"r{name[-1]}"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def capacity_record(name: str) -> capacity.ClusterCapacity:
    return capacity.uniform(name, NODE, NODES, observed_at=time.time())


def analyzed(index: int, replicas: int, rng: random.Random) -> ResourceAnalyzed:
    name = f"obj-{index:04d}"
    split = index % 4 != 0
    ref = ObjectRef(
        api_version="apps/v1" if split else "v1",
        kind="Deployment" if split else "Pod",
        name=name,
        namespace="default",
    )
    return ResourceAnalyzed(
        ref=ref,
        object={
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{index}"},
        },
        strategy=Strategy.SPLIT if split else Strategy.ANY,
        replicas=replicas if split else 1,
        requests=dict(SHAPES[rng.randrange(len(SHAPES))]),
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.25
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Scheduler:
    """One ``flotilla-scheduler`` process."""

    def __init__(self, env: dict[str, str], instance: str, log: Path) -> None:
        self.instance = instance
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flotilla.scheduler"],
                env={**env, "FLOTILLA_INSTANCE": instance},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def scheduler_env(
    nats_server: NatsServer, redis_server: RedisServer, bus: Bus, prefix: str, **extra: str
) -> dict[str, str]:
    """The environment of a ``flotilla-scheduler`` process under test."""
    return {
        **os.environ,
        "FLOTILLA_NATS_URL": nats_server.url,
        "FLOTILLA_REDIS_URL": redis_server.url,
        "FLOTILLA_STREAM_PREFIX": bus.topology.prefix,
        "FLOTILLA_PARTITIONS": str(PARTITIONS),
        "FLOTILLA_CAPACITY_PREFIX": prefix,
        "FLOTILLA_HEALTH_PORT": "0",
        "FLOTILLA_HEALTH_HOST": "127.0.0.1",
        "FLOTILLA_LOG_LEVEL": "WARNING",
        "FLOTILLA_RESERVATION_TTL": "600",
        **extra,
    }


async def announce(bus: Bus, cache: RedisCapacityCache, names: list[str]) -> None:
    """Capacity records and ``ClusterObserved`` for `names`, as syncer and watcher would."""
    for name in names:
        await cache.put(capacity_record(name))
    await bus.publish_batch(
        [
            events.envelope(
                ClusterObserved(cluster=name, object=cluster_object(name)),
                key=f"cluster/{name}",
                producer="test",
                revision=1,
            )
            for name in names
        ]
    )


async def consumers_idle(bus: Bus) -> bool:
    """Every scheduler partition consumer exists and has nothing pending or unacked."""
    for partition in range(PARTITIONS):
        try:
            info = await bus.js.consumer_info(
                bus.topology.events_stream.name, f"scheduler-p{partition}"
            )
        except Exception:
            return False
        if info.num_pending or info.num_ack_pending:
            return False
    return True


@pytest.fixture
async def bus(nats_server: NatsServer, unique: str) -> AsyncIterator[Bus]:
    topology = Topology(prefix=f"sr{unique}", partitions=PARTITIONS)
    connected = await Bus.connect(nats_server.url, topology=topology, producer="test")
    try:
        yield connected
    finally:
        await connected.close()


async def test_two_scheduler_processes_share_the_work_without_overcommit(
    bus: Bus, nats_server: NatsServer, redis_server: RedisServer, unique: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    prefix = f"flotilla:{unique}:capacity:"
    cache = RedisCapacityCache.from_url(redis_server.url, prefix=prefix)
    env = scheduler_env(nats_server, redis_server, bus, prefix)
    names = [f"c{i}" for i in range(CLUSTERS)]
    schedulers = [Scheduler(env, f"sched-{n}", tmp_path / f"sched-{n}.log") for n in ("a", "b")]
    try:
        await announce(bus, cache, names)
        clusters_kv = await bus.bucket(bus.topology.bucket("scheduler-clusters"))

        async def clusters_known() -> bool:
            status = await clusters_kv.status()
            return int(status.values) >= CLUSTERS

        await eventually(clusters_known, 30, "the clusters to be recorded")

        # Both replicas must hold partitions before the objects arrive, or the first
        # one up would decide everything before the second joins.
        leases_kv = await bus.bucket(bus.topology.leases_bucket)

        async def both_consuming() -> bool:
            holders = set()
            for partition in range(PARTITIONS):
                try:
                    entry = await leases_kv.get(f"scheduler.p{partition}")
                except Exception:
                    return False
                holders.add(entry.value.decode())
            return holders == {s.instance for s in schedulers}

        await eventually(both_consuming, 45, "both schedulers to hold partitions")

        objects = [analyzed(i, rng.randrange(1, 6), rng) for i in range(OBJECTS)]
        first = [
            events.envelope(o, key=o.ref.key, producer="test", uid=f"uid-{i}", revision=1)
            for i, o in enumerate(objects)
        ]
        await bus.publish_batch(first)
        scaled = [
            events.envelope(
                objects[i].model_copy(update={"replicas": (objects[i].replicas or 1) + 3}),
                key=objects[i].ref.key,
                producer="test",
                uid=f"uid-{i}",
                revision=2,
            )
            for i in range(1, OBJECTS, OBJECTS // SCALED)
        ]
        await bus.publish_batch(scaled)
        # And drain one cluster meanwhile, as the drain coordinator does: cordon it,
        # then ask for every object to avoid it; what runs there moves
        # (make-before-break).
        drained = cluster_object(names[0])
        drained["spec"]["unschedulable"] = True
        await bus.publish(
            events.envelope(
                ClusterObserved(cluster=names[0], object=drained),
                key=f"cluster/{names[0]}",
                producer="test",
                revision=2,
            )
        )
        await bus.publish_batch(
            [
                events.envelope(
                    RescheduleRequested(
                        ref=o.ref, reason=f"drain {names[0]}", avoid_clusters=[names[0]]
                    ),
                    key=o.ref.key,
                    producer="test",
                    dedupe=("drain", names[0]),
                )
                for o in objects
            ]
        )
        latest = {e.key: e for e in first} | {e.key: e for e in scaled}

        placements_kv = await bus.bucket(bus.topology.placements_bucket)
        store = await bus.store(bus.topology.placements_bucket, PlacementRecord)

        async def settled() -> bool:
            for s in schedulers:
                assert s.proc.poll() is None, f"{s.instance} exited:\n{s.tail()}"
            if not await consumers_idle(bus):
                return False
            status = await placements_kv.status()
            return int(status.values) >= OBJECTS

        await eventually(settled, 75, "both schedulers to decide every object")

        # --- one consistent placement per object --------------------------------
        last_decided: dict[str, PlacementDecided] = {}
        producers = set()
        async for replayed in bus.replay(event_types=["PlacementDecided"]):
            payload = replayed.envelope.payload
            assert isinstance(payload, PlacementDecided)
            last_decided[replayed.envelope.key] = payload
            producers.add(replayed.envelope.producer)
        assert producers == {"scheduler/sched-a", "scheduler/sched-b"}
        assert set(last_decided) == set(latest)

        stored: dict[str, PlacementRecord] = {}
        for key, envelope in latest.items():
            found = await store.get(key)
            assert found is not None, key
            record = found[0]
            assert isinstance(record, PlacementRecord)
            assert record.revision == envelope.revision, key
            assert record.analyzed == envelope.payload, key
            assert record.decided == last_decided[key], key
            stored[key] = record

        # --- no overcommit ----------------------------------------------------------
        snapshot = await cache.snapshot(names)
        placed_somewhere = 0
        pending = 0
        for name in names:
            limit = snapshot.clusters[name].available
            used: dict[str, int] = defaultdict(int)
            expected_reservations: dict[str, int] = {}
            for key, record in stored.items():
                for p in record.clusters:
                    # Retiring replicas still run until the new ones are ready.
                    if p.cluster != name:
                        continue
                    replicas = p.replicas or 0
                    expected_reservations[key] = replicas
                    for resource, amount in capacity.pod_shape(record.analyzed.requests).items():
                        used[resource] += amount * replicas
            assert all(used[r] <= limit.get(r, 0) for r in used), (name, dict(used), limit)
            reserved = snapshot.clusters[name].reserved
            assert all(reserved[r] <= limit.get(r, 0) for r in reserved), (name, reserved)
            held = {r.id: r.replicas for r in await cache.reservations(name)}
            assert held == expected_reservations, name
        for record in stored.values():
            placed_somewhere += bool(record.clusters)
            pending += record.waiting
        # Tight: the fleet cannot hold everything, yet most objects are placed.
        assert pending > 0
        assert placed_somewhere > OBJECTS // 2
        # Nothing stays Active on the drained cluster.
        assert not any(
            p.cluster == names[0] and p.state == "Active"
            for record in stored.values()
            for p in record.clusters
        )
    finally:
        codes = [s.stop() for s in schedulers]
        await cache.aclose()
    assert codes == [0, 0], "\n\n".join(s.tail() for s in schedulers)


async def test_a_killed_scheduler_recovers_its_work_in_flight_promptly_and_leaks_nothing(
    bus: Bus, nats_server: NatsServer, redis_server: RedisServer, unique: str, tmp_path: Path
) -> None:
    """SIGKILL one scheduler process mid-flow and start it again: what it had in
    flight is redelivered within the ack wait (not 30 s later), every object ends up
    decided, and no reservation stays on a cluster its object did not get (claims
    made by the killed attempt are reconciled against the records)."""
    rng = random.Random(8)
    prefix = f"flotilla:{unique}:capacity:"
    cache = RedisCapacityCache.from_url(redis_server.url, prefix=prefix)
    env = scheduler_env(nats_server, redis_server, bus, prefix, FLOTILLA_RESERVATION_GRACE="2")
    names = [f"c{i}" for i in range(CLUSTERS)]
    count = 1500  # a batching scheduler decides 300 before a kill can land
    first = Scheduler(env, "sched-a", tmp_path / "sched-a.log")
    restarted: Scheduler | None = None
    try:
        await announce(bus, cache, names)
        placements_kv = await bus.bucket(bus.topology.placements_bucket)

        async def recorded(at_least: int) -> bool:
            try:
                status = await placements_kv.status()
            except Exception:
                return False
            return int(status.values) >= at_least

        objects = [analyzed(i, rng.randrange(1, 6), rng) for i in range(count)]
        await bus.publish_batch(
            [
                events.envelope(o, key=o.ref.key, producer="test", uid=f"uid-{i}", revision=1)
                for i, o in enumerate(objects)
            ]
        )
        await eventually(lambda: recorded(20), 45, "the first decisions")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        killed_at = time.monotonic()
        assert not await recorded(count), "nothing was left in flight to recover"
        restarted = Scheduler(env, "sched-a", tmp_path / "sched-a-2.log")

        async def settled() -> bool:
            assert restarted is not None and restarted.proc.poll() is None, restarted.tail()
            return await consumers_idle(bus) and await recorded(count)

        await eventually(settled, 60, "every object to be decided after the restart")
        recovered_in = time.monotonic() - killed_at
        # What bounds recovery is the ack wait of the durable consumers (was 30 s) and
        # the lease TTL; the wall-clock bound is loose because a process start-up on a
        # loaded 2-core machine alone can take several seconds.
        stream = bus.topology.events_stream.name
        for partition in range(bus.topology.partitions):
            info = await bus.js.consumer_info(stream, f"scheduler-p{partition}")
            assert info.config.ack_wait is not None and info.config.ack_wait <= 10
        assert bus.topology.lease_ttl <= 10
        assert recovered_in < 45, f"recovered only after {recovered_in:.1f}s"

        store = await bus.store(bus.topology.placements_bucket, PlacementRecord)
        holders: dict[str, set[str]] = defaultdict(set)
        for o in objects:
            found = await store.get(o.ref.key)
            assert found is not None, o.ref.key
            for p in found[0].clusters:
                holders[p.cluster].add(o.ref.key)

        async def no_stray_reservation() -> bool:
            for name in names:
                held = {r.id for r in await cache.reservations(name)}
                if not held <= holders[name]:
                    return False
            return True

        await eventually(no_stray_reservation, 20, "reservations only where records hold them")
    finally:
        codes = [s.stop() for s in (first, restarted) if s is not None]
        await cache.aclose()
    assert codes[-1] == 0, restarted.tail() if restarted else ""
