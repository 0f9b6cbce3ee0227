"""The end-to-end fixture: a whole Flotilla installation for one test.

`Fleet` starts what an operator runs — a kubesim hub with the Flotilla CRDs,
member clusters (kubesim, each registered on the hub as a `Cluster` with its
kubeconfig Secret), real NATS JetStream and Redis (the session's servers, kept
apart by a unique stream and key prefix) — and every built service as a real OS
process (``python -m flotilla.<service>``), configured only through its
``FLOTILLA_*`` variables, exactly as in production. The test then talks to the
hub as a user would and reads the bus as an operator would.

With the syncer among the services, registering a member (its kubeconfig Secret
and `Cluster`) is all it takes: the syncer writes the capacity record and the
Cluster's Ready status. A fleet started without the syncer (``services=`` without
it) has `Fleet.register` write both by hand instead (`Fleet.by_hand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.cli.environment import MEMBERS, NODES, member_capacity, member_objects
from flotilla.common import events, kube
from flotilla.common.bus import Bus
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.testing import CRD_DIR, eventually
from flotilla.common.topology import Topology
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import KubeSimFactory
from flotilla.scheduler import service as scheduler_service

SYSTEM_NAMESPACE = "flotilla-system"
SERVICES = (
    "watcher",
    "depdetector",
    "scheduler",
    "transformer",
    "syncer",
    "aggregator",
    "drain",
)
"""The services built so far, started in this order."""
STARTUP = 180.0
"""Seconds for the services to come up: several Python processes importing at once
on a small shared machine take a while."""
HEARTBEAT = 1.0
"""The syncer's heartbeat in the fixture (seconds): Ready and capacity come quickly."""


class Fleet:
    def __init__(
        self,
        *,
        hub: KubeSim,
        members: dict[str, KubeSim],
        nats_server: NatsServer,
        redis_server: RedisServer,
        prefix: str,
        state: Path,
        by_hand: bool = False,
    ) -> None:
        self.hub = hub
        self.by_hand = by_hand
        """Write capacity records and Ready by hand (no syncer in this fleet)."""
        self.members = members
        self.nats_server = nats_server
        self.redis_server = redis_server
        self.prefix = prefix
        self.state = state
        self.hub_kubeconfig = state / "hub.kubeconfig"
        self.api: ApiClient
        self.dyn: DynamicClient
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.seen: dict[str, list[events.Envelope]] = defaultdict(list)

    # --- the environment ------------------------------------------------------------

    def env(self, service: str) -> dict[str, str]:
        return {
            **os.environ,
            "FLOTILLA_NATS_URL": self.nats_server.url,
            "FLOTILLA_REDIS_URL": self.redis_server.url,
            "FLOTILLA_STREAM_PREFIX": self.prefix,
            "FLOTILLA_CAPACITY_PREFIX": f"{self.prefix}:capacity:",
            "FLOTILLA_PARTITIONS": "4",
            "FLOTILLA_HUB_KUBECONFIG": str(self.hub_kubeconfig),
            "FLOTILLA_HEALTH_HOST": "127.0.0.1",
            "FLOTILLA_HEALTH_PORT": "0",
            "FLOTILLA_INSTANCE": f"{service}-1",
            "FLOTILLA_LOG_LEVEL": "INFO",
            "FLOTILLA_HEARTBEAT_INTERVAL": str(HEARTBEAT),
        }

    async def start_service(self, service: str) -> None:
        log = (self.state / f"{service}.log").open("ab")
        self.processes[service] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"flotilla.{service}",
            env=self.env(service),
            stdout=log,
            stderr=log,
        )
        log.close()

    async def stop_service(self, service: str, *, kill: bool = False) -> int:
        process = self.processes.pop(service)
        if process.returncode is None:
            if kill:
                process.kill()
            else:
                process.terminate()
        try:
            return await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            return await process.wait()

    def log(self, service: str) -> str:
        return (self.state / f"{service}.log").read_text(errors="replace")

    async def register(
        self, name: str, labels: Mapping[str, str], *, nodes: int = NODES, ready: bool = True
    ) -> None:
        """A member as an operator registers it: its kubeconfig Secret and `Cluster`;
        and, in a fleet without the syncer (`by_hand`), its capacity record and
        Ready status."""
        core = k8s.CoreV1Api(self.api)
        secret, cluster = member_objects(
            name, labels, json.dumps(self.members[name].kubeconfig()), SYSTEM_NAMESPACE
        )
        await core.create_namespaced_secret(SYSTEM_NAMESPACE, secret)
        created = await self.create(cluster)
        if not self.by_hand:
            return
        cache = RedisCapacityCache.from_url(
            self.redis_server.url, prefix=f"{self.prefix}:capacity:"
        )
        try:
            await cache.put(member_capacity(name, gpu=False, nodes=nodes))
        finally:
            await cache.aclose()
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "Registered",
                    "message": "registered by the end-to-end fixture",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
        resource = await kube.resource_for(self.dyn, "flotilla.io/v1alpha1", "Cluster")
        body = {**created, "status": status}
        kube.checked(await self.dyn.replace(resource.status, body=body, name=name))

    async def ready(self, name: str) -> str | None:
        """The status of the member's Ready condition on the hub (None: not reported)."""
        obj: dict[str, Any] = await k8s.CustomObjectsApi(self.api).get_cluster_custom_object(
            "flotilla.io", "v1alpha1", "clusters", name
        )
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), None)

    async def all_ready(self) -> bool:
        return all([await self.ready(name) == "True" for name in self.members])

    async def scheduler_sees_ready(self) -> bool:
        """Whether the scheduler's own view of the clusters (what it decides against)
        has every member Ready: the hub's status reaches it through the watcher."""
        bus = await Bus.connect(
            self.nats_server.url,
            topology=Topology(prefix=self.prefix, partitions=4),
            producer="fleet",
            ensure=False,
        )
        try:
            return await scheduler_service.sees_ready(bus, self.members)
        finally:
            await bus.close()

    # --- the hub, as a user --------------------------------------------------------------

    async def create(self, obj: Mapping[str, Any]) -> Any:
        resource = await kube.resource_for(self.dyn, obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"].get("namespace")
        return kube.checked(await self.dyn.create(resource, body=dict(obj), namespace=namespace))

    async def delete(self, obj: Mapping[str, Any]) -> None:
        resource = await kube.resource_for(self.dyn, obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        kube.checked(
            await self.dyn.delete(resource, name=meta["name"], namespace=meta.get("namespace"))
        )

    async def warnings(self, namespace: str, reason: str | None = None) -> list[Any]:
        listed = await k8s.CoreV1Api(self.api).list_namespaced_event(namespace)
        return [
            e
            for e in listed.items
            if e.type == "Warning" and (reason is None or e.reason == reason)
        ]

    # --- the bus, as an operator -----------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            envelope = events.decode(msg.data)
            self.seen[envelope.type].append(envelope)

    def of(self, event_type: str, key: str | None = None) -> list[events.Envelope]:
        return [e for e in self.seen[event_type] if key is None or e.key == key]

    async def wait_for(
        self,
        event_type: str,
        key: str,
        *,
        where: Callable[[events.Envelope], bool] = lambda _: True,
        timeout: float = 45.0,
    ) -> events.Envelope:
        def found() -> events.Envelope | None:
            return next((e for e in reversed(self.of(event_type, key)) if where(e)), None)

        try:
            result: events.Envelope = await eventually(
                found, timeout=timeout, what=f"{event_type} {key}"
            )
        except AssertionError as exc:
            logs = "\n".join(f"--- {s}\n{self.log(s)[-3000:]}" for s in self.processes)
            raise AssertionError(f"{exc}\n{logs}") from None
        return result


@contextlib.asynccontextmanager
async def running_fleet(
    kubesim_factory: KubeSimFactory,
    nats_server: NatsServer,
    redis_server: RedisServer,
    prefix: str,
    state: Path,
    *,
    members: Mapping[str, Mapping[str, str]] = MEMBERS,
    services: Sequence[str] = SERVICES,
) -> AsyncIterator[Fleet]:
    hub = await kubesim_factory("hub", hub=True)
    started = {name: await kubesim_factory(name, sim=SimOptions(nodes=NODES)) for name in members}
    fleet = Fleet(
        hub=hub,
        members=started,
        nats_server=nats_server,
        redis_server=redis_server,
        prefix=prefix,
        state=state,
        by_hand="syncer" not in services,
    )
    hub.write_kubeconfig(fleet.hub_kubeconfig)
    api = await k8s_config.new_client_from_config_dict(hub.kubeconfig(), context=hub.name)
    nc = await nats.connect(nats_server.url)
    try:
        async with api, DynamicClient(api) as dyn:
            fleet.api, fleet.dyn = api, dyn
            await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
            core = k8s.CoreV1Api(api)
            namespace: Any = {"metadata": {"name": SYSTEM_NAMESPACE}}
            await core.create_namespace(namespace)
            await nc.subscribe(f"{prefix}.events.>", cb=fleet._on_message)
            await nc.flush()
            for name, labels in members.items():
                await fleet.register(name, labels)
            try:
                for service in services:
                    await fleet.start_service(service)
                # On a loaded machine six Python processes take a while to import and
                # connect; a test's own waits start once every service is up.
                await eventually(
                    lambda: all(f"{s} started" in fleet.log(s) for s in services),
                    timeout=240,
                    what="every service started",
                )
                if not fleet.by_hand:
                    # The syncer reports the members Ready once it is up; a test starts
                    # from a fleet whose members can take work.
                    await eventually(fleet.all_ready, timeout=STARTUP, what="every member Ready")
                    if "scheduler" in services:
                        await eventually(
                            fleet.scheduler_sees_ready,
                            timeout=STARTUP,
                            what="the scheduler seeing every member Ready",
                        )
                yield fleet
            finally:
                for service in list(fleet.processes):
                    await fleet.stop_service(service)
    finally:
        await nc.close()


def fleet_fixture(members: Mapping[str, Mapping[str, str]] = MEMBERS) -> Any:
    """A pytest fixture running a whole fleet with `members` for one test (assign it
    to a module-level name: that name is the fixture's)."""

    @pytest.fixture
    async def fixture(
        kubesim_factory: KubeSimFactory,
        nats_server: NatsServer,
        redis_server: RedisServer,
        unique: str,
        tmp_path: Path,
    ) -> AsyncIterator[Fleet]:
        async with running_fleet(
            kubesim_factory, nats_server, redis_server, f"e2e{unique}", tmp_path, members=members
        ) as running:
            yield running

    return fixture
