"""Drain and failover of a cluster holding 1,000 placements: the real run, and a
simulation around the pure drain core. Prints one JSON document (progress on stderr).

Not a test. ``.venv/bin/python bench/drain.py [--objects 1000 --members 4 --replicas 2]``
(``--failover`` for a member outage instead of a drain, ``--simulated`` for the core alone).

**Real (the default).** What ``flotilla up`` starts, each a process: nats-server
(JetStream), Redis, a kubesim hub and ``--members`` kubesim members (sized so that
every member fits one pod of every object), and the seven services, configured only
through ``FLOTILLA_*`` variables. The first member (``us-east``) is the one drained.
A ClusterPlacementPolicy splits every Deployment by static weights, 2 for that
cluster and 1 for each other one, so each of the ``--objects`` Deployments (``--replicas``
each, 10m CPU) has one replica there and the rest elsewhere: the cluster holds every
object. They live in one namespace, or round robin in ``--namespaces`` of them (the
transformer keeps, per namespace, the list of objects needing it on each cluster, and
rewrites it for every placement of one of them). Once every Deployment shows its
replicas ready on the hub and the drained Cluster's ``placements`` counts them all,
the measured window starts:

* drain: cordon and drain as ``flotilla drain`` does (``spec.unschedulable`` and
  ``spec.evictAfter`` = now, one merge patch through the CLI's `Hub`); it ends when the
  Cluster shows ``Drained=True`` with ``placements: 0``;
* ``--failover``: an outage of that member through kubesim's fault endpoint (as
  ``flotilla chaos outage`` does), with ``tolerationSeconds`` (``--toleration``) in the
  policy; it ends when the Cluster's ``placements`` is 0. ``seconds_after_toleration``
  counts from the end of the toleration as the coordinator reckons it (the Ready
  condition's lastTransitionTime, which has whole seconds, plus the toleration).

Availability is read from the hub as a user would, but by a *watch* of the hub's
Deployments rather than 100 ms samples: every status the aggregator writes is seen, so
``min_ready_replicas`` is the minimum over every state any object had on the hub
during the window (absolute, and relative to its desired replicas; the floor is
``replicas - maxUnavailable``). Also reported: the coordinator's commands (avoid and
release), every bus event by type (counted from the subjects), Warning Events in the
namespace, and each process's CPU seconds in the window (which service is busiest).
``--profile SERVICE`` attaches py-spy to that service (or ``kubesim-hub``,
``kubesim-us-east``) for the window and reports where its samples fall (py-spy
must be installed; it is not in the lock).

**Simulated (``--simulated``).** The world is simulated, the coordinator's decisions
are real: every object is a split Deployment of 6 replicas (``maxUnavailable`` 25 %,
so a floor of 5), 3 on the drained cluster ``a`` and 3 on one of ``b``..``e``. At t = 0
``a`` is cordoned with ``evictAfter`` = now. The loop does what the service does: plan
(`draining.plan`) every object whose record changed or whose due time came, on a
simulated clock stepped every 50 ms. A stand-in scheduler answers each ``avoid`` after
100 ms by moving ``a``'s share to the two least loaded other clusters (``a`` stays
Retiring) and each ``release`` after 100 ms by dropping ``a``; new replicas become
available one by one, 1-4 s each, as member reports. The drained copy keeps serving
until it is released. Reported: CPU seconds spent in the core (``plan`` and
``cluster_conditions``), the commands issued, simulated seconds until ``a`` is
``Drained`` (placements 0), and the minimum ready replicas of any object during the
run, as a number and relative to its floor. With ``--failover``, ``a`` goes NotReady
at t = 0 with a toleration of 5 s: its copies count as unavailable, and the report is
the seconds from the end of the toleration to ``a`` holding nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import heapq
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import nats
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.cli import environment
from flotilla.cli.hub import Hub, is_true, now_rfc3339
from flotilla.common import builders, events, kube
from flotilla.common.api import (
    CLUSTER_STATUS_ANNOTATION,
    PLACEMENT_ANNOTATION,
    Failover,
    GroupVersionKind,
    PlacementState,
)
from flotilla.common.bus import Bus
from flotilla.common.config import DEFAULT_SYSTEM_NAMESPACE
from flotilla.common.errors import FlotillaError
from flotilla.common.events import ClusterPlacement, ObjectRef
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.topology import Topology
from flotilla.drain import draining
from flotilla.drain.draining import ClusterRecord, Member, ObjectRecord, Timing
from flotilla.scheduler import service as scheduler_service
from flotilla.watcher.watching import Expired, TypeClient

# --- simulated: the pure core in a simulated world -----------------------------------------

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


def simulate(count: int, seed: int, failover: bool) -> dict[str, Any]:
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


# --- the real drain: the seven services as processes ---------------------------------------

NS = "drainbench"
BENCH_LABEL = {"bench": "drainbench"}
"""What the policy selects the benchmark's Deployments by (in every namespace)."""
PREFIX = "drainbench"
ORIGIN_LABEL = "flotilla.io/origin"
PODS_PER_NODE = 110
DEPLOYMENTS = GroupVersionKind("apps", "v1", "Deployment")
CLUSTERS = GroupVersionKind("flotilla.io", "v1alpha1", "Cluster")
CREATE_CONCURRENCY = 16


def say(text: str) -> None:
    """Progress on stderr: stdout carries only the JSON document."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def until(
    probe: Callable[[], Awaitable[Any]], timeout: float, what: str, every: float = 0.5
) -> Any:
    """Call `probe` until it returns something truthy (returned); `TimeoutError` after
    `timeout` seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached after {timeout:.0f}s")
        await asyncio.sleep(every)


def proc_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (field 3 on), [] when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (utime and stime, fields 14 and 15)."""
    fields = proc_fields(pid)
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """VmHWM of `pid` in MiB (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


@dataclass
class Child:
    """A process this benchmark started, and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"


def spawn(name: str, command: list[str], log: Path, env: Mapping[str, str] | None = None) -> Child:
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Child(name, popen, log)


@dataclass
class Fleet:
    """NATS, Redis, a kubesim hub and members, and the seven services, each a process,
    configured as ``flotilla up`` configures them (`flotilla.cli.environment`) but with
    members sized for the run and a private stream and key prefix."""

    state: Path
    members: dict[str, dict[str, str]]
    nodes: int
    heartbeat: float | None
    nats: NatsServer | None = None
    redis: RedisServer | None = None
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def hub_kubeconfig(self) -> Path:
        return self.state / "clusters" / "hub.yaml"

    def kubeconfig(self, name: str) -> Path:
        return self.state / "clusters" / f"{name}.yaml"

    def pids(self) -> dict[str, int]:
        """Every process of the installation by name (services, kubesims, nats, redis)."""
        found = {name: child.pid for name, child in self.children.items()}
        for name, server in (("nats", self.nats), ("redis", self.redis)):
            if server is not None and server.process is not None:
                found[name] = server.process.pid
        return found

    async def start(self) -> None:
        logs = self.state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for data in ("nats", "redis"):
            (self.state / data).mkdir(exist_ok=True)
        self.nats = NatsServer(data_dir=self.state / "nats").start(timeout=30)
        self.redis = RedisServer(data_dir=self.state / "redis").start(timeout=30)
        say(f"starting the kubesim hub and {len(self.members)} members ({self.nodes} nodes each)")
        for name in ("hub", *self.members):
            command = [
                sys.executable, "-m", "flotilla.kubesim", "--name", name, "--port", "0",
                "--kubeconfig", str(self.kubeconfig(name)),
            ]  # fmt: skip
            if name == "hub":
                command.append("--hub")
            else:
                command += ["--nodes", str(self.nodes), "--node-pods", str(PODS_PER_NODE)]
            self.children[f"kubesim-{name}"] = spawn(
                f"kubesim-{name}", command, logs / f"kubesim-{name}.log"
            )
        for name in ("hub", *self.members):
            child = self.children[f"kubesim-{name}"]
            await until(functools.partial(self._announced, child), 90, f"kubesim {name}", 0.1)
        await environment.register(
            self.hub_kubeconfig,
            {name: (self.kubeconfig(name), labels) for name, labels in self.members.items()},
            redis_url=self.redis.url,
            capacity_prefix=f"{PREFIX}:capacity:",
            mark_ready=False,
        )
        say("starting the seven services")
        for service in environment.SERVICES:
            variables = {
                **os.environ,
                "FLOTILLA_NATS_URL": self.nats.url,
                "FLOTILLA_REDIS_URL": self.redis.url,
                "FLOTILLA_HUB_KUBECONFIG": str(self.hub_kubeconfig),
                "FLOTILLA_STREAM_PREFIX": PREFIX,
                "FLOTILLA_CAPACITY_PREFIX": f"{PREFIX}:capacity:",
                "FLOTILLA_PARTITIONS": str(environment.PARTITIONS),
                "FLOTILLA_HEALTH_HOST": "127.0.0.1",
                "FLOTILLA_HEALTH_PORT": "0",
                "FLOTILLA_INSTANCE": f"{service}-0",
                "FLOTILLA_SYSTEM_NAMESPACE": DEFAULT_SYSTEM_NAMESPACE,
            }
            if self.heartbeat is not None:
                variables["FLOTILLA_HEARTBEAT_INTERVAL"] = str(self.heartbeat)
            child = spawn(
                service,
                [sys.executable, "-m", f"flotilla.{service}"],
                logs / f"{service}.log",
                variables,
            )
            self.children[service] = child
        for service in environment.SERVICES:
            child = self.children[service]
            await until(functools.partial(self._ready, child), 240, f"service {service} ready")

    async def _announced(self, child: Child) -> bool:
        self._check_alive(child)
        return "READY" in child.tail(200)

    async def _ready(self, child: Child) -> bool:
        """A service logs ``<name> started`` once its setup is done and it serves."""
        self._check_alive(child)
        return f'"{child.name} started"' in child.tail(400)

    def _check_alive(self, child: Child) -> None:
        if child.popen.poll() is not None:
            raise RuntimeError(f"{child.name} exited during start-up:\n{child.tail()}")

    def stop(self) -> None:
        """Services first, then the clusters, then NATS and Redis."""
        for child in reversed(list(self.children.values())):
            if child.popen.poll() is None:
                child.popen.terminate()
        for child in reversed(list(self.children.values())):
            try:
                child.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
        for server in (self.redis, self.nats):
            if server is not None:
                server.close()


def namespace_of(index: int, namespaces: int) -> str:
    """Object `index`'s namespace: ``drainbench``, or round robin over
    ``drainbench-00``.. when there are several."""
    return NS if namespaces == 1 else f"{NS}-{index % namespaces:02d}"


def deployment(name: str, replicas: int, namespace: str = NS) -> dict[str, Any]:
    obj = builders.deployment(
        name, namespace, replicas=replicas, requests={"cpu": "10m", "memory": "16Mi"}
    )
    obj["metadata"]["labels"] = dict(BENCH_LABEL)
    return obj


def policy(target_labels: Mapping[str, str], toleration: int | None) -> dict[str, Any]:
    """Split by static weights, 2 for the drained cluster and 1 for every other: the
    first replica of each Deployment goes to the drained cluster, the second to another
    (Sainte-Laguë: 2/1.5 < 1/0.5), so that cluster holds every object; once it is
    excluded the others divide the replicas evenly."""
    spec: dict[str, Any] = {
        "resourceSelectors": [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "labelSelector": {"matchLabels": dict(BENCH_LABEL)},
            }
        ],
        "strategy": "split",
        "splitBy": "weights",
        "weights": [
            {"clusterSelector": {"matchLabels": dict(target_labels)}, "weight": 2},
            {"clusterSelector": {}, "weight": 1},
        ],
    }
    if toleration is not None:
        spec["failover"] = {"tolerationSeconds": toleration}
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ClusterPlacementPolicy",
        "metadata": {"name": "drainbench"},
        "spec": spec,
    }


def ready_of(obj: Mapping[str, Any]) -> int:
    value = (obj.get("status") or {}).get("readyReplicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Prober:
    """The hub as a user sees it while the drain runs.

    Rather than sampling every 100 ms it *watches* the hub's Deployments: every status
    the aggregator writes is seen, so the minimum is over every state the hub held, not
    over samples of it. It also follows the drained `Cluster`, timing its milestones."""

    target: str
    replicas: int
    floor: int
    started: float = field(default_factory=time.monotonic)
    ready: dict[str, int] = field(default_factory=dict)
    min_ready: int | None = None
    min_key: str = ""
    below_desired: set[str] = field(default_factory=set)
    below_floor: set[str] = field(default_factory=set)
    below_floor_seen: list[dict[str, Any]] = field(default_factory=list)
    """The first few hub states below the floor, with the per-cluster breakdown the
    aggregator wrote (which copy was missing: not ready, stale, or released)."""
    at_zero: set[str] = field(default_factory=set)
    versions: int = 0
    relists: int = 0
    deficient: set[str] = field(default_factory=set)
    """Objects whose hub ready replicas are below desired right now."""
    placements: list[tuple[float, int]] = field(default_factory=list)
    not_ready_at: float | None = None
    not_ready_since: float | None = None
    """The wall-clock lastTransitionTime of Ready=False, as the coordinator reads it."""
    drained_at: float | None = None
    empty_at: float | None = None
    empty_wall: float | None = None
    whole_again_at: float | None = None

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def deployment(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        metadata = obj.get("metadata") or {}
        name = f"{metadata.get('namespace')}/{metadata.get('name')}"
        if deleted:
            return
        ready = ready_of(obj)
        desired = (obj.get("spec") or {}).get("replicas", self.replicas)
        self.versions += 1
        self.ready[name] = ready
        if self.min_ready is None or ready < self.min_ready:
            self.min_ready, self.min_key = ready, name
        if ready < desired:
            self.below_desired.add(name)
            self.deficient.add(name)
        else:
            self.deficient.discard(name)
        if ready < self.floor:
            self.below_floor.add(name)
            if len(self.below_floor_seen) < 5:
                annotations = metadata.get("annotations") or {}
                self.below_floor_seen.append(
                    {
                        "object": name,
                        "at": self.elapsed(),
                        "ready": ready,
                        "resource_version": metadata.get("resourceVersion"),
                        "placement": annotations.get(PLACEMENT_ANNOTATION),
                        "cluster_status": annotations.get(CLUSTER_STATUS_ANNOTATION),
                    }
                )
        if ready == 0:
            self.at_zero.add(name)
        if (
            not self.deficient
            and self.whole_again_at is None
            and (self.drained_at is not None or self.empty_at is not None)
        ):
            self.whole_again_at = self.elapsed()

    def cluster(self, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.target:
            return
        status = obj.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        placements = status.get("placements")
        if isinstance(placements, int) and (
            not self.placements or self.placements[-1][1] != placements
        ):
            self.placements.append((self.elapsed(), placements))
        ready = conditions.get("Ready") or {}
        if ready.get("status") != "True" and self.not_ready_at is None:
            self.not_ready_at = self.elapsed()
            self.not_ready_since = parse_time(ready.get("lastTransitionTime"))
        drained = (conditions.get("Drained") or {}).get("status") == "True"
        if drained and placements == 0 and self.drained_at is None:
            self.drained_at = self.elapsed()
        if placements == 0 and self.empty_at is None:
            self.empty_at, self.empty_wall = self.elapsed(), time.time()
        if not self.deficient and self.whole_again_at is None and self.empty_at is not None:
            self.whole_again_at = self.elapsed()

    def moved(self, share: float) -> float | None:
        """Seconds until at most (1 - share) of the first count were left."""
        if not self.placements:
            return None
        first = self.placements[0][1]
        return next((t for t, n in self.placements if n <= first * (1 - share)), None)


async def follow(
    client: TypeClient,
    on_change: Callable[[Mapping[str, Any]], None],
    prober: Prober,
    position: str,
) -> None:
    """List-then-watch `client`'s type for ever, feeding every object to `on_change`."""
    while True:
        try:
            if not position:
                items, position = await client.list()
                prober.relists += 1
                for item in items:
                    on_change(item)
            async for event in client.watch(position):
                if event.type in ("ADDED", "MODIFIED"):
                    on_change(event.object)
                position = event.resource_version or position
        except Expired:
            position = ""
        except (FlotillaError, aiohttp.ClientError, OSError) as exc:
            say(f"watch of {client.gvk.kind} broke ({exc}); again")
            await asyncio.sleep(0.5)


@dataclass
class BusCounter:
    """Every event on the bus during the measured window, by type (from the subject:
    ``<prefix>.events.<Type>.<partition>``); the coordinator's commands by kind."""

    counting: bool = False
    by_type: Counter[str] = field(default_factory=Counter)
    commands: Counter[str] = field(default_factory=Counter)

    async def on_message(self, msg: Msg) -> None:
        if not self.counting:
            return
        kind = msg.subject.split(".")[2]
        self.by_type[kind] += 1
        if kind == "RescheduleRequested":
            with contextlib.suppress(Exception):
                envelope = events.decode(msg.data)
                payload = envelope.payload
                assert isinstance(payload, events.RescheduleRequested)
                if payload.avoid_clusters:
                    self.commands["avoid"] += 1
                if payload.release_retiring:
                    self.commands["release"] += 1
                if not payload.avoid_clusters and not payload.release_retiring:
                    self.commands[f"requeue by {envelope.producer.split('-')[0]}"] += 1


@dataclass
class Profile:
    """py-spy attached to one service for the measured window (raw collapsed stacks)."""

    service: str
    output: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, pid: int) -> None:
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
            "py-spy"
        )
        if spy is None:
            raise RuntimeError("--profile needs py-spy (e.g. `uv pip install py-spy`)")
        command = [spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw"]
        command += ["--output", str(self.output), "--nonblocking"]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> dict[str, Any]:
        if self.process is None:
            return {}
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return summarize_profile(self.service, self.output)


FLOTILLA_PACKAGES = frozenset({"common", "kubesim", "cli", *environment.SERVICES})
"""py-spy names a frame's file relative to its import root: ``common/store.py``."""


def summarize_profile(service: str, path: Path, top: int = 12) -> dict[str, Any]:
    """Where the samples fall: by own time (the innermost frame); for the service's own
    package, inclusive (anywhere on the stack); and as hot paths, each innermost frame
    with the innermost Flotilla frame above it (who asked for that work)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"service": service, "error": f"no profile written to {path}"}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [short_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += count
        ours = [f for f in frames if is_flotilla(f)]
        package = service.partition("-")[0]  # kubesim-hub: the kubesim package
        for frame in dict.fromkeys(f for f in ours if package_of(f) == package):
            if "__main__" not in frame:
                inclusive[frame] += count
        caller = next((f for f in reversed(ours[:-1] if ours[-1:] == frames[-1:] else ours)), "")
        paths[f"{frames[-1]} <- {caller or '-'}"] += count

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[name, round(100 * n / max(total, 1), 1)] for name, n in counter.most_common(top)]

    return {
        "service": service,
        "samples": total,
        "own_percent": share(own),
        "service_inclusive_percent": share(inclusive),
        "hot_paths_percent": share(paths),
        "raw": str(path),
    }


def short_frame(frame: str) -> str:
    """``func (package/module.py:12)`` → ``func (package/module.py)``: lines merged."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"


def package_of(frame: str) -> str:
    return frame.rpartition(" (")[2].split("/", 1)[0]


def is_flotilla(frame: str) -> bool:
    return package_of(frame) in FLOTILLA_PACKAGES


async def scheduler_sees_ready(url: str, names: Sequence[str]) -> bool:
    """Whether the scheduler's own view of the clusters has every member Ready."""
    bus = await Bus.connect(
        url,
        topology=Topology(prefix=PREFIX, partitions=environment.PARTITIONS),
        producer="drainbench",
        ensure=False,
    )
    try:
        return await scheduler_service.sees_ready(bus, names)
    finally:
        await bus.close()


async def outage(kubeconfig: Path, down: bool) -> None:
    """kubesim's fault endpoint, as ``flotilla chaos outage`` calls it."""
    await environment.set_outage(kubeconfig, down=down)


async def flotilla_objects_on(kubeconfig: Path) -> int:
    return len(await flotilla_deployments_on(kubeconfig))


async def flotilla_deployments_on(kubeconfig: Path) -> list[str]:
    """namespace/name of the Deployments Flotilla put on a member."""
    client = await kube.client_from_kubeconfig(kubeconfig)
    async with client:
        listed = await k8s.AppsV1Api(client).list_deployment_for_all_namespaces(
            label_selector=ORIGIN_LABEL
        )
        return sorted(f"{d.metadata.namespace}/{d.metadata.name}" for d in listed.items)


@dataclass(frozen=True)
class RealOptions:
    objects: int
    members: int
    replicas: int
    namespaces: int
    failover: bool
    toleration: int
    timeout: float
    heartbeat: float | None
    profile: str | None
    state: Path


async def run_real(opts: RealOptions) -> dict[str, Any]:
    members = environment.member_labels(opts.members)
    target = next(iter(members))
    # Twice the pods a member ends up with: in a burst the scheduler counts its own
    # reservations until the syncer's next capacity record takes the pods in.
    nodes = max(3, math.ceil(opts.objects * 2 / PODS_PER_NODE) + 1)
    fleet = Fleet(opts.state, members, nodes, opts.heartbeat)
    started = time.monotonic()
    try:
        await fleet.start()
        say(f"installation up in {time.monotonic() - started:.0f}s")
        return await measure(fleet, opts, target)
    finally:
        fleet.stop()


async def measure(fleet: Fleet, opts: RealOptions, target: str) -> dict[str, Any]:
    assert fleet.nats is not None
    api = await kube.client_from_kubeconfig(fleet.hub_kubeconfig)
    nc = await nats.connect(fleet.nats.url)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with api, DynamicClient(api) as dyn:
            hub = Hub(api, dyn)

            async def every_member_ready() -> bool:
                found = [is_true(await hub.cluster(n), "Ready") for n in fleet.members]
                return all(found)

            await until(every_member_ready, 180, "every member Ready on the hub")
            await until(
                functools.partial(scheduler_sees_ready, fleet.nats.url, list(fleet.members)),
                180,
                "the scheduler seeing every member Ready",
            )
            placed_at = time.monotonic()
            await place(hub, api, opts, fleet, target)
            seconds_to_place = round(time.monotonic() - placed_at, 1)
            say(f"{opts.objects} Deployments ready on the hub in {seconds_to_place}s")

            floor = draining.floor(deployment("x", opts.replicas), opts.replicas, [])
            prober = Prober(target=target, replicas=opts.replicas, floor=floor)
            deployments = TypeClient(api, "/apis/apps/v1/deployments", DEPLOYMENTS)
            clusters = TypeClient(api, "/apis/flotilla.io/v1alpha1/clusters", CLUSTERS)
            items, position = await deployments.list()
            for item in items:
                prober.deployment(item)
            counter = BusCounter()
            await nc.subscribe(f"{PREFIX}.events.>", cb=counter.on_message)
            await nc.flush()
            tasks.append(
                asyncio.create_task(follow(deployments, prober.deployment, prober, position))
            )
            listed, cluster_position = await clusters.list()
            tasks.append(
                asyncio.create_task(follow(clusters, prober.cluster, prober, cluster_position))
            )
            pids = fleet.pids()
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            profile = None
            if opts.profile:
                profile = Profile(opts.profile, opts.state / f"profile-{opts.profile}.txt")
                profile.start(pids[opts.profile])

            # The measured window starts here.
            prober.started = time.monotonic()
            prober.min_ready, prober.min_key = None, ""
            prober.below_desired.clear()
            counter.counting = True
            outage_wall = time.time()
            if opts.failover:
                say(f"outage of {target} (toleration {opts.toleration}s)")
                await outage(fleet.kubeconfig(target), True)
            else:
                say(f"draining {target}")
                await hub.patch_cluster(
                    target, {"unschedulable": True, "evictAfter": now_rfc3339()}
                )
            for item in listed:
                prober.cluster(item)

            def done() -> bool:
                return (prober.empty_at if opts.failover else prober.drained_at) is not None

            last_said = -1
            deadline = time.monotonic() + opts.timeout
            while not done():
                if time.monotonic() > deadline:
                    break
                left = prober.placements[-1][1] if prober.placements else -1
                if left != last_said:
                    say(f"  {prober.elapsed():6.1f}s  placements left on {target}: {left}")
                    last_said = left
                await asyncio.sleep(0.25)
            finished = prober.elapsed()
            cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            profiled = profile.stop() if profile is not None else None

            # After the milestone: the hub whole again, the member emptied.
            member_empty: float | None = None
            left_on_member: list[str] = []
            with contextlib.suppress(TimeoutError):

                async def whole() -> bool:
                    return prober.whole_again_at is not None

                await until(whole, 60, "every object at its desired ready replicas again")
            if not opts.failover and prober.drained_at is not None:
                with contextlib.suppress(TimeoutError):

                    async def empty() -> bool:
                        return await flotilla_objects_on(fleet.kubeconfig(target)) == 0

                    await until(empty, 60, f"no Flotilla objects on {target}")
                    member_empty = prober.elapsed()
                if member_empty is None:
                    left_on_member = await flotilla_deployments_on(fleet.kubeconfig(target))
            counter.counting = False
            warnings = Counter(
                f"{e.type}/{e.reason}"
                for e in (await k8s.CoreV1Api(api).list_event_for_all_namespaces()).items
                if e.type == "Warning"
            )
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await nc.close()

    rss = {name: peak_rss_mib(pid) for name, pid in pids.items()}
    result: dict[str, Any] = {
        "benchmark": (
            "failover of a member in outage" if opts.failover else "drain of a cordoned cluster"
        )
        + ", seven services as processes over real NATS, Redis and kubesim",
        "mode": "real",
        "objects": opts.objects,
        "members": opts.members,
        "replicas_per_object": opts.replicas,
        "namespaces": opts.namespaces,
        "floor_per_object": floor,
        "nodes_per_member": fleet.nodes,
        "cluster": target,
        "placements_at_start": prober.placements[0][1] if prober.placements else None,
        "seconds_to_place_all": seconds_to_place,
        "seconds_measured": finished,
        "timed_out": not (prober.empty_at if opts.failover else prober.drained_at),
    }
    if opts.failover:
        toleration_end = (
            prober.not_ready_since + opts.toleration if prober.not_ready_since else None
        )
        result.update(
            {
                "toleration_seconds": opts.toleration,
                "seconds_outage_to_not_ready": prober.not_ready_at,
                "seconds_outage_to_empty": prober.empty_at,
                "seconds_after_toleration": (
                    round(prober.empty_wall - toleration_end, 2)
                    if prober.empty_wall is not None and toleration_end is not None
                    else None
                ),
                "toleration_end_seconds_after_outage": (
                    round(toleration_end - outage_wall, 2) if toleration_end else None
                ),
            }
        )
    else:
        result.update(
            {
                "seconds_to_drained": prober.drained_at,
                "seconds_to_half_moved": prober.moved(0.5),
                "seconds_to_90_percent_moved": prober.moved(0.9),
                "seconds_to_member_empty": member_empty,
                "left_on_member": left_on_member[:10],
                "left_on_member_count": len(left_on_member),
            }
        )
    result.update(
        {
            "seconds_to_every_object_whole_again": prober.whole_again_at,
            "min_ready_replicas": prober.min_ready,
            "min_ready_fraction_of_desired": (
                round(prober.min_ready / opts.replicas, 3) if prober.min_ready is not None else None
            ),
            "min_ready_object": prober.min_key,
            "objects_ever_below_desired": len(prober.below_desired),
            "objects_ever_below_floor": len(prober.below_floor),
            "below_floor_seen": prober.below_floor_seen,
            "objects_ever_at_zero": len(prober.at_zero),
            "hub_versions_seen": prober.versions,
            "prober_relists": prober.relists,
            "commands": dict(counter.commands),
            "bus_events": dict(sorted(counter.by_type.items())),
            "hub_warning_events": dict(warnings),
            "cpu_seconds_in_window": {
                name: round(cpu_after[name] - cpu_before[name], 1)
                for name in sorted(pids, key=lambda n: cpu_before[n] - cpu_after[n])
            },
            "peak_rss_mib": rss,
            "goals": {
                "seconds_to_drained": 30,
                "min_ready_replicas": "never 0",
                **({"seconds_after_toleration": 10} if opts.failover else {}),
            },
        }
    )
    if profiled is not None:
        result["profile"] = profiled
    return result


async def place(hub: Hub, api: ApiClient, opts: RealOptions, fleet: Fleet, target: str) -> None:
    """The namespace, the policy and the Deployments; back once every object is ready
    on the hub and the drained cluster holds every one of them."""
    for index in range(min(opts.namespaces, opts.objects)):
        name = namespace_of(index, opts.namespaces)
        await hub.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    toleration = opts.toleration if opts.failover else None
    await hub.apply(policy(fleet.members[target], toleration))
    apps = k8s.AppsV1Api(api)
    deployments = TypeClient(api, "/apis/apps/v1/deployments", DEPLOYMENTS)
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(index: int) -> None:
        async with gate:
            namespace = namespace_of(index, opts.namespaces)
            body = deployment(f"web-{index:05d}", opts.replicas, namespace)
            await apps.create_namespaced_deployment(namespace, body)  # type: ignore[arg-type]

    say(f"creating {opts.objects} Deployments of {opts.replicas} replicas")
    await asyncio.gather(*(create(i) for i in range(opts.objects)))
    said = ""

    settled: tuple[int, float] = (-1, time.monotonic())

    async def all_ready() -> bool:
        """Every object ready on the hub, and the drained cluster holding all of them
        or (if some went elsewhere when it looked full) the same number for 15 s."""
        nonlocal said, settled
        items, _ = await deployments.list()
        ready = sum(1 for d in items if ready_of(d) >= opts.replicas)
        status = (await hub.cluster(target)).get("status") or {}
        line = (
            f"  ready on the hub: {ready}/{opts.objects}; on {target}: {status.get('placements')}"
        )
        if line != said:
            say(line)
            said = line
        placements = status.get("placements")
        if not isinstance(placements, int) or placements != settled[0]:
            settled = (placements if isinstance(placements, int) else -1, time.monotonic())
        steady = time.monotonic() - settled[1] > 15
        return ready == opts.objects and (placements == opts.objects or steady)

    await until(all_ready, max(300.0, opts.objects * 0.9), "every Deployment ready and placed", 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--simulated", action="store_true", help="the pure core, simulated")
    parser.add_argument("--failover", action="store_true", help="a member outage, not a drain")
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--members", type=int, default=4, help="real: member clusters")
    parser.add_argument("--replicas", type=int, default=2, help="real: replicas per object")
    parser.add_argument(
        "--namespaces", type=int, default=1, help="real: namespaces the objects spread over"
    )
    parser.add_argument("--toleration", type=int, default=5, help="real: tolerationSeconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="real: seconds to wait")
    parser.add_argument(
        "--heartbeat", type=float, default=None, help="real: the syncer's heartbeat (seconds)"
    )
    parser.add_argument(
        "--profile",
        choices=(*environment.SERVICES, "kubesim-hub", "kubesim-us-east"),
        default=None,
        help="real: py-spy a service (or the hub's or the drained member's kubesim)",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="real: logs go here")
    parser.add_argument("--seed", type=int, default=1, help="simulated: the world's seed")
    args = parser.parse_args()
    if args.simulated:
        print(json.dumps(simulate(args.objects, args.seed, args.failover), indent=2))
        return
    if args.members < 2 or args.objects < 1 or args.replicas < 2 or args.namespaces < 1:
        parser.error(
            "a real run needs --members >= 2, --objects >= 1, --replicas >= 2, --namespaces >= 1"
        )
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="drainbench-"))
    state.mkdir(parents=True, exist_ok=True)
    options = RealOptions(
        objects=args.objects,
        members=args.members,
        replicas=args.replicas,
        namespaces=args.namespaces,
        failover=args.failover,
        toleration=args.toleration,
        timeout=args.timeout,
        heartbeat=args.heartbeat,
        profile=args.profile,
        state=state,
    )
    # SIGTERM unwinds like Ctrl-C, so the installation's processes are stopped too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result = asyncio.run(run_real(options))
    result["state_dir"] = str(state)
    for data in ("nats", "redis"):
        shutil.rmtree(state / data, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
