"""The drain coordinator on a real nats-server and a kubesim hub, fed by hand-made
`ResourceAnalyzed`, `PlacementDecided`, `MemberStatusObserved` and
`ClusterObserved` events, as the detector, scheduler, syncer and watcher publish
them; what it sends (``RescheduleRequested``) is read from the bus."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.common import builders, events, kube
from flotilla.common.api import (
    FAILOVER_HISTORY_ANNOTATION,
    PlacementPolicySpec,
    PlacementState,
    Strategy,
)
from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.common.dispatch import EventBus
from flotilla.common.infra import NatsServer
from flotilla.common.service import started
from flotilla.common.testing import CRD_DIR, eventually, kubeconfig_file, service_settings
from flotilla.drain import service
from flotilla.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

NS = "shop"
A, R = PlacementState.ACTIVE, PlacementState.RETIRING
CLUSTER = "flotilla.io/v1alpha1"


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Setup:
    def __init__(self, dyn: DynamicClient, api: Any) -> None:
        self.dyn = dyn
        self.api = api
        self.bus: EventBus
        self.apps: list[service.Coordinator] = []
        self.requests: list[events.Envelope] = []
        self._n = 0

    @property
    def app(self) -> service.Coordinator:
        return self.apps[0]

    async def on_request(self, msg: Msg) -> None:
        self.requests.append(events.decode(msg.data))

    def commands(self, key: str) -> list[events.RescheduleRequested]:
        found = []
        for envelope in self.requests:
            if isinstance(envelope.payload, events.RescheduleRequested) and envelope.key == key:
                found.append(envelope.payload)
        return found

    async def publish(self, payload: events.AnyPayload, key: str, revision: int = 0) -> None:
        self._n += 1
        await self.bus.publish(
            events.envelope(payload, key=key, producer="test", revision=revision, dedupe=(self._n,))
        )

    async def resource(self, api_version: str, kind: str) -> Any:
        return await kube.resource_for(self.dyn, api_version, kind)

    async def create(self, obj: Any) -> dict[str, Any]:
        resource = await self.resource(obj["apiVersion"], obj["kind"])
        return kube.checked(await self.dyn.create(resource, body=obj))

    async def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Any:
        resource = await self.resource(api_version, kind)
        return kube.checked(await self.dyn.get(resource, name=name, namespace=namespace))

    async def cluster(
        self,
        name: str,
        *,
        ready: bool = True,
        since: datetime | None = None,
        unschedulable: bool = False,
        evict_after: datetime | None = None,
    ) -> None:
        """Write the Cluster on the hub (spec as the admin, Ready as the syncer) and
        publish what the watcher would."""
        resource = await self.resource(CLUSTER, "Cluster")
        spec: dict[str, Any] = {"unschedulable": unschedulable}
        spec["evictAfter"] = stamp(evict_after) if evict_after else None
        if await kube.get_or_none(self.dyn, resource, name) is None:
            await self.create(
                {"apiVersion": CLUSTER, "kind": "Cluster", "metadata": {"name": name}}
            )
        kube.checked(
            await self.dyn.patch(
                resource,
                {"spec": spec},
                name=name,
                content_type="application/merge-patch+json",
            )
        )
        ready_condition = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "Heartbeat",
            "lastTransitionTime": stamp(since or datetime.now(UTC)),
        }
        # As the syncer writes it: server-side apply of its own condition only.
        applied = {
            "apiVersion": CLUSTER,
            "kind": "Cluster",
            "metadata": {"name": name},
            "status": {"conditions": [ready_condition]},
        }
        updated = kube.checked(
            await self.dyn.server_side_apply(
                resource.subresources["status"],
                body=applied,
                name=name,
                field_manager="flotilla-syncer",
                force_conflicts=True,
            )
        )
        await self.observe_cluster(updated)

    async def observe_cluster(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        revision = int(obj["metadata"]["resourceVersion"])
        await self.publish(
            events.ClusterObserved(cluster=name, object=obj), f"cluster/{name}", revision
        )

    async def conditions(self, name: str) -> dict[str, str]:
        obj = await self.get(CLUSTER, "Cluster", name)
        return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}

    async def analyzed(
        self, obj: Any, *, replicas: int, policy: dict[str, Any] | None = None
    ) -> None:
        ref = events.ObjectRef.of(obj)
        spec = None
        if policy is not None:
            spec = PlacementPolicySpec.model_validate(
                {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}], **policy}
            )
        payload = events.ResourceAnalyzed(
            ref=ref, object=obj, strategy=Strategy.SPLIT, replicas=replicas, policy_spec=spec
        )
        await self.publish(payload, ref.key)

    async def placed(self, obj: Any, *clusters: tuple[str, int, PlacementState]) -> None:
        decision = builders.decided(obj, *clusters, decision_id=f"d{self._n}")
        await self.publish(decision, decision.ref.key)

    async def member(self, obj: Any, cluster: str, available: int, ready: bool) -> None:
        ref = events.ObjectRef.of(obj)
        observed = events.MemberStatusObserved(
            ref=ref, cluster=cluster, status={"availableReplicas": available}, ready=ready
        )
        await self.publish(observed, ref.key)

    async def warnings(self, reason: str) -> list[str]:
        listed = await k8s.CoreV1Api(self.api).list_namespaced_event(NS)
        return [e.message for e in listed.items if e.reason == reason and e.type == "Warning"]


@contextlib.asynccontextmanager
async def coordinators(
    kubesim_factory: Any,
    nats_server: NatsServer,
    prefix: str,
    *,
    replicas: int = 1,
    **overrides: Any,
) -> AsyncIterator[Setup]:
    hub: KubeSim = await kubesim_factory("hub", hub=True)
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api, DynamicClient(api) as dyn:
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        namespace: Any = {"metadata": {"name": NS}}
        await k8s.CoreV1Api(api).create_namespace(namespace)
        setup = Setup(dyn, api)
        with kubeconfig_file(hub.kubeconfig()) as kubeconfig:
            async with contextlib.AsyncExitStack() as stack:
                for i in range(replicas):
                    settings = service_settings(
                        "drain",
                        nats_server,
                        prefix,
                        service.DrainSettings,
                        instance=f"drain-{i}",
                        hub_kubeconfig=kubeconfig,
                        max_sleep=0.5,
                        **overrides,
                    )
                    running = await stack.enter_async_context(started(settings, service.setup))
                    setup.apps.append(running.app)
                    setup.bus = running.runtime.bus
                nc = await nats.connect(nats_server.url)
                stack.push_async_callback(nc.close)
                await nc.subscribe(f"{prefix}.events.RescheduleRequested.*", cb=setup.on_request)
                await nc.flush()
                yield setup


def web(replicas: int = 3, **strategy: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "web"}},
        "template": template(pod_spec(container())),
    }
    if strategy:
        spec["strategy"] = {"rollingUpdate": strategy}
    return manifest("apps/v1", "Deployment", spec, name="web", namespace=NS)


async def test_cordon_drain_at_evict_after_release_after_ready_drained_and_uncordon(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with coordinators(kubesim_factory, nats_server, f"dr{unique}") as s:
        obj = await s.create(web())
        key = events.ObjectRef.of(obj).key
        await s.cluster("a")
        await s.cluster("b")
        await s.analyzed(obj, replicas=3)
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", 3, True)

        await s.cluster("a", unschedulable=True)

        async def cordoned() -> bool:
            return await s.conditions("a") == {
                "Ready": "True",  # the syncer's condition survives the coordinator's apply
                "Cordoned": "True",
                "Draining": "False",
                "Drained": "False",
            }

        await eventually(cordoned, what="a Cordoned, Ready kept")
        assert s.commands(key) == []

        evict_at = datetime.now(UTC) + timedelta(seconds=2)
        await s.cluster("a", unschedulable=True, evict_after=evict_at)
        # Nothing else arrives: the coordinator acts at evictAfter on its own timer.
        await eventually(lambda: s.commands(key), timeout=10, what="the avoid request")
        ((request,),) = [[e for e in s.requests if e.key == key]]
        assert request.produced_at >= evict_at - timedelta(seconds=1)  # hub time has 1 s grain
        assert s.commands(key)[0].avoid_clusters == ["a"]

        await s.placed(obj, ("b", 3, A), ("a", 3, R))  # the scheduler moves it
        await s.member(obj, "b", 1, False)

        def reported() -> bool:
            entry = s.app.objects_view.get(key)
            return entry is not None and "b" in entry.value.members

        await eventually(reported, what="b's report recorded")
        assert [c.release_retiring for c in s.commands(key)] == [[]]
        await s.member(obj, "b", 3, True)
        await eventually(lambda: len(s.commands(key)) == 2, what="the release")
        assert s.commands(key)[1].release_retiring == ["a"]

        async def draining() -> bool:
            return (await s.conditions("a")).get("Draining") == "True"

        await eventually(draining, what="Draining while the copy retires")
        await s.placed(obj, ("b", 3, A))  # the scheduler drops the Retiring copy

        async def drained() -> Any:
            cluster = await s.get(CLUSTER, "Cluster", "a")
            conditions = {c["type"]: c["status"] for c in cluster["status"]["conditions"]}
            return conditions.get("Drained") == "True" and cluster["status"]["placements"] == 0

        await eventually(drained, what="Drained with placements 0")

        await s.cluster("a")  # uncordoned

        async def cleared() -> bool:
            conditions = await s.conditions("a")
            return (
                conditions["Cordoned"] == conditions["Drained"] == conditions["Draining"] == "False"
            )

        await eventually(cleared, what="uncordon clears Cordoned and Drained")


async def test_a_copy_not_ready_by_the_timeout_is_released_with_a_warning(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with coordinators(kubesim_factory, nats_server, f"dr{unique}", drain_timeout=1.0) as s:
        obj = await s.create(web(4, maxUnavailable=1))  # floor 3
        key = events.ObjectRef.of(obj).key
        await s.cluster("b")
        await s.cluster(
            "a", unschedulable=True, evict_after=datetime.now(UTC) - timedelta(seconds=1)
        )
        await s.analyzed(obj, replicas=4)
        await s.placed(obj, ("a", 4, A))
        await eventually(lambda: s.commands(key), what="the avoid request")
        await s.placed(obj, ("b", 4, A), ("a", 4, R))
        await s.member(obj, "b", 3, False)  # 3 of 4: the floor holds, not every replica
        await eventually(lambda: len(s.commands(key)) == 2, timeout=10, what="the release")
        assert s.commands(key)[1].release_retiring == ["a"]
        (message,) = await eventually(lambda: s.warnings("DrainTimeout"), what="the Warning")
        assert "3 ready, at least 3 needed" in message


async def test_failover_moves_records_history_and_fails_back_after_settling(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with coordinators(kubesim_factory, nats_server, f"dr{unique}", settle_seconds=1.0) as s:
        obj = await s.create(web())
        key = events.ObjectRef.of(obj).key
        await s.cluster("a")
        await s.cluster("b")
        policy = {"failover": {"tolerationSeconds": 1, "failback": True}}
        await s.analyzed(obj, replicas=3, policy=policy)
        await s.placed(obj, ("a", 3, A))
        await s.cluster("a", ready=False)
        await eventually(lambda: s.commands(key), timeout=10, what="failover request")
        assert s.commands(key)[0].avoid_clusters == ["a"]
        await s.placed(obj, ("b", 3, A), ("a", 3, R))
        # The failed copy is not waited for: released before b reports anything.
        await eventually(lambda: len(s.commands(key)) == 2, what="release at once")
        assert s.commands(key)[1].release_retiring == ["a"]

        async def history() -> Any:
            hub = await s.get("apps/v1", "Deployment", "web", NS)
            return (hub["metadata"].get("annotations") or {}).get(FAILOVER_HISTORY_ANNOTATION)

        (entry,) = json.loads(await eventually(history, what="failover history"))
        assert (entry["from"], entry["to"]) == ("a", "b")

        await s.placed(obj, ("b", 3, A))
        await s.cluster("a", ready=True)
        await eventually(lambda: len(s.commands(key)) == 3, timeout=10, what="failback request")
        failback = s.commands(key)[2]
        assert "failback to a" in failback.reason and not failback.release_retiring


async def test_two_replicas_drain_an_object_once(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with coordinators(kubesim_factory, nats_server, f"dr{unique}", replicas=2) as s:
        obj = await s.create(web())
        key = events.ObjectRef.of(obj).key
        await s.cluster("b")
        await s.analyzed(obj, replicas=3)
        await s.placed(obj, ("a", 3, A))
        for app in s.apps:  # both replicas know the object before the drain begins
            await eventually(lambda app=app: app.objects_view.get(key), what="record followed")
        await s.cluster(
            "a", unschedulable=True, evict_after=datetime.now(UTC) + timedelta(seconds=1)
        )
        await eventually(lambda: s.commands(key), timeout=10, what="the avoid request")
        await eventually(
            lambda: all(not app._dirty for app in s.apps), what="both replicas planned"
        )
        for app in s.apps:
            await app.tick(datetime.now(UTC))
        assert len(s.commands(key)) == 1
        assert sum(app.commands_sent for app in s.apps) == 1
