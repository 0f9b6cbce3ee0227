"""The syncer alone: works applied per second to kubesim members, and apply latency.

Starts real NATS JetStream and Redis, a kubesim hub with the Flotilla CRDs and
`--members` simulated member clusters (in this process), registers each member
on the hub (kubeconfig Secret + Cluster), and runs the syncer as a real process
(``python -m flotilla.syncer``), exactly as in production. Once every Cluster is
Ready, it publishes `--works` Deployment works (one replica each, spread round
robin over the members) as the transformer would, either as fast as it can
(``--rate 0``: throughput) or at a fixed offered rate (latency under load).

A work counts as applied when the Deployment is committed in the member's store
(a store listener in this process; both sides read the same clock). Printed as
one JSON object:

- ``appliedPerSecond``: works / (last applied - first published);
- ``latencyP50Ms`` / ``latencyP99Ms`` / ``latencyMaxMs``: published -> applied;
- ``offeredPerSecond``: the rate the works were published at.

    .venv/bin/python bench/syncer.py [--works 2000 --members 20 --rate 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from flotilla.common import builders, events, kube
from flotilla.common.bus import Bus
from flotilla.common.events import ObjectRef, WorkRendered
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.testing import CRD_DIR
from flotilla.common.topology import Topology
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions

SYSTEM = "flotilla-system"
NS = "bench"
PREFIX = "benchsync"


def manifest(name: str) -> dict[str, Any]:
    return builders.rendered(
        builders.deployment(name, NS, requests={"cpu": "10m", "memory": "16Mi"}),
        decision="bench",
    )


async def register(api: Any, member: KubeSim) -> None:
    core = k8s.CoreV1Api(api)
    secret: Any = {
        "metadata": {"name": member.name, "namespace": SYSTEM},
        "stringData": {"kubeconfig": json.dumps(member.kubeconfig())},
    }
    await core.create_namespaced_secret(SYSTEM, secret)
    await k8s.CustomObjectsApi(api).create_cluster_custom_object(
        "flotilla.io",
        "v1alpha1",
        "clusters",
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": member.name},
            "spec": {"kubeconfigSecretRef": {"namespace": SYSTEM, "name": member.name}},
        },
    )


async def all_ready(api: Any, count: int) -> bool:
    listed = await k8s.CustomObjectsApi(api).list_cluster_custom_object(
        "flotilla.io", "v1alpha1", "clusters"
    )
    ready = 0
    for item in listed["items"]:
        for condition in (item.get("status") or {}).get("conditions") or []:
            if condition["type"] == "Ready" and condition["status"] == "True":
                ready += 1
    return ready == count


def args_timeout(works: int) -> float:
    """How long to wait for the last work before reporting what was applied."""
    return 60.0 + works / 5.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(
    works: int, member_count: int, rate: float, folder: Path, profile: str | None = None
) -> dict[str, Any]:
    with NatsServer() as nats_server, RedisServer() as redis_server:
        hub = KubeSim("hub", hub=True)
        await hub.start()
        members = [
            KubeSim(f"m{i:02d}", sim=SimOptions(nodes=2, record_events=False))
            for i in range(member_count)
        ]
        for member in members:
            await member.start()
        applied: dict[str, float] = {}
        for member in members:
            deployments = member.store.resource_type("apps/v1", "Deployment")

            def on_event(event: Any, where: str = member.name) -> None:
                if event.type == "ADDED":
                    name = event.object["metadata"]["name"]
                    applied.setdefault(f"{where}/{name}", time.time())

            member.store.add_listener(deployments, on_event)
        hub_path = folder / "hub.kubeconfig"
        hub.write_kubeconfig(hub_path)
        api = await k8s_config.new_client_from_config_dict(hub.kubeconfig(), context="hub")
        bus = await Bus.connect(
            nats_server.url, topology=Topology(prefix=PREFIX, partitions=16), producer="bench"
        )
        log = (folder / "syncer.log").open("ab")
        process = None
        try:
            await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
            namespace: Any = {"metadata": {"name": SYSTEM}}
            await k8s.CoreV1Api(api).create_namespace(namespace)
            for member in members:
                await register(api, member)
            env = {
                **os.environ,
                "FLOTILLA_NATS_URL": nats_server.url,
                "FLOTILLA_REDIS_URL": redis_server.url,
                "FLOTILLA_STREAM_PREFIX": PREFIX,
                "FLOTILLA_PARTITIONS": "16",
                "FLOTILLA_HUB_KUBECONFIG": str(hub_path),
                "FLOTILLA_HEALTH_HOST": "127.0.0.1",
                "FLOTILLA_HEALTH_PORT": "0",
                "FLOTILLA_HEARTBEAT_INTERVAL": "2",
                "FLOTILLA_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            }
            profiling = ["-m", "cProfile", "-o", profile] if profile else []
            process = await asyncio.create_subprocess_exec(
                sys.executable, *profiling, "-m", "flotilla.syncer", env=env, stdout=log, stderr=log
            )
            deadline = time.monotonic() + 180
            while not await all_ready(api, member_count):
                if time.monotonic() > deadline:
                    raise SystemExit("the members did not all become Ready")
                await asyncio.sleep(0.5)

            published: dict[str, float] = {}
            started = time.time()
            for i in range(works):
                member = members[i % member_count]
                body = manifest(f"d{i:05d}")
                ref = ObjectRef.of(body)
                payload = WorkRendered(
                    ref=ref, cluster=member.name, decision_id="bench", manifest=body
                )
                envelope = events.envelope(
                    payload, key=events.work_key(ref, member.name), producer="bench"
                )
                published[f"{member.name}/d{i:05d}"] = time.time()
                await bus.publish(envelope)
                if rate > 0:
                    due = started + (i + 1) / rate
                    await asyncio.sleep(max(due - time.time(), 0.0))
            offered = works / max(time.time() - started, 1e-9)
            deadline = time.monotonic() + args_timeout(works)
            while len(applied.keys() & published.keys()) < works:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            latencies = [
                (applied[key] - sent) * 1000 for key, sent in published.items() if key in applied
            ]
            last = max(applied[key] for key in published if key in applied)
            return {
                "works": works,
                "members": member_count,
                "applied": len(latencies),
                "offeredPerSecond": round(offered, 1),
                "appliedPerSecond": round(len(latencies) / (last - started), 1),
                "latencyP50Ms": round(statistics.median(latencies), 1),
                "latencyP99Ms": round(percentile(latencies, 0.99), 1),
                "latencyMaxMs": round(max(latencies), 1),
            }
        finally:
            if process is not None and process.returncode is None:
                process.terminate()
                await process.wait()
            log.close()
            if os.environ.get("BENCH_KEEP_LOG"):
                (folder / "syncer.log").replace(os.environ["BENCH_KEEP_LOG"])
            await bus.close()
            await api.close()
            for member in members:
                await member.stop()
            await hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--works", type=int, default=2000)
    parser.add_argument("--members", type=int, default=20)
    parser.add_argument("--rate", type=float, default=0.0, help="works/s offered (0: burst)")
    parser.add_argument("--profile", help="write the syncer's cProfile statistics here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-syncer-") as folder:
        result = asyncio.run(run(args.works, args.members, args.rate, Path(folder), args.profile))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
