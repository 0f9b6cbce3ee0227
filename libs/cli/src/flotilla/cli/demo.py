"""The one-command demo (``make demo``): a stateless web app survives the drain of
the cluster it runs on, and the numbers say so.

The scenario, on a fresh embedded environment: place a web Deployment on one
cluster, wait until its replicas are ready there, cordon and drain that cluster,
and watch — a live table of the clusters, the placement, ready replicas per
cluster, and a prober sampling the app's availability every 100 ms from the hub
object's aggregated status. It ends with a summary (objects moved, time to
drain, the lowest availability seen, the trace id of the move) and tears the
environment down. It holds only if the app ended up fully ready elsewhere, the
cluster reached Drained, and availability never dropped to zero.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from flotilla.cli import environment, stream
from flotilla.cli.errors import CliError
from flotilla.cli.hub import CLUSTER_API, Hub, is_true, now_rfc3339
from flotilla.common import events

NAMESPACE = "default"
APP = "demo-web"
REPLICAS = 4
KEY = f"apps/v1/Deployment/{NAMESPACE}/{APP}"
SAMPLE_EVERY = 0.1
PLACE_TIMEOUT = 90.0
DRAIN_TIMEOUT = 240.0

POLICY: dict[str, Any] = {
    "apiVersion": "flotilla.io/v1alpha1",
    "kind": "PlacementPolicy",
    "metadata": {"name": APP, "namespace": NAMESPACE},
    "spec": {
        "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": APP}],
        "strategy": "split",
        "maxClusters": 1,
    },
}
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": APP, "namespace": NAMESPACE},
    "spec": {
        "replicas": REPLICAS,
        "selector": {"matchLabels": {"app": APP}},
        "template": {
            "metadata": {"labels": {"app": APP}},
            "spec": {
                "containers": [
                    {
                        "name": APP,
                        "image": "nginx:1.27",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ]
            },
        },
    },
}


def missing_services() -> list[str]:
    installed = set(environment.installed_services())
    return [name for name in environment.SERVICES if name not in installed]


@dataclass
class Watch:
    """What the live table shows, updated by the prober."""

    clusters: list[dict[str, Any]] = field(default_factory=list)
    placement: list[dict[str, Any]] = field(default_factory=list)
    ready_per_cluster: dict[str, Any] = field(default_factory=dict)
    ready: int = 0
    availability: float = 0.0
    minimum: float | None = None
    """Lowest availability since the app was first fully available."""
    samples: int = 0
    phase: str = "starting"

    def sample(self, deployment: dict[str, Any] | None) -> None:
        status = (deployment or {}).get("status") or {}
        annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
        self.ready = int(status.get("readyReplicas") or status.get("availableReplicas") or 0)
        self.availability = min(self.ready / REPLICAS, 1.0)
        if self.minimum is not None or self.availability >= 1.0:
            self.minimum = min(self.availability, 1.0 if self.minimum is None else self.minimum)
        self.samples += 1
        self.placement = _json(annotations.get("flotilla.io/placement"), {}).get("clusters", [])
        self.ready_per_cluster = _per_cluster(annotations.get("flotilla.io/cluster-status"))

    def table(self) -> Table:
        table = Table(title=f"flotilla demo — {self.phase}", expand=False)
        for column in ("cluster", "state", "placement", "ready replicas"):
            table.add_column(column)
        placed = {p.get("cluster"): p for p in self.placement}
        for cluster in self.clusters:
            name = cluster["metadata"]["name"]
            entry = placed.get(name)
            where = f"{entry.get('replicas')} ({entry.get('state', 'Active')})" if entry else ""
            table.add_row(
                name, _cluster_state(cluster), where, str(self.ready_per_cluster.get(name, ""))
            )
        minimum = "-" if self.minimum is None else f"{self.minimum:.0%}"
        table.caption = (
            f"{APP}: {self.ready}/{REPLICAS} ready · availability {self.availability:.0%} · "
            f"minimum {minimum} · {self.samples} samples"
        )
        return table


def _json(value: str | None, default: Any) -> Any:
    try:
        return json.loads(value) if value else default
    except ValueError:
        return default


def _per_cluster(value: str | None) -> dict[str, Any]:
    """Ready replicas per cluster from ``flotilla.io/cluster-status`` (a map of cluster →
    status, or a list of entries naming their cluster)."""
    parsed = _json(value, {})
    entries = parsed.items() if isinstance(parsed, dict) else []
    if isinstance(parsed, list):
        entries = [(e.get("cluster"), e) for e in parsed if isinstance(e, dict)]
    found = {}
    for name, status in entries:
        if isinstance(status, dict):
            nested = status.get("status")
            inner: dict[str, Any] = nested if isinstance(nested, dict) else status
            found[str(name)] = inner.get("readyReplicas", inner.get("ready", ""))
    return found


def _cluster_state(cluster: dict[str, Any]) -> str:
    spec = cluster.get("spec") or {}
    for condition in ("Drained", "Draining"):
        if is_true(cluster, condition):
            return condition
    if spec.get("evictAfter"):
        return "Draining"
    return "Cordoned" if spec.get("unschedulable") else "Ready"


@dataclass
class Result:
    source: str = ""
    targets: list[str] = field(default_factory=list)
    drain_seconds: float | None = None
    minimum: float | None = None
    trace_id: str = ""
    moved: int = 0
    problems: list[str] = field(default_factory=list)


def play(state_dir: Path, console: Console, *, keep: bool = False) -> bool:
    """The scenario on a fresh environment (module docstring); True if it held."""
    missing = missing_services()
    if missing:
        raise CliError(f"the demo needs every service; not installed: {', '.join(missing)}")
    started = environment.up(state_dir, echo=lambda line: console.print(f"[dim]•[/] {line}"))
    env = started.env
    try:
        result = asyncio.run(_scenario(env, console))
    finally:
        if started.fresh and not keep:
            environment.down(state_dir)
            console.print("[dim]•[/] environment stopped")
    console.print()
    console.print(
        f"objects moved:         {result.moved} ({result.source} → "
        f"{', '.join(result.targets) or '-'})"
    )
    drain = "-" if result.drain_seconds is None else f"{result.drain_seconds:.1f}s"
    console.print(f"time to drain:         {drain}")
    minimum = "-" if result.minimum is None else f"{result.minimum:.0%}"
    console.print(f"minimum availability:  {minimum}")
    console.print(f"trace id of the drain: {result.trace_id or '-'}")
    for problem in result.problems:
        console.print(f"[red]✗[/] {problem}")
    if not result.problems:
        console.print("[green]✓[/] the app stayed available while its cluster was drained")
    return not result.problems


async def _scenario(env: environment.EnvFile, console: Console) -> Result:
    result = Result()
    watch = Watch()
    async with Hub.open(env.hub.kubeconfig) as hub:
        deployments = await hub.resource("apps/v1", "Deployment")
        for obj in (POLICY, DEPLOYMENT):
            console.print(f"[dim]•[/] {await hub.apply(obj)}")
        with Live(watch.table(), console=console, refresh_per_second=8) as live:

            async def sample() -> None:
                watch.sample(await hub.get(deployments, APP, NAMESPACE))
                live.update(watch.table())

            async def refresh_clusters() -> None:
                watch.clusters = await hub.list(CLUSTER_API, "Cluster")

            async def until(done: Any, timeout: float, what: str) -> bool:
                deadline = time.monotonic() + timeout
                ticks = 0
                while time.monotonic() < deadline:
                    await sample()
                    if ticks % 5 == 0:
                        await refresh_clusters()
                    ticks += 1
                    if done():
                        return True
                    await asyncio.sleep(SAMPLE_EVERY)
                result.problems.append(f"{what} did not happen within {timeout:.0f}s")
                return False

            watch.phase = "placing the web app"
            await refresh_clusters()
            placed = await until(
                lambda: watch.ready >= REPLICAS and _active(watch.placement),
                PLACE_TIMEOUT,
                f"{APP} placed and ready",
            )
            if not placed:
                return result
            result.source = _active(watch.placement)[0]
            watch.phase = f"cordoning and draining {result.source}"
            await hub.patch_cluster(result.source, {"unschedulable": True})
            began = time.monotonic()
            await hub.patch_cluster(
                result.source, {"unschedulable": True, "evictAfter": now_rfc3339()}
            )

            def drained() -> bool:
                source = next(
                    (c for c in watch.clusters if c["metadata"]["name"] == result.source), {}
                )
                active = _active(watch.placement)
                return (
                    is_true(source, "Drained")
                    and bool(active)
                    and result.source not in active
                    and not any(p.get("state") == "Retiring" for p in watch.placement)
                    and watch.ready >= REPLICAS
                )

            if await until(drained, DRAIN_TIMEOUT, f"the drain of {result.source}"):
                result.drain_seconds = time.monotonic() - began
            watch.phase = "done"
            await sample()
    result.minimum = watch.minimum
    result.targets = [c for c in _active(watch.placement) if c != result.source]
    result.moved = 1 if result.targets else 0
    if watch.minimum is None or watch.minimum <= 0:
        result.problems.append("availability dropped to zero during the drain")
    result.trace_id = await _drain_trace(env, result.source)
    return result


def _active(placement: list[dict[str, Any]]) -> list[str]:
    return [str(p.get("cluster")) for p in placement if p.get("state", "Active") == "Active"]


async def _drain_trace(env: environment.EnvFile, source: str) -> str:
    """The trace of the decision that moved the app off `source`."""
    found = ""
    async with stream.connect(env.nats_url, env.stream_prefix) as bus:
        async for event in stream.read(bus, types=["PlacementDecided"]):
            payload = event.envelope.payload
            if (
                event.envelope.key == KEY
                and isinstance(payload, events.PlacementDecided)
                and any(p.cluster == source for p in payload.previous)
                and not any(p.cluster == source for p in payload.clusters)
            ):
                found = stream.trace_id(event.envelope.traceparent)
    return found
