"""The detector service on a real nats-server and a kubesim hub, fed by hand-made
`ResourceObserved` / `ConfigChanged` events (no watcher)."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.common import events, kube
from flotilla.common.api import DEPENDENCIES_ANNOTATION, STRATEGY_ANNOTATION, GroupVersionKind
from flotilla.common.builders import FLINK_INTERPRETER, container, manifest, pod_spec, template
from flotilla.common.dispatch import EventBus
from flotilla.common.infra import NatsServer
from flotilla.common.service import started
from flotilla.common.testing import (
    CRD_DIR,
    eventually,
    kubeconfig_file,
    schemaless_crd,
    service_settings,
)
from flotilla.depdetector import service
from flotilla.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

NS = "shop"
FLINK_CRD = schemaless_crd("flink.apache.org", "FlinkDeployment", "v1beta1")


class Setup:
    """The hub, its clients, the detector's runtime and what it published."""

    def __init__(self, hub: KubeSim, api: Any, dyn: DynamicClient) -> None:
        self.hub = hub
        self.api = api
        self.dyn = dyn
        self.bus: EventBus
        self.analyzed: list[events.Envelope] = []
        self.detector: service.Detector

    async def on_message(self, msg: Msg) -> None:
        self.analyzed.append(events.decode(msg.data))

    def analyses(self, name: str) -> list[events.ResourceAnalyzed]:
        return [
            e.payload
            for e in self.analyzed
            if isinstance(e.payload, events.ResourceAnalyzed) and e.payload.ref.name == name
        ]

    async def create(self, obj: Any) -> dict[str, Any]:
        resource = await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        return kube.checked(await self.dyn.create(resource, body=obj))

    async def get(self, obj: Any) -> dict[str, Any]:
        resource = await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        return kube.checked(
            await self.dyn.get(resource, name=meta["name"], namespace=meta.get("namespace"))
        )

    async def delete(self, obj: Any) -> None:
        resource = await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        kube.checked(
            await self.dyn.delete(resource, name=meta["name"], namespace=meta.get("namespace"))
        )

    async def patch(self, obj: Any, patch: Any) -> dict[str, Any]:
        resource = await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        return kube.checked(
            await self.dyn.patch(
                resource,
                patch,
                name=meta["name"],
                namespace=meta.get("namespace"),
                content_type="application/merge-patch+json",
            )
        )

    async def observe(
        self, obj: dict[str, Any], *, deleted: bool = False, revision: int | None = None
    ) -> events.Envelope:
        """Publish what the watcher would for `obj`."""
        ref = events.ObjectRef.of(obj)
        payload = events.ResourceObserved(ref=ref, object=obj, deleted=deleted)
        meta = obj["metadata"]
        envelope = events.envelope(
            payload,
            key=ref.key,
            producer="test",
            uid=meta.get("uid", ""),
            generation=meta.get("generation", 0),
            revision=int(meta.get("resourceVersion", 0)) if revision is None else revision,
            dedupe=(json.dumps(obj, sort_keys=True),),
        )
        await self.bus.publish(envelope)
        return envelope

    async def warnings(self, reason: str) -> list[str]:
        listed = await k8s.CoreV1Api(self.api).list_namespaced_event(NS)
        return [e.message for e in listed.items if e.reason == reason and e.type == "Warning"]


@contextlib.asynccontextmanager
async def detector(
    kubesim_factory: Any,
    nats_server: NatsServer,
    unique: str,
    *,
    before: tuple[Any, ...] = (),
    refresh_interval: float = 60.0,
) -> AsyncIterator[Setup]:
    hub: KubeSim = await kubesim_factory("hub", hub=True)
    settings = service_settings(
        "depdetector",
        nats_server,
        f"dd{unique}",
        service.DetectorSettings,
        instance="d-1",
        interpreter_refresh=refresh_interval,
    )
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api, DynamicClient(api) as dyn:
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        await k8s.ApiextensionsV1Api(api).create_custom_resource_definition(FLINK_CRD)
        namespace: Any = {"metadata": {"name": NS}}
        await k8s.CoreV1Api(api).create_namespace(namespace)
        with kubeconfig_file(hub.kubeconfig()) as kubeconfig:
            settings = settings.model_copy(update={"hub_kubeconfig": kubeconfig})
            setup = Setup(hub, api, dyn)
            for obj in before:  # before the detector starts: what it finds at start
                await setup.create(obj)
            async with started(settings, service.setup) as running:
                setup.bus = running.runtime.bus
                nc = await nats.connect(nats_server.url)
                try:
                    await nc.subscribe(f"dd{unique}.events.ResourceAnalyzed.*", cb=setup.on_message)
                    await nc.flush()
                    setup.detector = running.app
                    yield setup
                finally:
                    await nc.close()


def web(**annotations: str) -> dict[str, Any]:
    spec = pod_spec(
        container(requests={"cpu": "100m"}),
        serviceAccountName="web-sa",
        volumes=[{"name": "c", "configMap": {"name": "web-config"}}],
    )
    return manifest(
        "apps/v1",
        "Deployment",
        {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template(spec)},
        name="web",
        namespace=NS,
        annotations=dict(annotations) or None,
    )


def config_map(name: str) -> dict[str, Any]:
    return manifest("v1", "ConfigMap", name=name, namespace=NS, data={"k": "v"})


# --- tests ------------------------------------------------------------------------------


async def test_a_rerun_on_the_same_object_writes_nothing(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with detector(
        kubesim_factory, nats_server, unique, before=(config_map("web-config"),)
    ) as s:
        created = await s.create(web())
        await s.observe(created)
        await eventually(lambda: s.analyses("web"))
        written = await s.get(created)
        value = written["metadata"]["annotations"][DEPENDENCIES_ANNOTATION]
        assert [e["name"] for e in json.loads(value)] == ["web-config", "web-sa"]
        assert any("ServiceAccount shop/web-sa" in m for m in await s.warnings("DependencyMissing"))
        assert not any("web-config" in m for m in await s.warnings("DependencyMissing"))

        # The watcher would not republish this, but a redelivery may: no second write.
        await s.observe(written)
        await eventually(lambda: len(s.analyses("web")) == 2)
        again = await s.get(created)
        assert again["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


async def test_a_concurrent_user_edit_is_not_overwritten(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with detector(kubesim_factory, nats_server, unique) as s:
        created = await s.create(web())
        mine = [{"apiVersion": "v1", "kind": "Secret", "name": "extra"}]
        await s.patch(
            created, {"metadata": {"annotations": {DEPENDENCIES_ANNOTATION: json.dumps(mine)}}}
        )
        # An observation from before the user's edit arrives late.
        await s.observe(created)
        await eventually(lambda: s.analyses("web"))
        value = (await s.get(created))["metadata"]["annotations"][DEPENDENCIES_ANNOTATION]
        entries = json.loads(value)
        assert entries[0] == {**mine[0], "detected": False}
        assert [e["name"] for e in entries[1:]] == ["web-config", "web-sa"]


async def test_invalid_objects_are_reported_and_dead_lettered_while_others_flow(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with detector(kubesim_factory, nats_server, unique) as s:
        bad_strategy = await s.create(web(**{STRATEGY_ANNOTATION: "everywhere"}))
        broken = copy.deepcopy(web(**{DEPENDENCIES_ANNOTATION: "[{not json"}))
        broken["metadata"]["name"] = "broken"
        broken = await s.create(broken)
        good = await s.create(config_map("fine"))
        for obj in (bad_strategy, broken, good):
            await s.observe(obj)
        await eventually(lambda: s.analyses("fine"))

        strategy_warnings = await eventually(lambda: s.warnings("InvalidObject"))
        assert "unknown strategy 'everywhere'" in strategy_warnings[0]
        dependency_warnings = await eventually(lambda: s.warnings("InvalidDependencies"))
        assert "flotilla.io/dependencies: not JSON" in dependency_warnings[0]
        letters = await eventually(s.bus.dead_letters)
        assert sorted(letter.reason for letter in letters) == ["InvalidObject", "InvalidObject"]
        assert s.analyses("web") == [] and s.analyses("broken") == []


async def test_deletions_are_analysed_as_deleted(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with detector(kubesim_factory, nats_server, unique) as s:
        gone = web()
        gone["metadata"].update(uid="u-1", resourceVersion="40")
        await s.observe(gone, deleted=True)
        analysed = (await eventually(lambda: s.analyses("web")))[0]
        assert analysed.deleted and analysed.strategy == "split"


async def test_stale_observations_are_dropped(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with detector(kubesim_factory, nats_server, unique) as s:
        newer = config_map("cm")
        newer["metadata"].update(uid="u-1", resourceVersion="50", labels={"v": "new"})
        older = copy.deepcopy(newer)
        older["metadata"].update(resourceVersion="40", labels={"v": "old"})
        newest = copy.deepcopy(newer)
        newest["metadata"].update(resourceVersion="60", labels={"v": "newest"})
        await s.observe(newer)
        await eventually(lambda: s.analyses("cm"))
        # One key's events are handled in order: once the newest is analysed, the
        # stale one in between has been handled too.
        await s.observe(older)
        await s.observe(newest)
        await eventually(lambda: len(s.analyses("cm")) == 2)
        assert [a.object["metadata"]["labels"]["v"] for a in s.analyses("cm")] == ["new", "newest"]


async def test_resource_interpreters_are_loaded_at_start_and_follow_changes(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    flink = manifest(
        "flink.apache.org/v1beta1",
        "FlinkDeployment",
        {
            "serviceAccount": "flink",
            "jobManager": {
                "replicas": 1,
                "podTemplate": template(pod_spec(container(requests={"cpu": "1"}))),
            },
            "taskManager": {
                "replicas": 3,
                "podTemplate": template(pod_spec(container(requests={"cpu": "2"}))),
            },
        },
        name="job",
        namespace=NS,
    )
    async with detector(kubesim_factory, nats_server, unique, before=(FLINK_INTERPRETER,)) as s:
        created = await s.create(flink)
        await s.observe(created)
        analysed = (await eventually(lambda: s.analyses("job")))[0]
        assert analysed.strategy == "any"
        assert [(c.name, c.replicas, c.requests) for c in analysed.components] == [
            ("jobmanager", 1, {"cpu": 1000}),
            ("taskmanager", 3, {"cpu": 2000}),
        ]
        assert [(d.kind, d.name) for d in analysed.dependencies] == [("ServiceAccount", "flink")]

        # The interpreter is deleted: the type falls back to an opaque `any`.
        interpreter = await s.get(FLINK_INTERPRETER)
        await s.delete(FLINK_INTERPRETER)
        change = events.ConfigChanged(
            ref=events.ObjectRef.of(interpreter), object=interpreter, deleted=True
        )
        await s.bus.publish(
            events.envelope(change, key=change.ref.key, producer="test", revision=99)
        )
        relabelled = await s.patch(created, {"metadata": {"labels": {"round": "2"}}})
        flink_type = GroupVersionKind("flink.apache.org", "v1beta1", "FlinkDeployment")
        await eventually(lambda: s.detector.registry.lookup(flink_type).source == "default")
        await s.observe(relabelled)
        latest = (await eventually(lambda: s.analyses("job")[1:]))[0]
        assert latest.components == []


async def test_interpreters_written_to_the_hub_are_picked_up_without_an_event(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    # Another replica consumed the ConfigChanged: this one only sees the hub.
    flink_type = GroupVersionKind("flink.apache.org", "v1beta1", "FlinkDeployment")
    async with detector(kubesim_factory, nats_server, unique, refresh_interval=0.2) as s:
        assert s.detector.registry.lookup(flink_type).source == "default"
        await s.create(FLINK_INTERPRETER)
        await eventually(lambda: s.detector.registry.lookup(flink_type).source != "default")
        assert s.detector.registry.lookup(flink_type).source == "ResourceInterpreter/flink"


async def test_a_member_kubeconfig_is_never_a_dependency_of_a_users_object(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """A Deployment in namespace ``bad`` names the Secret holding a member cluster's
    kubeconfig, by annotation; a custom resource there names it by a generic
    reference. Neither analysis carries it, both authors hear why, and what they
    may depend on still flows."""
    member_secret = {"apiVersion": "v1", "kind": "Secret", "name": "us-east"}
    in_system = {**member_secret, "namespace": "flotilla-system"}
    async with detector(kubesim_factory, nats_server, unique) as s:
        core = k8s.CoreV1Api(s.api)
        for namespace in ("bad", "flotilla-system"):
            await core.create_namespace({"metadata": {"name": namespace}})
        await s.create(
            manifest("v1", "Secret", name="us-east", namespace="flotilla-system", data={})
        )
        by_annotation = web(**{DEPENDENCIES_ANNOTATION: json.dumps([in_system])})
        by_annotation["metadata"]["namespace"] = "bad"
        by_reference = manifest(
            "flink.apache.org/v1beta1",
            "FlinkDeployment",
            {
                "kubeconfig": in_system,
                "config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c"},
            },
            name="flink",
            namespace="bad",
        )
        for obj in (by_annotation, by_reference):
            await s.observe(await s.create(obj))
        await eventually(lambda: s.analyses("web") and s.analyses("flink"))

        for name in ("web", "flink"):
            (analysed,) = s.analyses(name)
            assert all(d.namespace == "bad" for d in analysed.dependencies), analysed.dependencies
            assert not any(d.name == "us-east" for d in analysed.dependencies)
        assert {d.name for d in s.analyses("flink")[0].dependencies} == {"c"}
        assert {d.name for d in s.analyses("web")[0].dependencies} == {"web-config", "web-sa"}

        async def refused() -> list[str]:
            listed = await core.list_namespaced_event("bad")
            return [e.involved_object.name for e in listed.items if e.reason == "DependencyRefused"]

        async def both_refused() -> bool:
            return sorted(await refused()) == ["flink", "web"]

        await eventually(both_refused, what="a DependencyRefused Event on each object")
        written = await s.get(by_reference)
        assert "us-east" not in written["metadata"]["annotations"][DEPENDENCIES_ANNOTATION]


async def test_a_253_character_name_with_a_missing_dependency_is_analysed_and_reported(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """The Event's name must stay a valid name however long the object's is, and a
    failure to report would not stop the analysis either."""
    long_name = "w" * 253
    async with detector(kubesim_factory, nats_server, unique) as s:
        obj = web()
        obj["metadata"]["name"] = long_name
        await s.observe(await s.create(obj))
        (analysed,) = await eventually(lambda: s.analyses(long_name))
        assert {d.name for d in analysed.dependencies} == {"web-config", "web-sa"}
        (missing,) = await eventually(lambda: s.warnings("DependencyMissing"))
        assert "ConfigMap shop/web-config" in missing
