"""kubesim at scale: 10,000 pods, 20 pod watchers over HTTP, memory. Prints one JSON object.

Scenario (issue 3's targets, defaults below): one in-process `KubeSim` with 100 nodes;
20 watchers stream `GET /api/v1/pods?watch=1` from the list resourceVersion; then
100 Deployments x 100 replicas are created through the store and the clock runs
until every pod is Running (and every Deployment reports readyReplicas). Reported:

- `secondsToAllRunning`, `secondsToAllDeploymentsReady`, and `cpuSecondsToAllRunning`
  (CPU time of this process, the server's, over the same span: steadier than the wall
  time on a shared machine; the watcher process is not counted)
- watcher lag = time a watcher read an event minus the time the store committed it
  (`lagMaxSeconds`, `lagP99Seconds`), and events per watcher vs. events committed
- `rssIdleMiB` (server started with its nodes, no workloads) and `rssPeakMiB` (VmHWM)
  when every Deployment is ready; the simulator's Events trail the burst (as a real
  cluster's do), so `rssPeakSettledMiB` is VmHWM again once the trailing writes have
  landed, with `eventsStored` the Events stored by then

The watchers run in a child process (this script with `--watch`), as clients would:
they share neither the server's event loop nor its memory. They read raw NDJSON with
aiohttp and pull `type` and `resourceVersion` out of each line without building the
whole object, so the figure measures the server's delivery rather than client-side
JSON decoding (`--decode-json` decodes every event instead; then 20 clients sharing
one core are the bottleneck). Commit times come from a store record listener in this
process; both processes read the same wall clock.

    .venv/bin/python bench/kubesim.py [--deployments 100 --replicas 100 --nodes 100
                                       --watchers 20 --decode-json --insecure-http]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import resource
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions

_RV = re.compile(rb'"resourceVersion":"(\d+)"')
_TYPE = re.compile(rb'^\{"type":"([A-Z]+)"')


def rss_mib(field: str = "VmRSS") -> float:
    """Resident memory from /proc/self/status (VmRSS now, VmHWM peak), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    # ru_maxrss is KiB on Linux; only the peak is available this way.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


# -- watcher process ---------------------------------------------------------------------


async def _watch_one(
    session: aiohttp.ClientSession,
    url: str,
    since: str,
    started: asyncio.Event,
    stop_rv: list[int],
    received: list[tuple[int, float]],
    decode: bool,
) -> None:
    """Stream pod events into `received` as (resourceVersion, wall time read)."""
    params = {"watch": "1", "resourceVersion": since, "timeoutSeconds": "900"}
    async with session.get(f"{url}/api/v1/pods", params=params) as response:
        response.raise_for_status()
        started.set()
        buffer = b""
        while not (stop_rv and received and received[-1][0] >= stop_rv[0]):
            try:
                chunk = await asyncio.wait_for(response.content.readany(), 0.2)
            except TimeoutError:
                continue
            if not chunk:
                return
            now = time.time()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if decode:
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        version = event["object"]["metadata"]["resourceVersion"]
                        received.append((int(version), now))
                    continue
                kind = _TYPE.match(line)
                rv = _RV.search(line)
                if kind is None or rv is None or kind.group(1) == b"BOOKMARK":
                    continue
                received.append((int(rv.group(1)), now))


async def watch_main(
    url: str, token: str, since: str, count: int, out: Path, decode: bool, ca_file: str
) -> list[list[tuple[int, float]]]:
    """Child process: `count` watchers, until the rv written to `out`.stop has arrived.

    `ca_file` is the server's CA (PEM) when it serves https, "-" over plain http.
    """
    stop_file = out.with_suffix(".stop")
    stop_rv: list[int] = []
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    tls = ssl.create_default_context(cafile=ca_file) if ca_file != "-" else False
    connector = aiohttp.TCPConnector(limit=count + 4, ssl=tls)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as s:
        started = [asyncio.Event() for _ in range(count)]
        results: list[list[tuple[int, float]]] = [[] for _ in range(count)]
        tasks = [
            asyncio.create_task(_watch_one(s, url, since, started[i], stop_rv, results[i], decode))
            for i in range(count)
        ]
        await asyncio.gather(*(e.wait() for e in started))
        print("WATCHING", flush=True)
        while not stop_rv:
            if stop_file.exists():
                stop_rv.append(int(stop_file.read_text()))
                break
            await asyncio.sleep(0.1)
        done, pending = await asyncio.wait(tasks, timeout=60)
        for task in pending:
            task.cancel()
        for task in tasks:
            if task not in done:
                print("watcher did not reach the final event in time", file=sys.stderr)
            elif task.exception() is not None:
                print(f"watcher failed: {task.exception()!r}", file=sys.stderr)
    return results


# -- server process ----------------------------------------------------------------------


def deployment(index: int, replicas: int) -> dict[str, Any]:
    name = f"app-{index:03d}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "tier": "bench"}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/app:1.0",
                            "ports": [{"containerPort": 8080}],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"},
                            },
                        }
                    ]
                },
            },
        },
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    options = SimOptions(
        nodes=args.nodes,
        node_cpu="32",
        node_memory="128Gi",
        node_pods=110,
        pod_ready_seconds=args.pod_ready_seconds,
    )
    kubesim = KubeSim("bench", sim=options, tls=not args.insecure_http)
    await kubesim.start()
    store = kubesim.store
    pod_rt = store.resource_type("v1", "Pod")
    deploy_rt = store.resource_type("apps/v1", "Deployment")
    await asyncio.sleep(0.5)
    rss_idle = rss_mib()

    committed: dict[int, float] = {}

    def on_record(record: Any) -> None:
        committed[record.resource_version] = time.time()

    unsubscribe = store.add_record_listener(pod_rt, on_record)
    _, list_rv = store.list_frozen(pod_rt)
    workdir = Path(tempfile.mkdtemp(prefix="kubesim-bench-"))
    out = workdir / "receipts.json"
    ca_file = "-"
    if kubesim.authority is not None:
        (workdir / "ca.crt").write_bytes(kubesim.authority.cert_pem)
        ca_file = str(workdir / "ca.crt")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--watch",
        kubesim.url,
        kubesim.token,
        str(list_rv),
        str(args.watchers),
        str(out),
        "decode" if args.decode_json else "scan",
        ca_file,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    if line.strip() != b"WATCHING":
        raise RuntimeError(f"watcher process failed to start: {line!r}")

    total = args.deployments * args.replicas
    started = time.monotonic()
    cpu_started = time.process_time()
    for index in range(args.deployments):
        store.create(deploy_rt, deployment(index, args.replicas))
        if index % 10 == 9:
            await asyncio.sleep(0)
    all_running = None
    all_running_cpu = None
    all_ready = None
    deadline = started + args.limit_seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        if all_running is None:
            running = sum(
                1
                for p in store.iter_frozen(pod_rt)
                if (p.get("status") or {}).get("phase") == "Running"
            )
            if running == total:
                all_running = time.monotonic() - started
                all_running_cpu = time.process_time() - cpu_started
        if all_running is not None:
            ready = sum(
                1
                for d in store.iter_frozen(deploy_rt)
                if (d.get("status") or {}).get("readyReplicas") == args.replicas
            )
            if ready == args.deployments:
                all_ready = time.monotonic() - started
                break
    stats = kubesim.stats()
    rss_peak = rss_mib("VmHWM")
    rss_now = rss_mib()

    # Let trailing status writes land, then tell the watchers where the stream ends.
    last = -1
    while last != store.resource_version:
        last = store.resource_version
        await asyncio.sleep(0.5)
    rss_settled = rss_mib("VmHWM")
    events_stored = store.count(store.resource_type("v1", "Event"))
    final_rv = max(committed) if committed else 0
    out.with_suffix(".stop").write_text(str(final_rv))
    await asyncio.wait_for(child.wait(), 120)
    unsubscribe()
    receipts: list[list[list[float]]] = json.loads(out.read_text())
    await kubesim.stop()

    lags = [
        recv - committed[int(rv)]
        for watcher in receipts
        for rv, recv in watcher
        if int(rv) in committed
    ]
    per_watcher = [len(w) for w in receipts]
    return {
        "pods": total,
        "nodes": args.nodes,
        "deployments": args.deployments,
        "watchers": args.watchers,
        "watchersDecodeJson": args.decode_json,
        "podReadySeconds": args.pod_ready_seconds,
        "secondsToAllRunning": None if all_running is None else round(all_running, 2),
        "secondsToAllDeploymentsReady": None if all_ready is None else round(all_ready, 2),
        "cpuSecondsToAllRunning": None if all_running_cpu is None else round(all_running_cpu, 2),
        "podEventsCommitted": len(committed),
        "eventsPerWatcherMin": min(per_watcher, default=0),
        "eventsPerWatcherMax": max(per_watcher, default=0),
        "everyWatcherGotEveryEvent": all(n == len(committed) for n in per_watcher),
        "lagMaxSeconds": round(max(lags, default=0.0), 3),
        "lagP99Seconds": round(percentile(lags, 0.99), 3),
        "lagP50Seconds": round(percentile(lags, 0.50), 3),
        "rssIdleMiB": round(rss_idle, 1),
        "rssAtEndMiB": round(rss_now, 1),
        "rssPeakMiB": round(rss_peak, 1),
        "rssPeakSettledMiB": round(rss_settled, 1),
        "eventsStored": events_stored,
        "podsByPhase": stats.get("podsByPhase"),
        "resourceVersion": stats.get("resourceVersion"),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--watch":
        url, token, since, count, out, mode, ca_file = sys.argv[2:9]
        receipts = asyncio.run(
            watch_main(url, token, since, int(count), Path(out), mode == "decode", ca_file)
        )
        Path(out).write_text(json.dumps(receipts))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--watchers", type=int, default=20)
    parser.add_argument("--pod-ready-seconds", type=float, default=1.0)
    parser.add_argument("--limit-seconds", type=float, default=300.0)
    parser.add_argument(
        "--insecure-http",
        action="store_true",
        help="serve plain http instead of https (to see what TLS costs)",
    )
    parser.add_argument(
        "--decode-json",
        action="store_true",
        help="watchers json.loads every event (client-bound: all watchers share one core)",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args))))


if __name__ == "__main__":
    main()
