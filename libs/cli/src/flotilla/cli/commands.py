"""The ``flotilla`` command line (click): one function per subcommand.

Each command reads the running environment from ``STATE_DIR/env.json``
(`flotilla.cli.environment`), talks to the hub (`flotilla.cli.hub`) or the event
stream (`flotilla.cli.stream`), and prints for a person. `main` turns every
user-facing failure into one ``error: …`` line and exit code 1 — never a
traceback for a mistake the user can fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import click
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from rich.console import Console

from flotilla.cli import environment, replay, stream
from flotilla.cli.errors import CliError
from flotilla.cli.hub import CLUSTER_API, Hub, age, condition, is_true, manifests, now_rfc3339
from flotilla.common import api, events, kube
from flotilla.common.errors import FlotillaError
from flotilla.common.rediscapacity import DEFAULT_PREFIX, RedisCapacityCache

T = TypeVar("T")
console = Console(highlight=False, soft_wrap=True)
FORMATS = click.Choice(["table", "wide", "json", "yaml"])


class Table:
    """Aligned plain-text columns as kubectl prints them (never cut to the terminal)."""

    def __init__(self, *headers: str, box: None = None) -> None:
        self.headers = list(headers)
        self.rows: list[list[str]] = []

    def add_column(self, header: str) -> None:
        self.headers.append(header)

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def render(self) -> str:
        widths = [
            max(len(row[i]) for row in [self.headers, *self.rows]) for i in range(len(self.headers))
        ]
        return "\n".join(
            "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [self.headers, *self.rows]
        )


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def state_dir(ctx: click.Context) -> Path:
    return Path(ctx.obj["state_dir"])


def env_of(ctx: click.Context) -> environment.EnvFile:
    return environment.load(state_dir(ctx))


@click.group()
@click.option(
    "--state-dir",
    default=".flotilla",
    show_default=True,
    envvar="FLOTILLA_STATE_DIR",
    help="where the embedded environment keeps its state, logs and env.json",
)
@click.pass_context
def cli(ctx: click.Context, state_dir: str) -> None:
    """Flotilla: transparent multi-cluster placement for Kubernetes."""
    ctx.obj = {"state_dir": state_dir}


# --- the embedded environment ---------------------------------------------------------


@cli.command()
@click.option("--clusters", default=3, show_default=True, help="member clusters to start")
@click.pass_context
def up(ctx: click.Context, clusters: int) -> None:
    """Start NATS, Redis, a kubesim hub, member clusters and the services."""
    started = environment.up(
        state_dir(ctx), clusters, echo=lambda line: console.print(f"[dim]•[/] {line}")
    )
    env = started.env
    if not started.fresh:
        console.print(f"Flotilla is already running in {state_dir(ctx)} (`flotilla down` stops it)")
    else:
        console.print(
            f"Flotilla is up: hub + {len(env.clusters)} clusters "
            f"({', '.join(env.clusters)}), services: {', '.join(env.services) or 'none'}"
        )
    click.echo(f"export KUBECONFIG={env.kubeconfig}")


@cli.command()
@click.pass_context
def down(ctx: click.Context) -> None:
    """Stop everything `flotilla up` started (and nothing else)."""
    stopped = environment.down(state_dir(ctx))
    console.print(
        f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else "")
    )


@cli.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Each process of the environment and its health."""
    env = env_of(ctx)
    table = Table("NAME", "ROLE", "PID", "STATE")
    healthy = True
    for row in environment.status(env):
        healthy &= row.running and row.detail in ("running", "ready")
        table.add_row(row.name, row.role, str(row.pid), row.detail)
    click.echo(table.render())
    if not healthy:
        raise CliError("some processes are not running or not ready")


@cli.command()
@click.option("--hub", "hub_kubeconfig", required=True, type=click.Path(path_type=Path))
@click.option(
    "--member",
    "members",
    multiple=True,
    required=True,
    metavar="NAME=KUBECONFIG",
    help="a member cluster to register (repeatable)",
)
@click.option(
    "--host-from-name",
    is_flag=True,
    help="reach each API server under its cluster's name (a compose service)",
)
@click.option("--mark-ready", is_flag=True, help="write capacity and Ready (no syncer)")
@click.option("--redis-url", envvar="FLOTILLA_REDIS_URL", default="redis://127.0.0.1:6379/0")
def register(
    hub_kubeconfig: Path,
    members: tuple[str, ...],
    host_from_name: bool,
    mark_ready: bool,
    redis_url: str,
) -> None:
    """Install the CRDs on a hub and register member clusters (outside `flotilla up`)."""
    found: dict[str, tuple[Path, dict[str, str]]] = {}
    for member in members:
        name, sep, path = member.partition("=")
        if not sep or not name or not path:
            raise CliError(f"expected NAME=KUBECONFIG, got {member!r}")
        kubeconfig = Path(path)
        if not kubeconfig.exists():
            raise CliError(f"{kubeconfig}: no such file")
        if host_from_name:
            kubeconfig = environment.reachable_as(
                kubeconfig, name, kubeconfig.with_suffix(".reachable.yaml")
            )
        labels = dict(environment.MEMBERS.get(name, {"region": name}))
        found[name] = (kubeconfig, labels)
    if host_from_name:
        hub_kubeconfig = environment.reachable_as(
            hub_kubeconfig, "hub", hub_kubeconfig.with_suffix(".reachable.yaml")
        )
    run(
        environment.register(
            hub_kubeconfig,
            found,
            redis_url=redis_url,
            capacity_prefix=DEFAULT_PREFIX,
            mark_ready=mark_ready,
        )
    )
    click.echo(f"registered {', '.join(found)} on {hub_kubeconfig}")


# --- objects on the hub ------------------------------------------------------------------


FILENAME = click.option("-f", "--filename", "path", required=True, type=click.Path(path_type=Path))


def _each_manifest(ctx: click.Context, path: Path, *, deleting: bool) -> None:
    """Apply (in file order) or delete (in reverse) every object in `path`."""
    found = manifests(path)
    env = env_of(ctx)

    async def go() -> None:
        async with Hub.open(env.hub.kubeconfig) as hub:
            for manifest in reversed(found) if deleting else found:
                action = hub.delete if deleting else hub.apply
                click.echo(await action(manifest.body))

    run(go())


@cli.command()
@FILENAME
@click.pass_context
def apply(ctx: click.Context, path: Path) -> None:
    """Create or update the objects in FILE or DIR on the hub."""
    _each_manifest(ctx, path, deleting=False)


@cli.command()
@FILENAME
@click.pass_context
def delete(ctx: click.Context, path: Path) -> None:
    """Delete the objects in FILE or DIR from the hub."""
    _each_manifest(ctx, path, deleting=True)


def _dump(items: list[Any], output: str) -> None:
    if output == "json":
        click.echo(json.dumps(items, indent=2, default=str))
    else:
        click.echo(yaml.safe_dump(items, sort_keys=False, default_flow_style=False), nl=False)


@cli.command()
@click.argument("what", type=click.Choice(["clusters", "placements", "policies"]))
@click.option("-o", "--output", type=FORMATS, default="table")
@click.pass_context
def get(ctx: click.Context, what: str, output: str) -> None:
    """List clusters, placements (the last decision per object) or policies."""
    env = env_of(ctx)
    wide = output == "wide"
    if what == "placements":
        placements = run(_placements(env))
        if output in ("json", "yaml"):
            _dump([p.model_dump(mode="json", by_alias=True) for p in placements.values()], output)
            return
        table = Table("OBJECT", "CLUSTERS", "DECISION", *(["REASON"] if wide else []))
        for key, decided in sorted(placements.items()):
            table.add_row(
                key,
                replay.placement_text(decided.clusters),
                decided.decision_id[:12],
                *([decided.reason] if wide else []),
            )
        click.echo(table.render())
        return

    async def listed() -> list[dict[str, Any]]:
        async with Hub.open(env.hub.kubeconfig) as hub:
            if what == "clusters":
                return await hub.list(CLUSTER_API, "Cluster")
            return [
                *await hub.list(CLUSTER_API, "ClusterPlacementPolicy"),
                *await hub.list(CLUSTER_API, "PlacementPolicy"),
            ]

    items = run(listed())
    if output in ("json", "yaml"):
        _dump(items, output)
        return
    if what == "clusters":
        table = Table("NAME", "READY", "STATUS", "PLACEMENTS", "AGE")
        if wide:
            table.add_column("LABELS")
        for item in items:
            spec = item.get("spec") or {}
            state = (
                "Drained"
                if is_true(item, "Drained")
                else "Draining"
                if is_true(item, "Draining") or spec.get("evictAfter")
                else "Cordoned"
                if spec.get("unschedulable")
                else "Schedulable"
            )
            ready = condition(item, "Ready")
            labels = ",".join(f"{k}={v}" for k, v in (item["metadata"].get("labels") or {}).items())
            table.add_row(
                item["metadata"]["name"],
                (ready or {}).get("status", "Unknown"),
                state,
                str((item.get("status") or {}).get("placements", 0)),
                age(item["metadata"].get("creationTimestamp")),
                *([labels] if wide else []),
            )
    else:
        table = Table("KIND", "NAMESPACE", "NAME", "PRIORITY", "STRATEGY")
        if wide:
            table.add_column("SELECTS")
        for item in items:
            spec = item.get("spec") or {}
            selects = ", ".join(
                f"{s.get('kind')}/{s.get('name') or '*'}" for s in spec.get("resourceSelectors", [])
            )
            table.add_row(
                item["kind"],
                item["metadata"].get("namespace") or "-",
                item["metadata"]["name"],
                str(spec.get("priority", 0)),
                str(spec.get("strategy") or "-"),
                *([selects] if wide else []),
            )
    click.echo(table.render())


async def _placements(env: environment.EnvFile) -> dict[str, events.PlacementDecided]:
    """The last decision per object (deleted objects left out)."""
    found: dict[str, events.PlacementDecided] = {}
    async with stream.connect(env.nats_url, env.stream_prefix) as bus:
        async for event in stream.read(bus, types=["PlacementDecided"]):
            payload = event.envelope.payload
            if isinstance(payload, events.PlacementDecided):
                if payload.deleted:
                    found.pop(payload.ref.key, None)
                else:
                    found[payload.ref.key] = payload
    return found


@cli.command()
@click.argument("target", metavar="KIND/NAME")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.pass_context
def describe(ctx: click.Context, target: str, namespace: str) -> None:
    """Where an object runs and why, and what happened to it."""
    kind, sep, name = target.partition("/")
    if not sep or not kind or not name:
        raise CliError(f"expected KIND/NAME (e.g. deployment/web), got {target!r}")
    env = env_of(ctx)
    console.print(run(_describe(env, kind, name, namespace)), end="")


async def _describe(env: environment.EnvFile, kind: str, name: str, namespace: str) -> str:
    async with Hub.open(env.hub.kubeconfig) as hub:
        resource = await hub.resolve(kind)
        ns = namespace if resource.namespaced else None
        obj = await hub.get(resource, name, ns)
        if obj is None:
            where = f" in namespace {ns}" if ns else ""
            raise CliError(f"{resource.kind} {name} not found{where}")
        hub_events = []
        if ns is not None:
            listed = await k8s.CoreV1Api(hub.api).list_namespaced_event(ns)
            hub_events = [
                e for e in listed.items if e.involved_object and e.involved_object.name == name
            ]
    obj.setdefault("apiVersion", resource.group_version)
    obj.setdefault("kind", resource.kind)
    key = events.ObjectRef.of(obj).key
    last: events.Envelope | None = None
    async with stream.connect(env.nats_url, env.stream_prefix) as bus:
        async for event in stream.read(bus, types=["PlacementDecided"]):
            if event.envelope.key == key:
                last = event.envelope
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    out = [f"Name:             {meta['name']}"]
    if ns:
        out.append(f"Namespace:        {ns}")
    out.append(f"Kind:             {obj['apiVersion']} {obj['kind']}")
    out.append(f"Key:              {key}")
    decided = last.payload if last is not None else None
    if isinstance(decided, events.PlacementDecided):
        out.append(f"Decision:         {decided.decision_id}")
        out.append(f"Reason:           {decided.reason}")
        out.append("Placement:")
        if not decided.clusters:
            out.append("  (no cluster)")
        for placement in decided.clusters:
            replicas = "-" if placement.replicas is None else str(placement.replicas)
            out.append(f"  {placement.cluster:<16} {placement.state:<9} replicas={replicas}")
        rejected = decided.rejected_clusters()
        if rejected:
            out.append("Rejected clusters:")
            for cluster in rejected:
                out.append(f"  {cluster:<16} {'; '.join(decided.reasons_for(cluster))}")
    else:
        out.append(
            "Placement:        no decision recorded yet (is a placement policy selecting it?)"
        )
    out.append(_section("Dependencies", annotations.get(api.DEPENDENCIES_ANNOTATION)))
    out.append(_section("Transformations", annotations.get("flotilla.io/transformations")))
    out.append(_section("Cluster status", annotations.get("flotilla.io/cluster-status")))
    out.append(_section("Failover history", annotations.get("flotilla.io/failover-history")))
    trace = stream.trace_id(last.traceparent if last is not None else None)
    out.append(f"Last trace:       {trace or '-'}")
    if hub_events:
        out.append("Events:")
        for e in hub_events[-10:]:
            out.append(f"  {e.type:<8} {e.reason:<20} {e.message}")
    return "\n".join(out) + "\n"


def _section(title: str, value: str | None) -> str:
    label = f"{title + ':':<18}"
    try:
        parsed = json.loads(value) if value else None
    except ValueError:
        return f"{label}{value}"
    if not parsed:
        return f"{label}-"
    if isinstance(parsed, list):
        lines = [f"{title}:"]
        for item in parsed:
            if isinstance(item, dict):
                lines.append("  " + " ".join(f"{k}={v}" for k, v in item.items()))
            else:
                lines.append(f"  {item}")
        return "\n".join(lines)
    if isinstance(parsed, dict):
        lines = [f"{title}:"]
        for k, v in parsed.items():
            lines.append(f"  {k:<16} {json.dumps(v, separators=(',', ':'))}")
        return "\n".join(lines)
    return f"{label}{value}"


# --- clusters ------------------------------------------------------------------------------


@cli.command()
@click.argument("cluster")
@click.pass_context
def cordon(ctx: click.Context, cluster: str) -> None:
    """No new placements on CLUSTER."""
    env = env_of(ctx)
    run(_patch_cluster(env, cluster, {"unschedulable": True}))
    click.echo(f"cluster/{cluster} cordoned")


@cli.command()
@click.argument("cluster")
@click.pass_context
def uncordon(ctx: click.Context, cluster: str) -> None:
    """Allow placements on CLUSTER again (and stop a drain)."""
    env = env_of(ctx)
    run(_patch_cluster(env, cluster, {"unschedulable": False, "evictAfter": None}))
    click.echo(f"cluster/{cluster} uncordoned")


async def _patch_cluster(env: environment.EnvFile, cluster: str, spec: dict[str, Any]) -> None:
    async with Hub.open(env.hub.kubeconfig) as hub:
        await hub.patch_cluster(cluster, spec)


@cli.command()
@click.argument("cluster")
@click.option("--wait", is_flag=True, help="show progress until the cluster is Drained")
@click.option("--timeout", default=300.0, show_default=True, help="seconds --wait waits")
@click.pass_context
def drain(ctx: click.Context, cluster: str, wait: bool, timeout: float) -> None:
    """Cordon CLUSTER and move everything placed there elsewhere."""
    env = env_of(ctx)
    run(_drain(env, cluster, wait, timeout))


async def _drain(env: environment.EnvFile, cluster: str, wait: bool, timeout: float) -> None:
    async with Hub.open(env.hub.kubeconfig) as hub:
        await hub.patch_cluster(cluster, {"unschedulable": True, "evictAfter": now_rfc3339()})
        click.echo(f"cluster/{cluster} draining")
        if not wait:
            return
        started = time.monotonic()
        said = ""
        while True:
            current = await hub.cluster(cluster)
            placements = (current.get("status") or {}).get("placements", "?")
            draining = condition(current, "Draining") or {}
            line = f"  placements={placements} {draining.get('message') or ''}".rstrip()
            if line != said:
                click.echo(line)
                said = line
            if is_true(current, "Drained"):
                click.echo(f"cluster/{cluster} drained in {time.monotonic() - started:.1f}s")
                return
            if time.monotonic() - started > timeout:
                raise CliError(f"cluster {cluster} was not Drained after {timeout:.0f}s")
            await asyncio.sleep(0.5)


# --- the event stream ------------------------------------------------------------------------


@cli.command(name="events")
@click.option("--since", default=None, help="a duration ago (10m) or an ISO 8601 time")
@click.option("--key", default=None, metavar="NS/NAME", help="only this object's events")
@click.option("--type", "types", multiple=True, help="only these event types (repeatable)")
@click.option("--follow", "-f", is_flag=True, help="keep printing new events")
@click.pass_context
def events_command(
    ctx: click.Context, since: str | None, key: str | None, types: tuple[str, ...], follow: bool
) -> None:
    """The recorded events, one line each (time, sequence, type, key, what it says, trace)."""
    env = env_of(ctx)
    window = stream.Window(since=stream.parse_time(since) if since else None)
    with contextlib.suppress(KeyboardInterrupt):
        run(_events(env, window, key, types, follow))


def _event_line(event: Any) -> str:
    envelope = event.envelope
    trace = stream.trace_id(envelope.traceparent)
    return (
        f"{event.published_at:%H:%M:%S.%f}"[:12]
        + f" #{event.sequence:<6} {envelope.type:<22} {envelope.key}  {stream.describe(envelope)}"
        + (f"  trace={trace}" if trace else "")
    )


async def _events(
    env: environment.EnvFile,
    window: stream.Window,
    key: str | None,
    types: tuple[str, ...],
    follow: bool,
) -> None:
    async with stream.connect(env.nats_url, env.stream_prefix) as bus:
        last = await stream.last_sequence(bus)
        async for event in stream.read(bus, window, types):
            last = max(last, event.sequence)
            if key is None or stream.matches_key(event.envelope, key):
                click.echo(_event_line(event))
        if not follow:
            return
        while True:
            found = False
            async for event in stream.read(bus, stream.Window(from_seq=last + 1), types):
                found = True
                last = event.sequence
                if key is None or stream.matches_key(event.envelope, key):
                    click.echo(_event_line(event))
            if not found:
                await asyncio.sleep(0.5)


@cli.command(name="replay")
@click.option("--since", default=None, help="window start: a duration ago or ISO 8601")
@click.option("--until", default=None, help="window end: a duration ago or ISO 8601")
@click.option("--from-seq", type=int, default=None, help="window start: stream sequence")
@click.option("--to-seq", type=int, default=None, help="window end: stream sequence")
@click.option(
    "--service",
    type=click.Choice(["scheduler", "transformer", "aggregator"]),
    default="scheduler",
    show_default=True,
)
@click.option("--key", default=None, metavar="NS/NAME", help="only this object's decisions")
@click.option("--diff", is_flag=True, help="show how each differing decision differs")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    default=None,
    help="replay as if these placement policies had been in force",
)
@click.option("--nats-url", default=None, help="read another stream (a copy) instead")
@click.option("--stream-prefix", default=None, help="its installation prefix")
@click.pass_context
def replay_command(
    ctx: click.Context,
    since: str | None,
    until: str | None,
    from_seq: int | None,
    to_seq: int | None,
    service: str,
    key: str | None,
    diff: bool,
    policy_file: Path | None,
    nats_url: str | None,
    stream_prefix: str | None,
) -> None:
    """Decide the recorded window again with a service's pure core and compare."""
    if since is None and from_seq is None:
        raise CliError("give the window: --since T or --from-seq N")
    if service != "scheduler":
        raise CliError(f"replay of the {service} is not available: only the scheduler's core")
    window = stream.Window(
        since=stream.parse_time(since) if since else None,
        until=stream.parse_time(until) if until else None,
        from_seq=from_seq,
        to_seq=to_seq,
    )
    overrides = {}
    if policy_file is not None:
        try:
            overrides = replay.policy_overrides([m.body for m in manifests(policy_file)])
        except (ValueError, api.InvalidObjectError) as exc:
            raise CliError(f"{policy_file}: {exc}") from None
    env = env_of(ctx) if nats_url is None or stream_prefix is None else None
    url = nats_url or (env.nats_url if env else "")
    prefix = stream_prefix or (env.stream_prefix if env else environment.STREAM_PREFIX)
    redis_url = env.redis_url if env else None
    capacity_prefix = env.capacity_prefix if env else ""
    outcomes = run(_replay(url, prefix, redis_url, capacity_prefix, window, key, overrides))
    different = 0
    for outcome in outcomes:
        verdict = "same" if outcome.same else "DIFFERENT"
        different += not outcome.same
        click.echo(
            f"#{outcome.sequence:<6} {outcome.key}  {outcome.recorded.decision_id[:12]}  {verdict}"
            + (f"  trace={outcome.trace_id}" if outcome.trace_id else "")
        )
        if diff and not outcome.same:
            for line in outcome.differences():
                click.echo(f"    {line}")
    click.echo(
        f"{len(outcomes)} decisions replayed: {len(outcomes) - different} same, "
        f"{different} different"
    )


async def _replay(
    url: str,
    prefix: str,
    redis_url: str | None,
    capacity_prefix: str,
    window: stream.Window,
    key: str | None,
    overrides: dict[replay.PolicyId, api.PlacementPolicySpec],
) -> list[replay.Outcome]:
    from flotilla.common import capacity

    base = capacity.Snapshot(clusters={}, taken_at=time.time())
    if redis_url is not None:
        cache = RedisCapacityCache.from_url(redis_url, prefix=capacity_prefix)
        try:
            base = await cache.snapshot()
        except FlotillaError as exc:
            raise CliError(f"cannot read the capacity records from Redis: {exc}") from None
        finally:
            await cache.aclose()
    async with stream.connect(url, prefix) as bus:
        return await replay.scheduler(
            stream.read(bus, window, replay.INPUT_TYPES, from_start=True),
            window,
            base,
            key=key,
            overrides=overrides,
        )


# --- chaos -------------------------------------------------------------------------------------


@cli.group()
def chaos() -> None:
    """Inject faults into the member clusters (kubesim's fault endpoints)."""


@chaos.command()
@click.argument("cluster", required=False)
@click.option("--region", default=None, help="every cluster with this region label")
@click.option("--off", is_flag=True, help="end the outage")
@click.pass_context
def outage(ctx: click.Context, cluster: str | None, region: str | None, off: bool) -> None:
    """Take CLUSTER (or a whole --region) off the network, or bring it back with --off."""
    env = env_of(ctx)
    if (cluster is None) == (region is None):
        raise CliError("name a CLUSTER or a --region, not both")
    if cluster is not None:
        if cluster not in env.clusters:
            raise CliError(f"unknown cluster {cluster!r} (clusters: {', '.join(env.clusters)})")
        targets = [cluster]
    else:
        targets = [n for n, c in env.clusters.items() if c.labels.get("region") == region]
        if not targets:
            raise CliError(f"no cluster in region {region!r}")
    run(_outage(env, targets, down=not off))
    for name in targets:
        click.echo(f"cluster/{name} {'back online' if off else 'in outage'}")


async def _outage(env: environment.EnvFile, clusters: list[str], *, down: bool) -> None:
    for name in clusters:
        await environment.set_outage(env.clusters[name].kubeconfig, down=down)


@cli.command()
@click.option("--keep", is_flag=True, help="leave the environment running afterwards")
@click.pass_context
def demo(ctx: click.Context, keep: bool) -> None:
    """Play the drain scenario on a fresh environment and tear it down."""
    from flotilla.cli import demo as scenario

    if not scenario.play(state_dir(ctx), console, keep=keep):
        raise CliError("the demo scenario did not hold (see above)")


def run_cli(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. A user's mistake is one ``error:`` line on
    stderr and exit code 1, never a traceback."""
    try:
        cli.main(args=argv, prog_name="flotilla", standalone_mode=False)
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (CliError, FlotillaError, api.InvalidObjectError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except (ApiException, aiohttp.ClientError, OSError) as exc:
        click.echo(f"error: {kube.translate(exc)}", err=True)
        return 1
    return 0


def main() -> None:
    """The console script."""
    sys.exit(run_cli())
