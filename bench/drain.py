"""A drain of a cluster holding 1,000 placements, simulated around the pure drain core.

Not a test: it prints one JSON document. Run with ``.venv/bin/python bench/drain.py``
(``--objects 1000 --seed 1``, ``--failover`` for a failover run instead of a drain).

The world is simulated, the coordinator's decisions are real: every object is a
split Deployment of 6 replicas (``maxUnavailable`` 25 %, so a floor of 5), 3 on the
drained cluster ``a`` and 3 on one of ``b``..``e``. At t = 0 ``a`` is cordoned with
``evictAfter`` = now. The loop does what the service does: plan (`draining.plan`)
every object whose record changed or whose due time came, on a simulated clock
stepped every 50 ms. A stand-in scheduler answers each ``avoid`` after 100 ms by
moving ``a``'s share to the two least loaded other clusters (``a`` stays Retiring)
and each ``release`` after 100 ms by dropping ``a``; new replicas become available
one by one, 1-4 s each, as member reports. The drained copy keeps serving until
it is released.

Reported: CPU seconds spent in the core (``plan`` and ``cluster_conditions``), the
commands issued, simulated seconds until ``a`` is ``Drained`` (placements 0), and the
minimum ready replicas of any object during the run, as a number and relative to
its floor (must never be below the floor, never zero). With ``--failover``, ``a``
goes NotReady at t = 0 with a toleration of 5 s: its copies count as unavailable,
and the report is the seconds from the end of the toleration to ``a`` holding nothing.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.common.api import Failover, PlacementState
from flotilla.common.events import ClusterPlacement, ObjectRef
from flotilla.drain import draining
from flotilla.drain.draining import ClusterRecord, Member, ObjectRecord, Timing

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STEP = 0.05
LATENCY = 0.1
OTHERS = ("b", "c", "d", "e")
REPLICAS = 6


@dataclass
class World:
    """Where every copy runs and how many of its replicas are available."""

    rng: random.Random
    records: dict[str, ObjectRecord]
    available: dict[tuple[str, str], int] = field(default_factory=dict)
    load: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OTHERS, 0))
    queue: list[tuple[float, int, str, str, str]] = field(default_factory=list)
    """(time, seq, kind, key, cluster): what happens in the world, in time order."""
    seq: int = 0
    clock: float = 0.0
    """The simulated time of the event being applied."""

    def at(self, when: float, kind: str, key: str, cluster: str) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, self.seq, kind, key, cluster))

    def ready(self, record: ObjectRecord, dead: set[str]) -> int:
        return sum(
            self.available.get((record.key, p.cluster), 0)
            for p in record.clusters
            if p.cluster not in dead
        )


def objects(count: int) -> dict[str, ObjectRecord]:
    found = {}
    for i in range(count):
        ref = ObjectRef(api_version="apps/v1", kind="Deployment", name=f"web-{i}", namespace="n")
        other = OTHERS[i % len(OTHERS)]
        found[ref.key] = ObjectRecord(
            key=ref.key,
            ref=ref,
            clusters=[
                ClusterPlacement(cluster="a", replicas=3),
                ClusterPlacement(cluster=other, replicas=3),
            ],
            replicas=REPLICAS,
            floor=draining.floor({"spec": {}}, REPLICAS, []),
            split=True,
            failover=Failover(toleration_seconds=5),
            members={c: Member(ready=True, available=3) for c in ("a", other)},
        )
    return found


def run(count: int, seed: int, failover: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    world = World(rng, objects(count))
    for key, record in world.records.items():
        for placed in record.clusters:
            world.available[(key, placed.cluster)] = 3
            if placed.cluster != "a":
                world.load[placed.cluster] += 3
    if failover:
        a = ClusterRecord(name="a", ready=False, since=T0)
    else:
        a = ClusterRecord(name="a", unschedulable=True, evict_after=T0)
    clusters = {"a": a, **{c: ClusterRecord(name=c) for c in OTHERS}}
    dead = {"a"} if failover else set()
    timing = Timing(timeout=120, stuck_after=5, retry=30)
    due: dict[str, datetime] = {}
    dirty = set(world.records)
    core_seconds = 0.0
    commands = {"avoid": 0, "release": 0}
    floor_margin = min_ready = REPLICAS
    drained_at: float | None = None
    now_s = 0.0
    while now_s < 600:
        now = T0 + timedelta(seconds=now_s)
        while world.queue and world.queue[0][0] <= now_s:
            world.clock, _, kind, key, cluster = heapq.heappop(world.queue)
            apply_world(world, kind, key, cluster)
            dirty.add(key)
        keys = dirty | {k for k, t in due.items() if t <= now}
        dirty = set()
        started = time.process_time()
        for key in keys:
            result = draining.plan(world.records[key], clusters, now, timing)
            world.records[key] = result.record
            if result.next_at is None:
                due.pop(key, None)
            else:
                due[key] = result.next_at
            for command in result.commands:
                commands[command.kind] = commands.get(command.kind, 0) + 1
                world.at(now_s + LATENCY, command.kind, key, command.cluster)
        on_a = [r for r in world.records.values() if r.on("a") is not None]
        draining.cluster_conditions(clusters["a"], on_a, {}, now)
        core_seconds += time.process_time() - started
        for record in world.records.values():
            ready = world.ready(record, dead)
            min_ready = min(min_ready, ready)
            floor_margin = min(floor_margin, ready - record.floor)
        if not on_a:
            drained_at = now_s
            break
        now_s = round(now_s + STEP, 3)
    toleration = 5.0 if failover else 0.0
    return {
        "benchmark": "drain coordinator core, simulated drain"
        + (" (failover)" if failover else ""),
        "objects": count,
        "core_cpu_seconds": round(core_seconds, 3),
        "commands": commands,
        "seconds_to_drained": drained_at,
        "seconds_after_toleration": (
            round(drained_at - toleration, 2) if failover and drained_at is not None else None
        ),
        "min_ready_replicas": min_ready,
        "min_ready_minus_floor": floor_margin,
        "goals": {"seconds_to_drained": 30, "min_ready_replicas": "> 0 and >= floor (drain)"},
    }


def apply_world(world: World, kind: str, key: str, cluster: str) -> None:
    """The stand-in scheduler, syncer and members."""
    record = world.records[key]
    if kind == "avoid":
        placed = record.on(cluster)
        if placed is None or placed.state is PlacementState.RETIRING:
            return
        share = placed.replicas or 0
        targets = sorted((c for c in OTHERS if c != cluster), key=lambda c: (world.load[c], c))[:2]
        extra = {targets[0]: share - share // 2, targets[1]: share // 2}
        clusters = []
        for p in record.clusters:
            if p.cluster == cluster:
                continue
            clusters.append(
                p.model_copy(update={"replicas": (p.replicas or 0) + extra.pop(p.cluster, 0)})
            )
        clusters += [ClusterPlacement(cluster=c, replicas=n) for c, n in extra.items()]
        clusters.append(placed.model_copy(update={"state": PlacementState.RETIRING}))
        for target, n in {targets[0]: share - share // 2, targets[1]: share // 2}.items():
            world.load[target] += n
            delay = 0.0
            for _ in range(n):
                delay += world.rng.uniform(1.0, 4.0)
                world.at(world.clock + delay, "replica", key, target)
        members = dict(record.members)
        for p in clusters:
            if p.state is PlacementState.ACTIVE:
                have = world.available.get((key, p.cluster), 0)
                members[p.cluster] = Member(ready=have >= (p.replicas or 0), available=have)
        world.records[key] = record.model_copy(update={"clusters": clusters, "members": members})
    elif kind == "release":
        clusters = [
            p
            for p in record.clusters
            if not (p.cluster == cluster and p.state is PlacementState.RETIRING)
        ]
        world.available.pop((key, cluster), None)
        world.records[key] = record.model_copy(update={"clusters": clusters})
    elif kind == "replica":
        have = world.available.get((key, cluster), 0) + 1
        world.available[(key, cluster)] = have
        placed = record.on(cluster)
        wanted = placed.replicas or 0 if placed else 0
        members = {**record.members, cluster: Member(ready=have >= wanted, available=have)}
        world.records[key] = record.model_copy(update={"members": members})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--failover", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.objects, args.seed, args.failover), indent=2))


if __name__ == "__main__":
    main()
