"""Decisions per second of the pure scheduler core at 10, 100 and 1,000 clusters.

Not a test: it prints one JSON document. Run with ``.venv/bin/python bench/scheduler.py``
(optionally ``--seconds 3`` per fleet size, ``--clusters 100`` for one size).

The fleet is a realistic mix: five regions, ten nodes per cluster, about one cluster
in ten tainted ``dedicated=batch:NoSchedule``, a few cordoned, NotReady or draining,
and API resources reported. The objects are 60% ``split`` Deployments (region
selector, toleration for the batch taint, some with ``maxClusters`` or ``spread``),
15% ``copy`` DaemonSets and 25% ``any`` Pods, over eight request shapes, a third of
them with a previous placement.

What is timed is ``core.schedule`` alone, one snapshot (`model.Fleet`) shared by all
decisions as in the service; building the fleet is reported separately
(``fleet_build_ms``) because it happens once per capacity snapshot, not per
decision. ``decisions_per_s`` is the steady state, the per-snapshot memos (fit per
request shape, filter verdicts per policy and shape) filled; ``first_decision_us`` and
``first_pass_decisions_per_s`` (the first pass over all 300 objects) are the cold
cost right after a new snapshot.

The ``service`` section (``--service CLUSTERS:PROCESSES:OBJECTS``, repeatable;
``--no-service`` to skip) measures the service end to end on this machine: it
starts NATS and Redis, one or two ``python -m flotilla.scheduler`` processes,
announces the fleet (``ClusterObserved`` and capacity records), publishes N
``ResourceAnalyzed`` at once and reports N / (time until the N-th
``PlacementDecided`` arrives); a run that has not finished after 120 s reports
what it decided (``complete: false``). The service runs use a fleet with room
for them and a mix most of which places something (`make_service_object`):
``placed_share`` is the share of decisions that placed anything, beside
``cpu_ms_per_decision`` (the scheduler processes' CPU time over the run, per
decision) and the load average. ``--load N`` keeps N busy-looping processes running
beside the service runs (``busy_processes`` in each result): other work on the
machine. ``--profile DIR`` attaches py-spy to the first scheduler process for each
run's timed window and writes its raw collapsed stacks
to ``DIR/scheduler-CLUSTERS-PROCESSES.txt`` (named in the run's ``profile``).
Everything (NATS, Redis, the replicas, this publisher) shares the machine's cores.
Nothing plays the syncer, so reservations pile up for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.common import api, capacity
from flotilla.common.api import Strategy
from flotilla.common.bus import Bus
from flotilla.common.events import (
    ClusterObserved,
    ClusterPlacement,
    ObjectRef,
    ResourceAnalyzed,
    encode,
    envelope,
)
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.topology import Topology
from flotilla.scheduler import claims, core, state
from flotilla.scheduler.model import Fleet, SchedulingInput
from flotilla.scheduler.readmodel import ReadModel
from flotilla.scheduler.records import ClusterRecord
from flotilla.scheduler.service import Cause, Scheduler

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
REGIONS = ["us-east", "us-west", "eu-west", "eu-central", "ap-south"]
GIB = 2**30
SHAPES = [
    {"cpu": 100, "memory": 128 * 2**20},
    {"cpu": 250, "memory": 256 * 2**20},
    {"cpu": 500, "memory": GIB},
    {"cpu": 1000, "memory": 2 * GIB},
    {"cpu": 2000, "memory": 4 * GIB},
    {"cpu": 200, "memory": 512 * 2**20},
    {"cpu": 4000, "memory": 16 * GIB},
    {"cpu": 1000, "memory": GIB, "nvidia.com/gpu": 1},
]
SERVED = [
    api.ApiResource(group="apps", version="v1", kind=kind)
    for kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet")
] + [api.ApiResource(group="", version="v1", kind=kind) for kind in ("Pod", "ConfigMap")]


def make_fleet(
    size: int, rng: random.Random, *, roomy: bool = False
) -> tuple[list[api.Cluster], capacity.Snapshot]:
    """The fleet; `roomy` (the service runs) has nodes four times larger and at most
    half used, so that a few thousand objects of the service mix fit."""
    clusters = []
    records = {}
    for i in range(size):
        name = f"cluster-{i:04d}"
        region = REGIONS[i % len(REGIONS)]
        roll = rng.random()
        taints = (
            [api.Taint(key="dedicated", value="batch", effect=api.TaintEffect.NO_SCHEDULE)]
            if roll < 0.1
            else []
        )
        ready = api.ConditionStatus.FALSE if 0.1 <= roll < 0.12 else api.ConditionStatus.TRUE
        clusters.append(
            api.Cluster(
                metadata=api.ObjectMeta(
                    name=name,
                    labels={"region": region, "zone": f"{region}-{i % 3}", "tier": "gold"},
                ),
                spec=api.ClusterSpec(
                    taints=taints,
                    unschedulable=0.12 <= roll < 0.15,
                    evict_after=NOW - timedelta(minutes=1) if 0.15 <= roll < 0.16 else None,
                ),
                status=api.ClusterStatus(
                    conditions=[api.Condition(type="Ready", status=ready)],
                    api_resources=SERVED,
                    placements=rng.randrange(0, 500),
                ),
            )
        )
        nodes = []
        for n in range(10):
            allocatable = {"cpu": 16000, "memory": 64 * GIB, "pods": 110}
            if roomy:
                allocatable = {"cpu": 64000, "memory": 256 * GIB, "pods": 250}
            if n < 2 and i % 4 == 0:
                allocatable["nvidia.com/gpu"] = 4
            used = rng.random() * (0.5 if roomy else 0.8)
            free = {r: int(v * (1 - used)) for r, v in allocatable.items()}
            nodes.append(
                capacity.NodeCapacity(name=f"{name}-{n}", allocatable=allocatable, free=free)
            )
        total_alloc = capacity.add(*(n.allocatable for n in nodes))
        total_free = capacity.add(*(n.free for n in nodes))
        records[name] = capacity.ClusterCapacity(
            cluster=name,
            allocatable=total_alloc,
            available=total_free,
            nodes=nodes,
            reserved={"cpu": rng.randrange(0, 4000)},
            observed_at=NOW.timestamp(),
        )
    return clusters, capacity.Snapshot(clusters=records, taken_at=NOW.timestamp())


POLICIES = [
    api.PlacementPolicySpec.model_validate(spec)
    for spec in [
        {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
            "clusterSelector": {
                "matchExpressions": [
                    {
                        "key": "region",
                        "operator": "In",
                        "values": ["us-east", "eu-west", "ap-south"],
                    }
                ]
            },
            "tolerations": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
        },
        {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
            "clusterSelector": {"matchLabels": {"tier": "gold"}},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "maxClusters": 3,
        },
        {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
            "clusterSelector": {
                "matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["us-west"]}]
            },
            "tolerations": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
            "spread": {"labelKey": "region", "minGroups": 2, "maxGroups": 3},
            "maxClusters": 6,
        },
    ]
]


def make_object(
    i: int, rng: random.Random, names: list[str]
) -> tuple[ResourceAnalyzed, Any, list[ClusterPlacement]]:
    roll = rng.random()
    shape = SHAPES[rng.randrange(len(SHAPES) - 1)] if roll < 0.85 else SHAPES[-1]
    if roll < 0.6:
        kind, api_version, strategy = "Deployment", "apps/v1", Strategy.SPLIT
        replicas: int | None = rng.randrange(1, 51)
        policy: api.PlacementPolicySpec | None = POLICIES[i % len(POLICIES)]
    elif roll < 0.75:
        kind, api_version, strategy = "DaemonSet", "apps/v1", Strategy.COPY
        replicas, policy = 1, None
    else:
        kind, api_version, strategy = "Pod", "v1", Strategy.ANY
        replicas, policy = 1, None
    previous = []
    if rng.random() < 0.33 and names and strategy is not Strategy.COPY:
        previous = [ClusterPlacement(cluster=rng.choice(names), replicas=replicas)]
    obj = ResourceAnalyzed(
        ref=ObjectRef(api_version=api_version, kind=kind, name=f"obj-{i}", namespace="bench"),
        object={"metadata": {"name": f"obj-{i}", "namespace": "bench", "uid": f"uid-{i}"}},
        strategy=strategy,
        replicas=replicas,
        requests=dict(shape),
    )
    return obj, policy, previous


def measure(size: int, seconds: float, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    clusters, snapshot = make_fleet(size, rng)
    started = time.perf_counter()
    fleet = Fleet(clusters, snapshot)
    fleet_build = time.perf_counter() - started
    names = [c.metadata.name for c in clusters]
    inputs = []
    for i in range(300):
        obj, policy, previous = make_object(i, rng, names)
        inputs.append(
            SchedulingInput(
                analyzed=obj, policy=policy, fleet=fleet, now=NOW, previous=tuple(previous)
            )
        )
    started = time.perf_counter()
    core.schedule(inputs[0])
    first = time.perf_counter() - started
    started = time.perf_counter()
    for inp in inputs[1:]:
        core.schedule(inp)
    first_pass = (len(inputs) - 1) / (time.perf_counter() - started)
    durations = []
    placed = unschedulable = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for inp in inputs:
            started = time.perf_counter()
            decision = core.schedule(inp)
            durations.append(time.perf_counter() - started)
            placed += bool(decision.active)
            unschedulable += not decision.schedulable
    total = sum(durations)
    durations.sort()
    return {
        "clusters": size,
        "decisions": len(durations),
        "decisions_per_s": round(len(durations) / total),
        "mean_us": round(statistics.fmean(durations) * 1e6, 1),
        "p50_us": round(durations[len(durations) // 2] * 1e6, 1),
        "p99_us": round(durations[int(len(durations) * 0.99)] * 1e6, 1),
        "first_decision_us": round(first * 1e6, 1),
        "first_pass_decisions_per_s": round(first_pass),
        "fleet_build_ms": round(fleet_build * 1e3, 1),
        "placed_share": round(placed / len(durations), 3),
        "unschedulable_share": round(unschedulable / len(durations), 3),
    }


# --- one decision's work in process, without I/O ------------------------------------------


def measure_decide_path(size: int, objects: int, seed: int = 11) -> dict[str, Any]:
    """CPU per decision of what `Scheduler.decide` computes between its awaits, in
    process and without NATS or Redis: ``core.schedule`` on the read model's fleet,
    the claim plan counted into the read model (patching the fleet, as the service
    does), the placement record and the ``PlacementDecided`` envelope encoded. The
    service mix (`make_service_object`); each object decided once, new.
    ``by_strategy`` splits the CPU per decision of each strategy into the core
    (``schedule_ms``) and the claim plan counted into the read model (``claims_ms``):
    a ``copy`` claims on every cluster it lands on, and each claim patches the fleet."""
    rng = random.Random(seed)
    clusters, snapshot = make_fleet(size, rng, roomy=True)
    inputs = [make_service_object(i, rng) for i in range(objects)]
    by_strategy: dict[str, list[float]] = {}

    async def run() -> float:
        cache = capacity.FakeCapacityCache()
        for room in snapshot.clusters.values():
            await cache.put(room)
        view = state.Clusters()
        for version, cluster in enumerate(clusters, start=1):
            name = cluster.metadata.name
            view.apply(name, ClusterRecord(name=name, revision=1, cluster=cluster), version)
        read_model = ReadModel(cache, view, max_age=3600.0, slots=asyncio.Semaphore(1))
        await read_model.fleet(view.version)  # built once, as after a cluster change
        started = time.process_time()
        for i, analyzed in enumerate(inputs):
            key = analyzed.ref.key
            fleet = await read_model.fleet(view.version)
            before = time.process_time()
            decision = core.schedule(
                SchedulingInput(
                    analyzed=analyzed, policy=analyzed.policy_spec, fleet=fleet, now=NOW
                )
            )
            decided = time.process_time()
            plan = claims.plan(key, analyzed, (), decision.clusters)
            if plan:
                read_model.apply(plan)
                read_model.settled(plan, applied=True)
            counted = by_strategy.setdefault(analyzed.strategy.value, [0, 0.0, 0.0])
            counted[0] += 1
            counted[1] += decided - before
            counted[2] += time.process_time() - decided
            cause = Cause(event_id=f"bench-{i}", uid=f"uid-{i}", generation=0, revision=1)
            record = Scheduler._record(key, analyzed, cause, None, decision, True, "")
            assert record is not None
            record.model_dump_json(by_alias=True)
            encode(
                envelope(
                    record.decided,
                    key=key,
                    producer="bench",
                    uid=record.uid,
                    revision=1,
                    dedupe=(record.decided.decision_id,),
                )
            )
        return time.process_time() - started

    cpu = asyncio.run(run())
    return {
        "clusters": size,
        "objects": objects,
        "cpu_ms_per_decision": round(cpu * 1000 / objects, 3),
        "by_strategy": {
            strategy: {
                "decisions": int(count),
                "schedule_ms": round(schedule * 1000 / count, 3),
                "claims_ms": round(claim * 1000 / count, 3),
            }
            for strategy, (count, schedule, claim) in sorted(by_strategy.items())
        },
    }


# --- the service end to end ------------------------------------------------------------


def make_service_object(i: int, rng: random.Random) -> ResourceAnalyzed:
    """The service runs' mix: what a real fleet mostly sees. 60% ``split``
    Deployments of 1-4 replicas, 10% ``copy`` DaemonSets of a small agent, 30% ``any``
    Pods, over the three smaller request shapes: most decisions place something
    (the placed share is reported beside each figure)."""
    roll = rng.random()
    shape = SHAPES[rng.randrange(3)]
    policy: api.PlacementPolicySpec | None = None
    if roll < 0.6:
        kind, api_version, strategy = "Deployment", "apps/v1", Strategy.SPLIT
        replicas: int | None = rng.randrange(1, 5)
        policy = POLICIES[i % len(POLICIES)]
    elif roll < 0.7:
        kind, api_version, strategy = "DaemonSet", "apps/v1", Strategy.COPY
        replicas, shape = 1, {"cpu": 50, "memory": 64 * 2**20}
    else:
        kind, api_version, strategy = "Pod", "v1", Strategy.ANY
        replicas = 1
    return ResourceAnalyzed(
        ref=ObjectRef(api_version=api_version, kind=kind, name=f"obj-{i}", namespace="bench"),
        object={"metadata": {"name": f"obj-{i}", "namespace": "bench", "uid": f"uid-{i}"}},
        strategy=strategy,
        replicas=replicas,
        requests=dict(shape),
        policy_spec=policy,
    )


class _Replica:
    """One ``python -m flotilla.scheduler`` process, started under `wrapper` (a
    command and its arguments, e.g. valgrind's) when one is given."""

    def __init__(self, env: dict[str, str], instance: str, wrapper: Sequence[str] = ()) -> None:
        self.instance = instance
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "flotilla.scheduler"],
            env={**env, "FLOTILLA_INSTANCE": instance},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


async def _service_run(
    nats_url: str,
    redis_url: str,
    objects: int,
    size: int,
    replicas: int,
    run: int,
    timeout: float = 120.0,
    profile_dir: str | None = None,
    wrapper: Sequence[str] = (),
    startup_timeout: float = 60.0,
) -> dict[str, Any]:
    rng = random.Random(11)
    prefix = f"bench{run}"
    partitions = 16
    topology = Topology(prefix=prefix, partitions=partitions)
    bus = await Bus.connect(nats_url, topology=topology, producer="bench")
    cache_prefix = f"bench{run}:capacity:"
    cache = RedisCapacityCache.from_url(redis_url, prefix=cache_prefix)
    env = {
        **os.environ,
        "FLOTILLA_NATS_URL": nats_url,
        "FLOTILLA_REDIS_URL": redis_url,
        "FLOTILLA_STREAM_PREFIX": prefix,
        "FLOTILLA_PARTITIONS": str(partitions),
        "FLOTILLA_CAPACITY_PREFIX": cache_prefix,
        "FLOTILLA_HEALTH_PORT": "0",
        "FLOTILLA_HEALTH_HOST": "127.0.0.1",
        "FLOTILLA_LOG_LEVEL": "ERROR",
    }
    clusters, snapshot = make_fleet(size, rng, roomy=True)
    started_replicas = [_Replica(env, f"bench-{run}-{i}", wrapper) for i in range(replicas)]
    received = placed = 0
    done = asyncio.Event()

    async def count(msg: Any) -> None:
        nonlocal received, placed
        received += 1
        placed += b'"state":"Active"' in msg.data
        if received >= objects:
            done.set()

    spy: subprocess.Popen[bytes] | None = None
    profile = ""
    sub = await bus.nc.subscribe(f"{prefix}.events.PlacementDecided.>", cb=count)
    try:
        for room in snapshot.clusters.values():
            await cache.put(room)
        await bus.publish_batch(
            [
                envelope(
                    ClusterObserved(
                        cluster=c.metadata.name, object=c.model_dump(mode="json", by_alias=True)
                    ),
                    key=f"cluster/{c.metadata.name}",
                    producer="bench",
                    revision=1,
                )
                for c in clusters
            ]
        )
        clusters_kv = await bus.bucket(topology.bucket("scheduler-clusters"))
        leases_kv = await bus.bucket(topology.leases_bucket)

        async def ready() -> bool:
            """Every cluster recorded and the partitions spread evenly: a run that
            starts while replicas still hand partitions over measures the handover."""
            if int((await clusters_kv.status()).values) < size:
                return False
            held: dict[bytes, int] = {}
            for partition in range(partitions):
                try:
                    holder = (await leases_kv.get(f"scheduler.p{partition}")).value
                except Exception:
                    return False
                held[holder] = held.get(holder, 0) + 1
            counts = sorted(held.values())
            return len(counts) == replicas and counts[-1] - counts[0] <= 1

        await _until(ready, startup_timeout, "the scheduler replicas to consume every partition")
        batch = []
        for i in range(objects):
            obj = make_service_object(i, rng)
            batch.append(envelope(obj, key=obj.ref.key, producer="bench", revision=1))
        if profile_dir is not None:
            profile = os.path.join(profile_dir, f"scheduler-{size}-{replicas}.txt")
            spy = _profile(started_replicas[0].proc.pid, profile)
        cpu_before = [_cpu_seconds(r.proc.pid) for r in started_replicas]
        started = time.perf_counter()
        await bus.publish_batch(batch)
        published = time.perf_counter() - started
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=timeout)
        elapsed = time.perf_counter() - started
        cpu = sum(
            _cpu_seconds(r.proc.pid) - before
            for r, before in zip(started_replicas, cpu_before, strict=True)
        )
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        await sub.unsubscribe()
        for replica in started_replicas:
            replica.stop()
        await cache.aclose()
        await bus.close()
    return {
        "replicas": replicas,
        "clusters": size,
        "objects": objects,
        "decided": received,
        "complete": received >= objects,
        "publish_s": round(published, 2),
        "elapsed_s": round(elapsed, 2),
        "decisions_per_s": round(received / elapsed),
        "placed_share": round(placed / max(received, 1), 3),
        "cpu_ms_per_decision": round(cpu * 1000 / max(received, 1), 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **({"profile": profile} if spy is not None else {}),
    }


def _profile(pid: int, output: str) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` (raw collapsed stacks) until it is sent SIGINT."""
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("--profile needs py-spy")
    command = [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
    return subprocess.Popen(
        [*command, "--output", output, "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_service(
    runs: list[tuple[int, int, int]], profile_dir: str | None = None, load: int = 0
) -> list[Any]:
    """(clusters, scheduler processes, objects) per run, each on fresh names; `load`
    busy-looping processes share the machine throughout (other work on the node)."""
    results = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        with NatsServer() as nats_server, RedisServer() as redis_server:
            for run, (size, replicas, objects) in enumerate(runs, start=1):
                result = asyncio.run(
                    _service_run(
                        nats_server.url,
                        redis_server.url,
                        objects,
                        size,
                        replicas,
                        run,
                        profile_dir=profile_dir,
                    )
                )
                results.append({**result, "busy_processes": load})
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per fleet size")
    parser.add_argument("--clusters", type=int, action="append", help="fleet size(s)")
    parser.add_argument(
        "--service",
        action="append",
        metavar="CLUSTERS:PROCESSES:OBJECTS",
        help="one end-to-end service run (default: 10:1:2000, 10:2:2000, 100:1:500)",
    )
    parser.add_argument("--no-service", action="store_true", help="the pure core only")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="N busy-looping processes run beside the service runs (other load)",
    )
    parser.add_argument(
        "--profile", metavar="DIR", help="py-spy the first scheduler process of each run"
    )
    parser.add_argument(
        "--decide-path",
        type=int,
        metavar="OBJECTS",
        default=1000,
        help="objects for the in-process decide-path figure per fleet size (0: skip)",
    )
    args = parser.parse_args()
    sizes = args.clusters or [10, 100, 1000]
    results = [measure(size, args.seconds) for size in sizes]
    document: dict[str, Any] = {
        "benchmark": "scheduler core decisions/s (one core, pure, shared snapshot)",
        "targets": {"100": 5000, "1000": 500},
        "results": results,
    }
    if args.decide_path:
        document["decide_path"] = {
            "benchmark": (
                "CPU per decision of the service's decide path in process, no I/O "
                "(core, claim plan into the read model, record and event encoded)"
            ),
            "results": [measure_decide_path(size, args.decide_path) for size in sizes],
        }
    if not args.no_service:
        runs = [
            (int(a), int(b), int(c))
            for a, b, c in (
                spec.split(":") for spec in args.service or ["10:1:2000", "10:2:2000", "100:1:500"]
            )
        ]
        document["service"] = {
            "benchmark": (
                "scheduler service end to end: publish N ResourceAnalyzed, time until N "
                "PlacementDecided (real NATS + Redis, scheduler as OS processes)"
            ),
            "results": measure_service(runs, args.profile, args.load),
        }
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
