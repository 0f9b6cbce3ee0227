"""The syncer composed as in production (`service.started`) against real parts: a
kubesim hub and members over HTTP, NATS JetStream, Redis. The tests publish the
`WorkRendered` events the transformer would."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from nats.aio.msg import Msg

from flotilla.common import api, builders, events, kube
from flotilla.common.bus import Bus
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.service import Started, started
from flotilla.common.testing import CRD_DIR, eventually, kubeconfig_file, service_settings
from flotilla.common.topology import Topology
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import KubeSimFactory, api_client
from flotilla.syncer.service import Syncer, SyncerSettings, setup

from .builders import config_map, deployment, work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SYSTEM = "flotilla-system"


class World:
    """A hub, members, the bus as the transformer and the operator see it."""

    def __init__(
        self,
        parts: Parts,
        hub: KubeSim,
        members: dict[str, KubeSim],
        bus: Bus,
        hub_api: ApiClient,
        hub_path: Path,
    ) -> None:
        self.parts = parts
        self.hub_path = hub_path
        self.hub = hub
        self.members = members
        self.bus = bus
        self.hub_api = hub_api
        self.prefix = parts.prefix
        self.seen: dict[str, list[events.Envelope]] = defaultdict(list)

    def settings(self, **extra: Any) -> SyncerSettings:
        """The syncer's settings in this world (a heartbeat every half second)."""
        return service_settings(
            "syncer",
            self.parts.nats,
            self.prefix,
            SyncerSettings,
            redis_url=self.parts.redis.url,
            capacity_prefix=f"{self.prefix}:capacity:",
            hub_kubeconfig=self.hub_path,
            heartbeat_interval=0.5,
            **extra,
        )

    async def on_message(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            envelope = events.decode(msg.data)
            self.seen[envelope.type].append(envelope)

    async def register(self, name: str, *, pull: bool = False) -> None:
        spec: dict[str, Any] = {}
        if not pull:
            secret: Any = {
                "metadata": {"name": name, "namespace": SYSTEM},
                "stringData": {"kubeconfig": json.dumps(self.members[name].kubeconfig())},
            }
            await k8s.CoreV1Api(self.hub_api).create_namespaced_secret(SYSTEM, secret)
            spec = {"kubeconfigSecretRef": {"namespace": SYSTEM, "name": name}}
        await k8s.CustomObjectsApi(self.hub_api).create_cluster_custom_object(
            "flotilla.io",
            "v1alpha1",
            "clusters",
            {
                "apiVersion": "flotilla.io/v1alpha1",
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    async def cluster(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await k8s.CustomObjectsApi(self.hub_api).get_cluster_custom_object(
            "flotilla.io", "v1alpha1", "clusters", name
        )
        return found

    async def ready(self, name: str) -> str | None:
        conditions = ((await self.cluster(name)).get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), None)

    def statuses(self, key: str, cluster: str) -> list[events.MemberStatusObserved]:
        found = []
        for envelope in self.seen["MemberStatusObserved"]:
            payload = envelope.payload
            assert isinstance(payload, events.MemberStatusObserved)
            if envelope.key == key and payload.cluster == cluster:
                found.append(payload)
        return found


async def member_object(member: KubeSim, path: str) -> dict[str, Any] | None:
    async with api_client(member) as api:
        try:
            return await kube_get(api, path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


async def kube_get(api: ApiClient, path: str) -> dict[str, Any]:
    from flotilla.syncer import rest

    return await rest.call(api, "GET", path)


JsonObject = dict[str, Any]
DEPLOY_PATH = "/apis/apps/v1/namespaces/shop/deployments/web"


@dataclass(frozen=True)
class Parts:
    """The real servers a test's world is built on."""

    factory: KubeSimFactory
    nats: NatsServer
    redis: RedisServer
    prefix: str


@pytest.fixture
def parts(
    kubesim_factory: KubeSimFactory, nats_server: NatsServer, redis_server: RedisServer, unique: str
) -> Parts:
    return Parts(kubesim_factory, nats_server, redis_server, f"sy{unique}")


@contextlib.asynccontextmanager
async def world(parts: Parts, members: tuple[str, ...] = ("east", "west")) -> AsyncIterator[World]:
    hub = await parts.factory("hub", hub=True)
    started_members = {
        name: await parts.factory(name, sim=SimOptions(nodes=2, pod_ready_seconds=0.2))
        for name in members
    }
    bus = await Bus.connect(
        parts.nats.url, topology=Topology(prefix=parts.prefix, partitions=2), producer="test"
    )
    nc = await nats.connect(parts.nats.url)
    try:
        async with api_client(hub) as hub_api:
            await kube.install_crds(hub_api, CRD_DIR.glob("*.yaml"))
            namespace: Any = {"metadata": {"name": SYSTEM}}
            await k8s.CoreV1Api(hub_api).create_namespace(namespace)
            with kubeconfig_file(hub.kubeconfig()) as hub_path:
                w = World(parts, hub, started_members, bus, hub_api, hub_path)
                await nc.subscribe(f"{parts.prefix}.events.>", cb=w.on_message)
                yield w
    finally:
        await nc.close()
        await bus.close()


@contextlib.asynccontextmanager
async def syncer(settings: SyncerSettings) -> AsyncIterator[Started[Syncer]]:
    async with started(settings, setup) as running:
        yield running


@contextlib.asynccontextmanager
async def east_with_a_deployment(
    parts: Parts,
) -> AsyncIterator[tuple[World, Started[Syncer], KubeSim, JsonObject]]:
    """One member, east, a syncer, and the Deployment ``shop/web`` applied there by a
    work: the world, the running syncer, the member and the manifest."""
    async with world(parts, members=("east",)) as w:
        await w.register("east")
        async with syncer(w.settings()) as running:
            east = w.members["east"]
            manifest = deployment(replicas=1)
            await w.bus.publish(work(manifest, "east"))
            await eventually(lambda: member_object(east, DEPLOY_PATH), timeout=20, what="applied")
            yield w, running, east, manifest


def handled(running: Started[Syncer]) -> float:
    """WorkRendered events the syncer has handled to the end."""
    value = running.runtime.registry.get_sample_value(
        "flotilla_events_handled_total", {"type": "WorkRendered"}
    )
    return value or 0.0


async def test_push_mode_applies_reports_repairs_and_removes(parts: Parts) -> None:
    async with world(parts) as w:
        await w.register("east")
        await w.register("west")
        async with syncer(w.settings()) as running:
            east = w.members["east"]
            manifest = deployment(replicas=3)
            key = events.ObjectRef.of(manifest).key
            # A namespaced object whose namespace does not exist there yet.
            await w.bus.publish(work(manifest, "east"))

            async def ready_report() -> bool:
                return any(s.ready for s in w.statuses(key, "east"))

            await eventually(ready_report, timeout=30, what="a ready MemberStatusObserved")
            stats = east.stats()
            assert stats["podsByPhase"].get("Running") == 3
            applied = await member_object(east, DEPLOY_PATH)
            assert applied is not None
            managers = {m["manager"] for m in applied["metadata"]["managedFields"]}
            assert "flotilla" in managers
            report = w.statuses(key, "east")[-1]
            assert (report.hub_generation, report.decision_id) == (1, "d1")
            assert await member_object(w.members["west"], DEPLOY_PATH) is None

            # Re-applying the same work changes nothing on the member.
            before_apply = await member_object(east, DEPLOY_PATH)
            reports = len(w.statuses(key, "east"))
            before = handled(running)
            await w.bus.publish(work(manifest, "east", seq=1))
            await eventually(lambda: handled(running) > before, what="the work handled")
            same = await member_object(east, DEPLOY_PATH)
            assert same is not None and before_apply is not None
            # (status updates by the member's controllers may bump the resourceVersion)
            assert same["metadata"]["generation"] == before_apply["metadata"]["generation"]
            assert _applied_by_flotilla(same) == _applied_by_flotilla(before_apply)
            assert len(w.statuses(key, "east")) == reports  # unchanged status: no event

            # Drift: an edit by hand of a field Flotilla manages is set back.
            async with api_client(east) as api:
                await k8s.AppsV1Api(api).patch_namespaced_deployment(
                    "web", "shop", {"spec": {"replicas": 1}}
                )

            async def replicas() -> int | None:
                found = await member_object(east, DEPLOY_PATH)
                return found["spec"]["replicas"] if found else None

            await eventually(lambda: _is(replicas(), 3), timeout=20, what="the replicas set back")
            # Deleted by hand: recreated.
            async with api_client(east) as api:
                await k8s.AppsV1Api(api).delete_namespaced_deployment("web", "shop")
            await eventually(lambda: member_object(east, DEPLOY_PATH), timeout=20, what="recreated")

            # Removal deletes it (and reports it gone).
            ref = events.ObjectRef.of(manifest)
            await w.bus.publish(work(None, "east", ref=ref, decision="d2"))

            async def deleted() -> bool:
                return await member_object(east, DEPLOY_PATH) is None

            await eventually(deleted, timeout=20, what="the member Deployment deleted")
            await eventually(lambda: not w.statuses(key, "east")[-1].exists, what="a gone report")


async def test_a_removal_during_a_repair_of_the_same_work_leaves_nothing_behind(
    parts: Parts,
) -> None:
    """A copy deleted on the member (its namespace's removal deletes every object in
    it) is being applied again by the agent's repair when the copy's own removal
    arrives: the removal waits for the repair and deletes what it re-created, never
    leaving a copy that no work describes."""
    async with east_with_a_deployment(parts) as (w, running, east, manifest):
        ref = events.ObjectRef.of(manifest)
        app = running.app
        real_apply = app.apply
        entered, gate = asyncio.Event(), asyncio.Event()

        async def held_apply(*args: Any, **kwargs: Any) -> bool:
            entered.set()  # the repair's apply: held until the removal is in
            await gate.wait()
            return await real_apply(*args, **kwargs)

        app.apply = held_apply  # type: ignore[method-assign]
        async with api_client(east) as api:
            await k8s.AppsV1Api(api).delete_namespaced_deployment("web", "shop")
        await asyncio.wait_for(entered.wait(), 20)
        before = handled(running)
        await w.bus.publish(work(None, "east", ref=ref, decision="d2"))
        await asyncio.sleep(1.0)  # time for a removal that did not wait to finish
        gate.set()
        await eventually(lambda: handled(running) > before, timeout=20, what="the removal")

        async def gone() -> bool:
            return await member_object(east, DEPLOY_PATH) is None

        await eventually(gone, timeout=20, what="no copy left on the member")
        await asyncio.sleep(1.0)
        assert await member_object(east, DEPLOY_PATH) is None


async def test_a_namespace_removed_before_its_last_object_is_not_created_again(
    parts: Parts,
) -> None:
    """The transformer removes a namespace and its last object by two works with
    different keys, in either order. When the namespace goes first, the member
    deletes the object with it; the agent must not take that for drift and create
    the object again (and a plain namespace for it), which the object's own removal
    would then leave behind as a namespace no work describes."""
    async with east_with_a_deployment(parts) as (w, running, east, manifest):
        ref = events.ObjectRef.of(manifest)
        namespace = builders.rendered(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
        )
        namespace_ref = events.ObjectRef.of(namespace)
        # Flotilla's own Namespace work claims the plain namespace the first apply made.
        await w.bus.publish(work(namespace, "east", dependency_of=[ref]))

        async def claimed() -> bool:
            found = await member_object(east, "/api/v1/namespaces/shop")
            return bool(found and api.ORIGIN_LABEL in (found["metadata"].get("labels") or {}))

        await eventually(claimed, timeout=20, what="the namespace claimed by its work")

        before = handled(running)
        await w.bus.publish(
            work(None, "east", ref=namespace_ref, decision="d2", dependency_of=[ref])
        )
        await eventually(lambda: handled(running) > before, timeout=20, what="ns removal")

        async def namespace_gone() -> bool:
            return await member_object(east, "/api/v1/namespaces/shop") is None

        await eventually(namespace_gone, timeout=20, what="the namespace deleted")
        await asyncio.sleep(2.0)  # the watch sees the Deployment go with it
        before = handled(running)
        await w.bus.publish(work(None, "east", ref=ref, decision="d2"))
        await eventually(lambda: handled(running) > before, timeout=20, what="the removal")
        await asyncio.sleep(1.0)
        assert await member_object(east, DEPLOY_PATH) is None
        assert await member_object(east, "/api/v1/namespaces/shop") is None


def _applied_by_flotilla(obj: dict[str, Any]) -> list[Any]:
    return [m for m in obj["metadata"]["managedFields"] if m["manager"] == "flotilla"]


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_never_deletes_what_flotilla_does_not_own(parts: Parts) -> None:
    async with world(parts, members=("east",)) as w:
        await w.register("east")
        east = w.members["east"]
        async with api_client(east) as api:
            core = k8s.CoreV1Api(api)
            await core.create_namespace({"metadata": {"name": "shop"}})  # type: ignore[arg-type]
            # The user's own ConfigMap with the same name: no origin label.
            await core.create_namespaced_config_map(
                "shop",
                {"metadata": {"name": "settings"}, "data": {"a": "b"}},  # type: ignore[arg-type]
            )
            # Flotilla's label, but it belongs to another hub object.
            other = config_map("shared")
            other["metadata"]["annotations"]["flotilla.io/origin"] = "v1/ConfigMap/shop/else"
            await core.create_namespaced_config_map("shop", other)  # type: ignore[arg-type]
        async with syncer(w.settings()) as running:
            for name in ("settings", "shared"):
                ref = events.ObjectRef(
                    api_version="v1", kind="ConfigMap", name=name, namespace="shop"
                )
                await w.bus.publish(work(None, "east", ref=ref))
            await eventually(lambda: handled(running) >= 2, what="both removals handled")
            # Neither object was deleted.
            for name in ("settings", "shared"):
                assert (
                    await member_object(east, f"/api/v1/namespaces/shop/configmaps/{name}")
                    is not None
                )


async def test_capacity_cluster_status_and_reservation_release(parts: Parts) -> None:
    async with world(parts, members=("east",)) as w:
        await w.register("east")
        cache = RedisCapacityCache.from_url(parts.redis.url, prefix=f"{parts.prefix}:capacity:")
        try:
            async with syncer(w.settings()):
                # Registering is all it takes: capacity in Redis, the Cluster Ready.
                async def record() -> Any:
                    return (await cache.snapshot(["east"])).get("east")

                first = await eventually(record, timeout=20, what="a capacity record")
                assert first.allocatable["cpu"] == 2 * 8000
                assert [n.name for n in first.nodes] and len(first.nodes) == 2
                await eventually(lambda: _is(w.ready("east"), "True"), timeout=20)
                status = (await w.cluster("east"))["status"]
                assert status["allocatable"]["cpu"] == "16"
                assert {"group": "apps", "version": "v1", "kind": "Deployment"} in status[
                    "apiResources"
                ]
                assert status["lastHeartbeatTime"]
                fields = (await w.cluster("east"))["metadata"]["managedFields"]
                assert any(f["manager"] == "flotilla-syncer" for f in fields)
                assert w.seen["CapacityChanged"]

                # The scheduler's reservation for the object, as it keys them.
                manifest = deployment(replicas=3)
                key = events.ObjectRef.of(manifest).key
                assert await cache.reserve("east", key, {"cpu": 100}, 3, ttl=300)
                await w.bus.publish(work(manifest, "east"))

                async def released() -> bool:
                    return not await cache.reservations("east")

                await eventually(released, timeout=30, what="the reservation released")
                # Released only once the record counts the pods.
                after = await record()
                assert after.available["cpu"] == first.available["cpu"] - 300
        finally:
            await cache.aclose()


async def test_a_down_member_is_not_ready_and_does_not_slow_the_others(parts: Parts) -> None:
    async with world(parts) as w:
        await w.register("east")
        await w.register("west")
        async with syncer(w.settings()):
            await eventually(lambda: _is(w.ready("east"), "True"), timeout=20)
            await w.members["east"].set_outage(True)
            await eventually(lambda: _is(w.ready("east"), "False"), timeout=10)
            # Many works for the down member are retried; the other's go through.
            for i in range(20):
                await w.bus.publish(work(config_map(f"c{i}"), "east"))
            await w.bus.publish(work(deployment(), "west"))
            await eventually(lambda: member_object(w.members["west"], DEPLOY_PATH), timeout=10)
            await w.members["east"].set_outage(False)
            await eventually(lambda: _is(w.ready("east"), "True"), timeout=20)
            await eventually(
                lambda: member_object(w.members["east"], "/api/v1/namespaces/shop/configmaps/c19"),
                timeout=30,
                what="the retried works applied once the member is back",
            )


async def test_pull_mode_serves_only_its_own_cluster(parts: Parts) -> None:
    async with world(parts) as w:
        await w.register("east")  # push: the hub-side syncer holds its kubeconfig
        await w.register("west", pull=True)  # pull: no Secret on the hub
        with kubeconfig_file(w.members["west"].kubeconfig()) as member_path:
            push = w.settings()
            pull = w.settings(
                instance="syncer-west",
                syncer_cluster="west",
                member_kubeconfig=member_path,
            )
            async with syncer(push) as pushed, syncer(pull) as pulled:
                await w.bus.publish(work(deployment(), "west"))
                await w.bus.publish(work(deployment(), "east"))
                await eventually(lambda: member_object(w.members["west"], DEPLOY_PATH), timeout=20)
                await eventually(lambda: member_object(w.members["east"], DEPLOY_PATH), timeout=20)
                await eventually(lambda: _is(w.ready("west"), "True"), timeout=20)
                # The pull-mode syncer knows one cluster only; it applied west's work.
                assert set(pulled.app.agents) == {"west"}
                # The hub-side syncer leaves the pulled cluster alone.
                assert set(pushed.app.agents) == {"east"}
                assert pushed.app.pull_clusters == {"west"}
                west = await member_object(w.members["west"], DEPLOY_PATH)
                assert west is not None
