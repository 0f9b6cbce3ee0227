"""Capacity cache under load: snapshot latency and reserve throughput. Prints one JSON object.

Scenario (defaults below): a real redis-server on loopback holding 100 clusters of 50
nodes each, with 20 live reservations per cluster. Measured:

- `snapshotP50Ms` / `snapshotP99Ms`: one `snapshot()` of every cluster (the
  scheduler's per-decision read), including JSON decoding into the models;
- `fitAllClustersMs`: `fit_replicas` for one shape over that whole snapshot (pure);
- `reservesPerSecond`: `reserve()` calls completed per second by `--clients`
  connections racing on the same 10 clusters (what several scheduler replicas do),
  and `reserveP99Ms` per call.

    .venv/bin/python bench/capacity.py [--clusters 100 --nodes 50 --clients 4 --reserves 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from flotilla.common.capacity import ClusterCapacity, NodeCapacity
from flotilla.common.infra import RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache

GI = 2**30


def cluster_record(name: str, nodes: int) -> ClusterCapacity:
    free = {"cpu": 16_000, "memory": 64 * GI, "pods": 110}
    node_list = [
        NodeCapacity(name=f"{name}-{i}", allocatable=free, free=free) for i in range(nodes)
    ]
    total = {r: amount * nodes for r, amount in free.items()}
    return ClusterCapacity(
        cluster=name, allocatable=total, available=total, nodes=node_list, observed_at=time.time()
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> dict[str, float | int]:
    with RedisServer() as server:
        async with RedisCapacityCache.from_url(server.url) as cache:
            names = [f"cluster-{i:03d}" for i in range(args.clusters)]
            for name in names:
                await cache.put(cluster_record(name, args.nodes))
                for r in range(20):
                    await cache.reserve(name, f"seed-{r}", {"cpu": 100}, 1, ttl=600)

            snapshot_ms = []
            for _ in range(args.snapshots):
                started = time.perf_counter()
                snap = await cache.snapshot()
                snapshot_ms.append((time.perf_counter() - started) * 1000)
            assert len(snap.clusters) == args.clusters

            started = time.perf_counter()
            fits = [c.fit_replicas({"cpu": 500, "memory": GI}) for c in snap.clusters.values()]
            fit_ms = (time.perf_counter() - started) * 1000
            assert min(fits) > 0

        caches = [RedisCapacityCache.from_url(server.url) for _ in range(args.clients)]
        per_call_ms: list[float] = []

        async def reserver(cache: RedisCapacityCache, who: int) -> None:
            for i in range(args.reserves // args.clients):
                began = time.perf_counter()
                await cache.reserve(names[i % 10], f"c{who}-{i}", {"cpu": 10}, 1, ttl=600)
                per_call_ms.append((time.perf_counter() - began) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(reserver(c, n) for n, c in enumerate(caches)))
        elapsed = time.perf_counter() - started
        for cache in caches:
            await cache.aclose()

    return {
        "clusters": args.clusters,
        "nodesPerCluster": args.nodes,
        "snapshotP50Ms": round(statistics.median(snapshot_ms), 2),
        "snapshotP99Ms": round(percentile(snapshot_ms, 0.99), 2),
        "fitAllClustersMs": round(fit_ms, 2),
        "clients": args.clients,
        "reservesPerSecond": round(len(per_call_ms) / elapsed),
        "reserveP99Ms": round(percentile(per_call_ms, 0.99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--snapshots", type=int, default=50)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--reserves", type=int, default=4000)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
