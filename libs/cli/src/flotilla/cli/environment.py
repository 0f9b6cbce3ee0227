"""The embedded environment: a whole Flotilla installation on one machine.

``flotilla up`` starts, as background processes that outlive the command, real
nats-server (JetStream, file store under the state directory, 8 MiB payloads as
`flotilla.common.infra` sets them), Redis, a kubesim hub with the Flotilla CRDs,
N kubesim member clusters, and every service whose package has a ``__main__``
module — each on its own health port, configured only through ``FLOTILLA_*``
variables, exactly as in production. It registers each member as a `Cluster`
with its kubeconfig Secret, waits until every service's ``/readyz`` answers 200,
and writes ``env.json`` (what runs where) and one kubeconfig with a context per
cluster.

``env.json`` is also the record of what to stop: every process is listed with
its pid and its start time (from ``/proc``), so ``flotilla down`` stops exactly
what ``up`` started and never a process that later reused the pid.

Until the syncer exists, ``up`` plays its part for registration: it writes each
member's capacity record into Redis and marks the `Cluster` Ready. When
``flotilla.syncer`` is installed, the syncer reports both itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from pydantic import BaseModel, ConfigDict, Field

from flotilla.cli.errors import CliError
from flotilla.common import capacity, kube
from flotilla.common.config import DEFAULT_SYSTEM_NAMESPACE
from flotilla.common.errors import FlotillaError
from flotilla.common.infra import InfraError, NatsServer, RedisServer, free_port
from flotilla.common.rediscapacity import DEFAULT_PREFIX, RedisCapacityCache

REPO = Path(__file__).resolve().parents[5]
CRD_DIR = Path(os.environ.get("FLOTILLA_CRD_DIR") or REPO / "deploy" / "k8s" / "crds")
"""The CRDs a hub gets (``FLOTILLA_CRD_DIR`` where the repository is not at hand,
as in the container image)."""

SERVICES = ("watcher", "depdetector", "scheduler", "transformer", "syncer", "aggregator", "drain")
"""Every Flotilla service, in start order."""

MEMBERS: Mapping[str, Mapping[str, str]] = {
    "us-east": {"region": "us-east", "zone": "us-east-1a", "provider": "aws"},
    "us-west": {"region": "us-west", "zone": "us-west-2b", "provider": "aws"},
    "eu-central": {
        "region": "eu-central",
        "zone": "eu-central-1a",
        "provider": "gcp",
        "gpu": "v100",
    },
}
NODES = 3
NODE = {"cpu": 8000, "memory": 32 * 2**30, "pods": 110}
GPUS_PER_NODE = 4
GPU = "nvidia.com/gpu"
PARTITIONS = 4
"""Fewer partitions than production's default: seven services share one laptop."""
STREAM_PREFIX = "flotilla"
STARTUP_TIMEOUT = 120.0
ENV_FILE = "env.json"
KUBECONFIG_FILE = "kubeconfig"


def member_labels(count: int) -> dict[str, dict[str, str]]:
    """The first `count` members' names and labels: the three defaults, then more."""
    names = dict(MEMBERS)
    regions = ("ap-south", "sa-east", "af-south", "me-central")
    index = 0
    while len(names) < count:
        region = regions[index % len(regions)]
        name = region if index < len(regions) else f"{region}-{index // len(regions) + 1}"
        names[name] = {"region": region, "zone": f"{region}-1a", "provider": "aws"}
        index += 1
    return {name: dict(labels) for name, labels in list(names.items())[:count]}


def installed_services() -> list[str]:
    """The services whose ``flotilla.<name>.__main__`` module exists, in start order."""
    found = []
    for name in SERVICES:
        try:
            if importlib.util.find_spec(f"flotilla.{name}.__main__") is not None:
                found.append(name)
        except ModuleNotFoundError:
            continue
    return found


# --- env.json ----------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Process(_Model):
    pid: int
    started: str = ""
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``)."""
    log: str = ""


class HubInfo(Process):
    kubeconfig: str


class ClusterInfo(Process):
    kubeconfig: str
    labels: dict[str, str] = Field(default_factory=dict)


class ServiceInfo(Process):
    health: str
    """``http://host:port/healthz``; ``/readyz`` is next to it."""


class EnvFile(_Model):
    """The contents of ``STATE_DIR/env.json``."""

    nats_url: str
    redis_url: str
    hub: HubInfo
    clusters: dict[str, ClusterInfo]
    services: dict[str, ServiceInfo]
    kubeconfig: str
    stream_prefix: str = STREAM_PREFIX
    capacity_prefix: str = DEFAULT_PREFIX
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE
    infra: dict[str, Process] = Field(default_factory=dict)
    """nats and redis."""

    def processes(self) -> list[tuple[str, Process]]:
        """Everything `up` started, in the order `down` stops it."""
        return [
            *self.services.items(),
            *self.clusters.items(),
            ("hub", self.hub),
            *self.infra.items(),
        ]


def env_path(state_dir: Path) -> Path:
    return state_dir / ENV_FILE


def load(state_dir: Path) -> EnvFile:
    """The running environment's description, or a `CliError` saying how to start one."""
    path = env_path(state_dir)
    if not path.exists():
        installed = from_variables(os.environ)
        if installed is not None:
            return installed
        raise CliError(f"no Flotilla environment in {state_dir} (start one with `flotilla up`)")
    try:
        return EnvFile.model_validate_json(path.read_text())
    except ValueError as exc:
        raise CliError(f"{path} is not a Flotilla environment file: {exc}") from None


def from_variables(environ: Mapping[str, str]) -> EnvFile | None:
    """An installation `up` did not start (compose, Kubernetes), described by the
    services' own ``FLOTILLA_*`` variables; None without a hub kubeconfig."""
    hub = environ.get("FLOTILLA_HUB_KUBECONFIG")
    if not hub:
        return None
    return EnvFile(
        nats_url=environ.get("FLOTILLA_NATS_URL", "nats://127.0.0.1:4222"),
        redis_url=environ.get("FLOTILLA_REDIS_URL", "redis://127.0.0.1:6379/0"),
        hub=HubInfo(pid=0, kubeconfig=hub),
        clusters={},
        services={},
        kubeconfig=hub,
        stream_prefix=environ.get("FLOTILLA_STREAM_PREFIX", STREAM_PREFIX),
        capacity_prefix=environ.get("FLOTILLA_CAPACITY_PREFIX", DEFAULT_PREFIX),
    )


def save(state_dir: Path, env: EnvFile) -> None:
    path = env_path(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(env.model_dump(mode="json"), indent=2) + "\n")
    os.replace(tmp, path)


# --- processes -------------------------------------------------------------------------


def started_at(pid: int) -> str:
    """The start time of `pid` from /proc ("" where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def alive(process: Process) -> bool:
    """True while the recorded process (same pid *and* start time) still runs."""
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(process.pid, 0)
        except OSError:
            return False
        return True
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    return not process.started or fields[19] == process.started


def stop(process: Process, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; False when it was not running."""
    if not alive(process):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(process) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(process):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        while alive(process) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    return True


def _spawn(command: list[str], log: Path, env: Mapping[str, str] | None = None) -> Process:
    """A detached child (own session, output to `log`) that outlives this command."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    # Our child until this command exits; then init reaps it. Popen must not warn
    # about a child it deliberately leaves running.
    popen.returncode = 0
    return Process(pid=popen.pid, started=started_at(popen.pid), log=str(log))


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _wait(check: Callable[[], bool], what: str, process: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive(process):
            last = _tail(process.log, 1).strip()
            raise CliError(
                f"{what} exited during start-up ({last or 'no output'}); see {process.log}"
            )
        time.sleep(0.1)
    raise CliError(f"{what} was not ready after {timeout:.0f}s; see {process.log}")


def ready(health: str) -> tuple[bool, str]:
    """(ready, detail) from a service's ``/readyz`` next to its `health` URL."""
    url = health.rsplit("/", 1)[0] + "/readyz"
    try:
        # The URL is the loopback http:// address `up` recorded.
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
            return response.status == 200, "ready"
    except urllib.error.HTTPError as exc:
        return False, f"not ready ({exc.code}): {exc.read().decode(errors='replace')[:200]}"
    except OSError as exc:
        return False, f"no answer: {exc}"


# --- up / down / status -------------------------------------------------------------------


@dataclass
class Started:
    env: EnvFile
    fresh: bool
    """False when `up` found an environment already running."""


def running(state_dir: Path) -> EnvFile | None:
    """The environment recorded in `state_dir` if any of its processes still runs."""
    if not env_path(state_dir).exists():
        return None
    env = load(state_dir)
    return env if any(alive(p) for _, p in env.processes()) else None


def up(
    state_dir: Path,
    clusters: int = len(MEMBERS),
    *,
    echo: Callable[[str], None] = lambda _: None,
    timeout: float = STARTUP_TIMEOUT,
) -> Started:
    """Start the environment (module docstring), or report the one already running."""
    if clusters < 1:
        raise CliError("--clusters must be 1 or more")
    state_dir = state_dir.resolve()
    current = running(state_dir)
    if current is not None:
        return Started(current, fresh=False)
    state_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("nats", "redis", "logs", "clusters"):
        shutil.rmtree(state_dir / stale, ignore_errors=True)
    env_path(state_dir).unlink(missing_ok=True)
    logs = state_dir / "logs"
    launched: list[Process] = []
    try:
        return Started(_start(state_dir, clusters, logs, launched, echo, timeout), fresh=True)
    except BaseException:
        for process in reversed(launched):
            stop(process, timeout=5)
        raise


def _start(
    state_dir: Path,
    count: int,
    logs: Path,
    launched: list[Process],
    echo: Callable[[str], None],
    timeout: float,
) -> EnvFile:
    echo("starting nats-server (JetStream) and Redis")
    for data in ("nats", "redis"):
        (state_dir / data).mkdir(parents=True, exist_ok=True)
    try:
        nats = NatsServer(data_dir=state_dir / "nats").start(timeout=30)
        launched.append(_recorded(nats.process, nats.log_path))
        redis = RedisServer(data_dir=state_dir / "redis").start(timeout=30)
        launched.append(_recorded(redis.process, redis.log_path))
    except InfraError as exc:
        raise CliError(str(exc).splitlines()[0]) from None
    infra = {"nats": launched[0], "redis": launched[1]}

    kubeconfigs = state_dir / "clusters"
    members = member_labels(count)
    echo(f"starting the kubesim hub and {len(members)} member clusters")
    sims: dict[str, Process] = {}
    for name in ("hub", *members):
        command = [
            sys.executable, "-m", "flotilla.kubesim",
            "--name", name, "--port", "0", "--kubeconfig", str(kubeconfigs / f"{name}.yaml"),
        ]  # fmt: skip
        if name == "hub":
            command.append("--hub")
        else:
            command += ["--nodes", str(NODES)]
            if "gpu" in members[name]:
                command += ["--node-gpus", str(GPUS_PER_NODE)]
        sims[name] = _spawn(command, logs / f"kubesim-{name}.log")
        launched.append(sims[name])
    for name, process in sims.items():
        _wait(functools.partial(_announced, process), f"kubesim {name}", process, 60)

    services = installed_services()
    syncer = "syncer" in services
    echo("registering the member clusters on the hub")
    asyncio.run(
        register(
            kubeconfigs / "hub.yaml",
            {name: (kubeconfigs / f"{name}.yaml", labels) for name, labels in members.items()},
            redis_url=redis.url,
            capacity_prefix=DEFAULT_PREFIX,
            mark_ready=not syncer,
        )
    )

    hub_kubeconfig = str(kubeconfigs / "hub.yaml")
    started: dict[str, ServiceInfo] = {}
    for name in services:
        port = free_port()
        variables = {
            **os.environ,
            "FLOTILLA_NATS_URL": nats.url,
            "FLOTILLA_REDIS_URL": redis.url,
            "FLOTILLA_HUB_KUBECONFIG": hub_kubeconfig,
            "FLOTILLA_STREAM_PREFIX": STREAM_PREFIX,
            "FLOTILLA_CAPACITY_PREFIX": DEFAULT_PREFIX,
            "FLOTILLA_PARTITIONS": str(PARTITIONS),
            "FLOTILLA_HEALTH_HOST": "127.0.0.1",
            "FLOTILLA_HEALTH_PORT": str(port),
            "FLOTILLA_INSTANCE": f"{name}-0",
            "FLOTILLA_SYSTEM_NAMESPACE": DEFAULT_SYSTEM_NAMESPACE,
        }
        process = _spawn(
            [sys.executable, "-m", f"flotilla.{name}"], logs / f"{name}.log", variables
        )
        launched.append(process)
        started[name] = ServiceInfo(
            **process.model_dump(), health=f"http://127.0.0.1:{port}/healthz"
        )
    missing = [s for s in SERVICES if s not in services]
    echo(
        f"waiting for {len(services)} services to be ready"
        + (f" (not installed: {', '.join(missing)})" if missing else "")
    )
    for name, info in started.items():
        _wait(functools.partial(_ready, info), f"service {name}", info, timeout)

    merged = state_dir / KUBECONFIG_FILE
    write_kubeconfig(merged, [kubeconfigs / f"{name}.yaml" for name in ("hub", *members)])
    env = EnvFile(
        nats_url=nats.url,
        redis_url=redis.url,
        hub=HubInfo(**sims["hub"].model_dump(), kubeconfig=hub_kubeconfig),
        clusters={
            name: ClusterInfo(
                **sims[name].model_dump(),
                kubeconfig=str(kubeconfigs / f"{name}.yaml"),
                labels=labels,
            )
            for name, labels in members.items()
        },
        services=started,
        kubeconfig=str(merged),
        infra=infra,
    )
    save(state_dir, env)
    return env


def _announced(process: Process) -> bool:
    """kubesim prints ``READY <url>`` once its kubeconfig is written."""
    return "READY" in _tail(process.log, 200)


def _ready(service: ServiceInfo) -> bool:
    return ready(service.health)[0]


def _recorded(popen: subprocess.Popen[bytes] | None, log: Path) -> Process:
    if popen is None:
        raise CliError("a server stopped during start-up")
    popen.returncode = 0  # left running on purpose (see `_spawn`)
    return Process(pid=popen.pid, started=started_at(popen.pid), log=str(log))


def write_kubeconfig(target: Path, sources: list[Path]) -> None:
    """One kubeconfig holding every source's cluster, user and context; current: the first."""
    merged: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
        "preferences": {},
    }
    for source in sources:
        document = yaml.safe_load(source.read_text())
        for section in ("clusters", "users", "contexts"):
            merged[section].extend(document.get(section) or [])
        merged.setdefault("current-context", document.get("current-context"))
    tmp = target.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(merged, sort_keys=False))
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)


def member_objects(
    name: str,
    labels: Mapping[str, str],
    kubeconfig: str,
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
) -> tuple[Any, dict[str, Any]]:
    """What registers a member on the hub: its kubeconfig Secret and its `Cluster`."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": system_namespace},
        "stringData": {"kubeconfig": kubeconfig},
    }
    cluster = {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "kubeconfigSecretRef": {
                "namespace": system_namespace,
                "name": name,
                "key": "kubeconfig",
            }
        },
    }
    return secret, cluster


async def _apply(
    dyn: DynamicClient, resource: Any, body: dict[str, Any], name: str, namespace: str | None
) -> dict[str, Any]:
    return kube.checked(
        await dyn.server_side_apply(
            resource,
            body=body,
            name=name,
            namespace=namespace,
            field_manager="flotilla-register",
            force_conflicts=True,
        )
    )


async def register(
    hub_kubeconfig: Path,
    members: Mapping[str, tuple[Path, Mapping[str, str]]],
    *,
    redis_url: str,
    capacity_prefix: str,
    mark_ready: bool,
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
) -> None:
    """Install the CRDs and register each member as an operator would: its kubeconfig
    Secret and `Cluster`; with `mark_ready` (no syncer installed) also its capacity
    record in Redis and a Ready condition."""
    api = await kube.client_from_kubeconfig(hub_kubeconfig)
    cache = RedisCapacityCache.from_url(redis_url, prefix=capacity_prefix)
    try:
        async with api, DynamicClient(api) as dyn:
            crds = await asyncio.to_thread(lambda: sorted(CRD_DIR.glob("*.yaml")))
            await kube.install_crds(api, crds)
            core = k8s.CoreV1Api(api)
            with contextlib.suppress(ApiException):
                namespace: Any = {"metadata": {"name": system_namespace}}
                await core.create_namespace(namespace)
            resource = await kube.resource_for(dyn, "flotilla.io/v1alpha1", "Cluster")
            for name, (kubeconfig, labels) in members.items():
                text = await asyncio.to_thread(kubeconfig.read_text)
                secret, cluster = member_objects(name, labels, text, system_namespace)
                # Server-side apply: registering again (a restarted compose, a second
                # `flotilla register`) updates what is there instead of failing.
                secrets = await kube.resource_for(dyn, "v1", "Secret")
                await _apply(dyn, secrets, secret, name, system_namespace)
                created = await _apply(dyn, resource, cluster, name, None)
                if mark_ready:
                    await cache.put(member_capacity(name, gpu="gpu" in labels))
                    status = {
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "Registered",
                                "message": "registered by flotilla up (no syncer installed)",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                        ]
                    }
                    body = {**created, "status": status}
                    kube.checked(await dyn.replace(resource.status, body=body, name=name))
    except (ApiException, FlotillaError) as exc:
        raise CliError(f"registering the clusters on the hub failed: {exc}") from None
    finally:
        await cache.aclose()


def member_capacity(name: str, *, gpu: bool, nodes: int = NODES) -> capacity.ClusterCapacity:
    """What a kubesim member started by `up` offers (its nodes as `_start` sizes them)."""
    node = {**NODE, GPU: GPUS_PER_NODE} if gpu else dict(NODE)
    return capacity.uniform(name, node, nodes, observed_at=time.time())


def reachable_as(kubeconfig: Path, host: str, target: Path) -> Path:
    """A copy of `kubeconfig` whose server is reached under `host` (a container's name
    on a compose network) instead of the address the server bound to."""
    document = yaml.safe_load(kubeconfig.read_text())
    for entry in document.get("clusters") or []:
        server = urllib.parse.urlsplit(entry["cluster"]["server"])
        port = f":{server.port}" if server.port else ""
        entry["cluster"]["server"] = urllib.parse.urlunsplit(
            (server.scheme, f"{host}{port}", server.path, "", "")
        )
        if server.scheme == "https":
            # kubesim's certificate names the address it bound to and localhost,
            # never the name other containers reach it by.
            entry["cluster"].setdefault("tls-server-name", "localhost")
    target.write_text(yaml.safe_dump(document, sort_keys=False))
    os.chmod(target, 0o600)
    return target


def down(state_dir: Path) -> list[str]:
    """Stop what `up` recorded in `state_dir`; the names of those that were running."""
    state_dir = state_dir.resolve()
    env = load(state_dir)
    stopped = [name for name, process in env.processes() if stop(process)]
    env_path(state_dir).unlink(missing_ok=True)
    return stopped


@dataclass(frozen=True)
class Health:
    name: str
    role: str
    pid: int
    running: bool
    detail: str


def status(env: EnvFile) -> list[Health]:
    """Each recorded process: running or not, and a service's readiness."""
    rows = []
    for name, process in env.processes():
        role = (
            "service"
            if name in env.services
            else "member"
            if name in env.clusters
            else "hub"
            if name == "hub"
            else "infra"
        )
        up_now = alive(process)
        detail = "running" if up_now else "stopped"
        if up_now and isinstance(process, ServiceInfo):
            detail = ready(process.health)[1]
        rows.append(Health(name, role, process.pid, up_now, detail))
    return rows


async def set_outage(kubeconfig: Path | str, *, down: bool) -> None:
    """Start or end a simulated outage of the kubesim cluster `kubeconfig` names
    (its fault endpoint: every API request but this one fails while it lasts)."""
    api_client = await kube.client_from_kubeconfig(kubeconfig)
    async with api_client:
        await api_client.call_api(
            "/sim/v1/outage",
            "POST",
            body={"down": down},
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_types_map={"200": "object"},
            _return_http_data_only=True,
        )
