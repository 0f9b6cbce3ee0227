"""The whole pipeline: hub create -> applied on a member, throughput and latency.

Not a test: it prints one JSON document. Starts real NATS JetStream and Redis, a
kubesim hub with the Flotilla CRDs and `--members` simulated member clusters (all
in this process, so one clock and store listeners time every commit), registers
each member on the hub (kubeconfig Secret + `Cluster`) and starts the seven
services as real processes (``python -m flotilla.<service>``), configured only
through ``FLOTILLA_*`` variables as in production. Once every member is Ready, the
scheduler sees them so and a warm-up Deployment has gone all the way through, two
phases create one-replica Deployments on the hub (HTTP, as a user would), round
robin over `--namespaces` namespaces (default 1: every object of a namespace needs
its Namespace on its member, so the transformer's bookkeeping of that shared
dependency grows with the objects in it):

- ``paced``: `--objects` Deployments offered at `--rate` per second (open loop: a
  slow create does not delay the next); its latencies are the figures "at N
  objects/s offered" (``--rate 0`` skips it);
- ``burst``: `--objects` Deployments created as fast as the hub takes them
  (``--no-burst`` skips it); ``objectsPerSecond`` = applied / (last applied -
  first created) is the end-to-end throughput.

An object is *created* when the hub's store commits it and *applied* when the
first member's store commits its copy (store listeners in this process). Between
the two, each stage's time is read off the bus: the ``produced_at`` of the first
``ResourceObserved`` (watcher), ``ResourceAnalyzed`` (dependency detector),
``PlacementDecided`` (scheduler) and the Deployment's ``WorkRendered`` (transformer);
the syncer's stage ends at the apply. A stage's time includes the wait for the
previous event to reach it (bus transit, queueing), so ``stageShare`` says where
the time goes, not which code is slow; ``cpuSeconds`` (per service process, and
``bench`` for this process with the hub and the members) says who burns the CPU.
Everything shares this machine's cores.

    .venv/bin/python bench/pipeline.py [--objects 5000 --members 20 --rate 50]

The service pids are printed to stderr at start, for ``py-spy record --pid``;
``BENCH_KEEP_LOGS=<dir>`` keeps the services' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from nats.aio.msg import Msg

from flotilla.cli.environment import member_labels, member_objects
from flotilla.common import events, kube
from flotilla.common.bus import Bus
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.testing import CRD_DIR
from flotilla.common.topology import Topology
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.scheduler import service as scheduler_service

SYSTEM = "flotilla-system"
NS_PREFIX = "bench-"
PREFIX = "benchpipe"
PARTITIONS = 16
SERVICES = ("watcher", "depdetector", "scheduler", "transformer", "syncer", "aggregator", "drain")
STAGES = ("watcher", "depdetector", "scheduler", "transformer", "syncer")
EVENT_OF_STAGE = {
    "ResourceObserved": "watcher",
    "ResourceAnalyzed": "depdetector",
    "PlacementDecided": "scheduler",
    "WorkRendered": "transformer",
}
PODS_PER_NODE = 110
CREATE_CONCURRENCY = 32
"""Burst creates in flight at once (the hub answers each in about a millisecond)."""


def deployment(namespace: str, name: str) -> dict[str, Any]:
    container = {
        "name": "app",
        "image": "registry.example.com/app:1",
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "pipeline"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]},
            },
        },
    }


def key_of(namespace: str, name: str) -> str:
    return f"apps/v1/Deployment/{namespace}/{name}"


def objects_of(phase: str, count: int, namespaces: int) -> list[tuple[str, str]]:
    """(namespace, name) of a phase's Deployments, round robin over the namespaces."""
    return [(f"{NS_PREFIX}{i % namespaces}", f"{phase}{i:05d}") for i in range(count)]


def mine(obj: Any) -> str | None:
    """The key of a bench Deployment (None: not one)."""
    metadata = obj["metadata"]
    namespace = metadata.get("namespace") or ""
    return key_of(namespace, metadata["name"]) if namespace.startswith(NS_PREFIX) else None


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Recorder:
    """When each object was created on the hub, applied on a member, and what the bus said."""

    created: dict[str, float] = field(default_factory=dict)
    applied: dict[str, float] = field(default_factory=dict)
    raw: list[bytes] = field(default_factory=list)
    """Bus messages of the stages' event types, decoded after the run (decoding them
    live would take CPU from the hub and members in this process)."""

    def on_hub(self, event: Any) -> None:
        if event.type == "ADDED" and (key := mine(event.object)):
            self.created.setdefault(key, time.time())

    def on_member(self, event: Any) -> None:
        if event.type == "ADDED" and (key := mine(event.object)):
            self.applied.setdefault(key, time.time())

    async def on_message(self, msg: Msg) -> None:
        self.raw.append(msg.data)

    def stage_times(self) -> dict[str, dict[str, float]]:
        """key -> stage -> the earliest ``produced_at`` of that stage's event (epoch s)."""
        found: dict[str, dict[str, float]] = {}
        for data in self.raw:
            envelope = events.decode(data)
            payload = envelope.payload
            stage = EVENT_OF_STAGE.get(payload.type)
            if stage is None:
                continue
            if isinstance(payload, events.WorkRendered):
                if payload.manifest is None or payload.ref.kind != "Deployment":
                    continue
                key = payload.ref.key
            else:
                key = envelope.key
            at = envelope.produced_at.timestamp()
            times = found.setdefault(key, {})
            times[stage] = min(times.get(stage, at), at)
        return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Pipeline:
    """The running installation: hub, members, services, and the bench's hub client."""

    def __init__(self, hub: KubeSim, members: list[KubeSim], folder: Path) -> None:
        self.hub = hub
        self.members = members
        self.folder = folder
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.session: aiohttp.ClientSession

    def cpu(self) -> dict[str, float]:
        used = {name: cpu_seconds(p.pid) for name, p in self.processes.items()}
        return {**used, "bench": own_cpu_seconds()}

    async def create(self, namespace: str, name: str) -> None:
        url = f"{self.hub.url}/apis/apps/v1/namespaces/{namespace}/deployments"
        for attempt in range(5):
            async with self.session.post(url, json=deployment(namespace, name)) as response:
                if response.status == 201:
                    return
                text = await response.text()
                if response.status < 500 and response.status != 429:
                    raise SystemExit(f"creating {name}: {response.status} {text}")
            await asyncio.sleep(0.1 * (attempt + 1))
        raise SystemExit(f"creating {name}: the hub kept answering {response.status}")


async def register(api: Any, member: KubeSim, labels: dict[str, str]) -> None:
    secret, cluster = member_objects(member.name, labels, json.dumps(member.kubeconfig()), SYSTEM)
    await k8s.CoreV1Api(api).create_namespaced_secret(SYSTEM, secret)
    await k8s.CustomObjectsApi(api).create_cluster_custom_object(
        "flotilla.io", "v1alpha1", "clusters", cluster
    )


async def ready_on_hub(api: Any) -> int:
    listed = await k8s.CustomObjectsApi(api).list_cluster_custom_object(
        "flotilla.io", "v1alpha1", "clusters"
    )
    return sum(
        1
        for item in listed["items"]
        for condition in (item.get("status") or {}).get("conditions") or []
        if condition["type"] == "Ready" and condition["status"] == "True"
    )


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def settle(recorder: Recorder, keys: set[str], timeout: float) -> bool:
    """Wait until every key is applied (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while not keys <= recorder.applied.keys():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def paced(pipeline: Pipeline, names: list[tuple[str, str]], rate: float) -> float:
    """Create `names` at `rate` per second, open loop; returns the rate achieved."""
    started = time.time()
    tasks: list[asyncio.Task[None]] = []
    for i, (namespace, name) in enumerate(names):
        due = started + i / rate
        await asyncio.sleep(max(due - time.time(), 0.0))
        tasks.append(asyncio.create_task(pipeline.create(namespace, name)))
    await asyncio.gather(*tasks)
    return len(names) / max(time.time() - started, 1e-9)


async def burst(pipeline: Pipeline, names: list[tuple[str, str]]) -> float:
    started = time.time()
    queue = iter(names)

    async def worker() -> None:
        for namespace, name in queue:
            await pipeline.create(namespace, name)

    await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))
    return len(names) / max(time.time() - started, 1e-9)


def report(
    recorder: Recorder,
    keys: list[str],
    offered: float,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    complete: bool,
) -> dict[str, Any]:
    created = {k: recorder.created[k] for k in keys if k in recorder.created}
    applied = {k: recorder.applied[k] for k in keys if k in recorder.applied and k in created}
    latencies = [(applied[k] - created[k]) * 1000 for k in applied]
    out: dict[str, Any] = {
        "objects": len(keys),
        "applied": len(applied),
        "complete": complete,
        "offeredPerSecond": round(offered, 1),
    }
    if not latencies:
        return out
    first, last = min(created.values()), max(applied.values())
    out["objectsPerSecond"] = round(len(applied) / max(last - first, 1e-9), 1)
    out["latencyP50Ms"] = round(statistics.median(latencies), 1)
    out["latencyP99Ms"] = round(percentile(latencies, 0.99), 1)
    out["latencyMaxMs"] = round(max(latencies), 1)
    times = recorder.stage_times()
    spent = dict.fromkeys(STAGES, 0.0)
    traced = 0
    for key in applied:
        marks = times.get(key, {})
        if not all(stage in marks for stage in STAGES[:-1]):
            continue
        traced += 1
        points = [created[key], *(marks[s] for s in STAGES[:-1]), applied[key]]
        for stage, (start, end) in zip(STAGES, itertools.pairwise(points), strict=True):
            spent[stage] += max(end - start, 0.0)
    total = sum(spent.values())
    if traced:
        out["stageShare"] = {s: round(spent[s] / total, 3) for s in STAGES}
        out["stageMeanMs"] = {s: round(spent[s] / traced * 1000, 1) for s in STAGES}
        out["traced"] = traced
    out["cpuSeconds"] = {
        name: round(cpu_after[name] - cpu_before.get(name, 0.0), 1) for name in cpu_after
    }
    return out


async def run(
    objects: int,
    namespaces: int,
    member_count: int,
    rate: float,
    do_burst: bool,
    services: Sequence[str],
    folder: Path,
    timeout: float | None = None,
) -> dict[str, Any]:
    phases = (1 if rate > 0 else 0) + (1 if do_burst else 0)
    per_member = math.ceil(phases * objects / member_count)
    # Room for twice an even share of the pods: placement is not perfectly even.
    nodes = max(2, math.ceil(2 * per_member / PODS_PER_NODE) + 1)
    recorder = Recorder()
    with NatsServer() as nats_server, RedisServer() as redis_server:
        hub = KubeSim("hub", hub=True)
        await hub.start()
        labels = member_labels(member_count)
        members = [
            KubeSim(name, sim=SimOptions(nodes=nodes, record_events=False)) for name in labels
        ]
        for member in members:
            await member.start()
            member.store.add_listener(
                member.store.resource_type("apps/v1", "Deployment"), recorder.on_member
            )
        hub.store.add_listener(hub.store.resource_type("apps/v1", "Deployment"), recorder.on_hub)
        hub_path = folder / "hub.kubeconfig"
        hub.write_kubeconfig(hub_path)
        api = await k8s_config.new_client_from_config_dict(hub.kubeconfig(), context="hub")
        bus = await Bus.connect(
            nats_server.url,
            topology=Topology(prefix=PREFIX, partitions=PARTITIONS),
            producer="bench",
        )
        nc = await nats.connect(nats_server.url)
        pipeline = Pipeline(hub, members, folder)
        pipeline.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=hub.client_ssl(), limit=CREATE_CONCURRENCY),
            headers={"Authorization": f"Bearer {hub.token}"},
        )
        try:
            await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
            core = k8s.CoreV1Api(api)
            for namespace in (SYSTEM, *(f"{NS_PREFIX}{i}" for i in range(namespaces))):
                body: Any = {"metadata": {"name": namespace}}
                await core.create_namespace(body)
            for member in members:
                await register(api, member, labels[member.name])
            policy = {
                "apiVersion": "flotilla.io/v1alpha1",
                "kind": "ClusterPlacementPolicy",
                "metadata": {"name": "bench"},
                "spec": {
                    "resourceSelectors": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "labelSelector": {"matchLabels": {"bench": "pipeline"}},
                        }
                    ]
                },
            }
            await k8s.CustomObjectsApi(api).create_cluster_custom_object(
                "flotilla.io", "v1alpha1", "clusterplacementpolicies", policy
            )
            for stage in EVENT_OF_STAGE:
                await nc.subscribe(f"{PREFIX}.events.{stage}.>", cb=recorder.on_message)
            await nc.flush()
            env = {
                **os.environ,
                "FLOTILLA_NATS_URL": nats_server.url,
                "FLOTILLA_REDIS_URL": redis_server.url,
                "FLOTILLA_STREAM_PREFIX": PREFIX,
                "FLOTILLA_PARTITIONS": str(PARTITIONS),
                "FLOTILLA_HUB_KUBECONFIG": str(hub_path),
                "FLOTILLA_HEALTH_HOST": "127.0.0.1",
                "FLOTILLA_HEALTH_PORT": "0",
                "FLOTILLA_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            }
            for service in services:
                log = (folder / f"{service}.log").open("ab")
                pipeline.processes[service] = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    f"flotilla.{service}",
                    env={**env, "FLOTILLA_INSTANCE": f"{service}-1"},
                    stdout=log,
                    stderr=log,
                )
                log.close()
            pids = {name: p.pid for name, p in pipeline.processes.items()}
            print(json.dumps({"pids": pids}), file=sys.stderr, flush=True)

            async def all_ready() -> bool:
                return await ready_on_hub(api) == member_count

            async def scheduler_sees() -> bool:
                return await scheduler_service.sees_ready(bus, labels)

            await until(all_ready, 240, "every member Ready")
            await until(scheduler_sees, 120, "the scheduler seeing every member Ready")
            await pipeline.create(f"{NS_PREFIX}0", "warmup")
            if not await settle(recorder, {key_of(f"{NS_PREFIX}0", "warmup")}, 120):
                raise SystemExit("the warm-up Deployment never reached a member")

            result: dict[str, Any] = {
                "objects": objects,
                "members": member_count,
                "namespaces": namespaces,
                "nodesPerMember": nodes,
                "services": list(services),
                "cpus": os.cpu_count(),
            }
            wait = timeout if timeout is not None else 120.0 + objects / 10.0
            if rate > 0:
                names = objects_of("p", objects, namespaces)
                before = pipeline.cpu()
                offered = await paced(pipeline, names, rate)
                keys = [key_of(*n) for n in names]
                complete = await settle(recorder, set(keys), wait)
                result["paced"] = report(recorder, keys, offered, before, pipeline.cpu(), complete)
            if do_burst:
                names = objects_of("b", objects, namespaces)
                before = pipeline.cpu()
                offered = await burst(pipeline, names)
                keys = [key_of(*n) for n in names]
                complete = await settle(recorder, set(keys), wait)
                result["burst"] = report(recorder, keys, offered, before, pipeline.cpu(), complete)
            result["goals"] = {"objectsPerSecond": 200, "latencyP99Ms": 500}
            return result
        finally:
            for process in pipeline.processes.values():
                if process.returncode is None:
                    process.terminate()
            for process in pipeline.processes.values():
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            await pipeline.session.close()
            await nc.close()
            await bus.close()
            await api.close()
            for member in members:
                await member.stop()
            await hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5000, help="Deployments per phase")
    parser.add_argument("--members", type=int, default=20)
    parser.add_argument(
        "--namespaces",
        type=int,
        default=1,
        help="namespaces the Deployments are spread over (every object needs its own)",
    )
    parser.add_argument(
        "--rate", type=float, default=50.0, help="objects/s offered in the paced phase (0: skip)"
    )
    parser.add_argument("--no-burst", action="store_true", help="skip the burst phase")
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds a phase waits for its last object after creating them "
        "(default 120 + objects/10); what is applied by then is reported",
    )
    parser.add_argument(
        "--services",
        default=",".join(SERVICES),
        help="comma-separated services to start (default: all seven)",
    )
    args = parser.parse_args()
    if min(args.objects, args.members, args.namespaces) < 1:
        parser.error("--objects, --members and --namespaces must be at least 1")
    services = [s for s in args.services.split(",") if s]
    unknown = set(services) - set(SERVICES)
    if unknown:
        parser.error(f"unknown services: {', '.join(sorted(unknown))}")
    missing = set(STAGES) - set(services)
    if missing:
        parser.error(f"the pipeline needs {', '.join(sorted(missing))}")
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as folder:
        try:
            phases = run(
                args.objects,
                args.namespaces,
                args.members,
                args.rate,
                not args.no_burst,
                services,
                Path(folder),
                args.timeout,
            )
            result = asyncio.run(phases)
        finally:
            if os.environ.get("BENCH_KEEP_LOGS"):
                keep = Path(os.environ["BENCH_KEEP_LOGS"])
                keep.mkdir(parents=True, exist_ok=True)
                for log_file in Path(folder).glob("*.log"):
                    log_file.replace(keep / log_file.name)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
