"""The watcher service against a kubesim hub and a real nats-server: how policies
steer what is watched and published."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.common import events, kube
from flotilla.common.infra import NatsServer
from flotilla.common.service import started
from flotilla.common.testing import (
    CRD_DIR,
    eventually,
    kubeconfig_file,
    schemaless_crd,
    service_settings,
)
from flotilla.watcher import service

pytestmark = pytest.mark.integration

NS = "shop"
GADGET_CRD = schemaless_crd("example.com", "Gadget", "v1")


class Harness:
    def __init__(self, api: Any, dyn: DynamicClient, watcher: service.Watcher) -> None:
        self.api = api
        self.dyn = dyn
        self.watcher = watcher
        self.events: list[events.Envelope] = []

    async def on_message(self, msg: Msg) -> None:
        self.events.append(events.decode(msg.data))

    def observed(self, name: str) -> list[events.ResourceObserved]:
        return [
            e.payload
            for e in self.events
            if isinstance(e.payload, events.ResourceObserved) and e.payload.ref.name == name
        ]

    async def _resource(self, obj: Any) -> Any:
        return await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    async def create(self, obj: Any) -> Any:
        return (await self.dyn.create(await self._resource(obj), body=obj)).to_dict()

    async def create_before_its_rule(self, obj: Any, crd_name: str) -> Any:
        """Store `obj` as a hub did before its CRD gained the CEL rules it breaks (rules
        bind new writes only), so the watcher's own check is what must refuse it."""
        crds = await self.dyn.resources.get(
            api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
        )
        original = (await self.dyn.get(crds, name=crd_name)).to_dict()
        original["metadata"].pop("resourceVersion", None)
        await self.dyn.replace(crds, body=_without_rules(original), name=crd_name)
        try:
            return await self.create(obj)
        finally:
            await self.dyn.replace(crds, body=original, name=crd_name)

    async def patch(self, obj: Any, patch: Any) -> Any:
        meta = obj["metadata"]
        resource = await self._resource(obj)
        patched = await self.dyn.patch(
            resource,
            patch,
            name=meta["name"],
            namespace=meta.get("namespace"),
            content_type="application/merge-patch+json",
        )
        return patched.to_dict()

    async def warnings(self, reason: str, namespace: str = "default") -> list[str]:
        listed = await k8s.CoreV1Api(self.api).list_namespaced_event(namespace)
        return [e.message for e in listed.items if e.reason == reason]


def _without_rules(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_rules(v) for k, v in value.items() if k != "x-kubernetes-validations"}
    if isinstance(value, list):
        return [_without_rules(v) for v in value]
    return value


@contextlib.asynccontextmanager
async def harness(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> AsyncIterator[Harness]:
    hub = await kubesim_factory("hub", hub=True)
    settings = service_settings(
        "watcher", nats_server, f"ws{unique}", service.WatcherSettings, instance="w-1"
    )
    settings = settings.model_copy(update={"unserved_retry": 0.2})
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api, DynamicClient(api) as dyn:
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        namespace: Any = {"metadata": {"name": NS}}
        await k8s.CoreV1Api(api).create_namespace(namespace)
        nc = await nats.connect(nats_server.url)
        try:
            with kubeconfig_file(hub.kubeconfig()) as kubeconfig:
                settings = settings.model_copy(update={"hub_kubeconfig": kubeconfig})
                async with started(settings, service.setup) as running:
                    watcher = running.app
                    await eventually(watcher.started.is_set, what="the watcher to start")
                    h = Harness(api, dyn, watcher)
                    await nc.subscribe(f"ws{unique}.events.>", cb=h.on_message)
                    await nc.flush()
                    yield h
        finally:
            await nc.close()


def policy(name: str, kind: str = "ConfigMap", api_version: str = "v1", **spec: Any) -> Any:
    selectors = spec.pop("resourceSelectors", [{"apiVersion": api_version, "kind": kind}])
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ClusterPlacementPolicy",
        "metadata": {"name": name},
        "spec": {"resourceSelectors": selectors, **spec},
    }


def config_map(name: str, **labels: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"k": "v"},
    }


async def test_policy_edits_republish_and_unselected_objects_are_released(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with harness(kubesim_factory, nats_server, unique) as h:
        selected = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "labelSelector": {"matchLabels": {"sync": "yes"}},
            }
        ]
        cpp = await h.create(policy("maps", resourceSelectors=selected))
        await h.create(config_map("ignored"))
        synced = await h.create(config_map("synced", sync="yes"))
        first = (await eventually(lambda: h.observed("synced")))[0]
        assert first.policy_spec is not None and first.policy_spec.max_clusters is None

        await h.patch(cpp, {"spec": {"maxClusters": 2}})
        await eventually(lambda: len(h.observed("synced")) == 2)
        second = h.observed("synced")[1].policy_spec
        assert second is not None and second.max_clusters == 2

        await h.patch(synced, {"metadata": {"labels": {"sync": "no"}}})
        await eventually(lambda: len(h.observed("synced")) == 3)
        released = h.observed("synced")[2]
        assert released.policy is None and not released.deleted
        assert h.observed("ignored") == []


async def test_an_invalid_policy_is_reported_and_governs_nothing(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with harness(kubesim_factory, nats_server, unique) as h:
        # A weighted split without weights, stored before the CRD's rule refused it.
        await h.create_before_its_rule(
            policy("weighted", splitBy="weights"), "clusterplacementpolicies.flotilla.io"
        )
        messages = await eventually(lambda: h.warnings("InvalidPolicy"))
        assert "weights" in messages[0]
        await h.create(config_map("lonely"))
        await h.create(policy("fine", kind="Secret"))
        await eventually(lambda: [e for e in h.events if e.key.endswith("/fine")])
        await eventually(lambda: h.watcher.watched_types)
        assert [t.kind for t in h.watcher.watched_types] == ["Secret"]
        assert h.observed("lonely") == []


async def test_an_unusable_transformation_is_reported_to_its_author(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with harness(kubesim_factory, nats_server, unique) as h:
        # Both ways of choosing clusters in one rule: the contract allows exactly one.
        rule = {
            "targetClusters": ["eu-west"],
            "targetSelector": {"matchLabels": {"region": "eu"}},
            "patchType": "merge",
            "patch": {"metadata": {"labels": {"a": "b"}}},
        }
        await h.create_before_its_rule(
            {
                "apiVersion": "flotilla.io/v1alpha1",
                "kind": "Transformation",
                "metadata": {"name": "both", "namespace": NS},
                "spec": {"transformations": [rule]},
            },
            "transformations.flotilla.io",
        )
        messages = await eventually(lambda: h.warnings("InvalidTransformation", NS))
        assert "targetSelector" in messages[0]


async def test_a_selected_type_the_hub_does_not_serve_yet_is_watched_once_it_is(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with harness(kubesim_factory, nats_server, unique) as h:
        await h.create(policy("gadgets", kind="Gadget", api_version="example.com/v1"))
        messages = await eventually(lambda: h.warnings("UnknownType"))
        assert "Gadget" in messages[0]
        assert h.watcher.watched_types == []

        await k8s.ApiextensionsV1Api(h.api).create_custom_resource_definition(GADGET_CRD)
        gadget = {
            "apiVersion": "example.com/v1",
            "kind": "Gadget",
            "metadata": {"name": "g", "namespace": NS},
        }
        await h.create(gadget)
        await eventually(lambda: h.observed("g"))
        assert [t.kind for t in h.watcher.watched_types] == ["Gadget"]


async def test_clusters_and_config_objects_are_published(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with harness(kubesim_factory, nats_server, unique) as h:
        cluster = await h.create(
            {
                "apiVersion": "flotilla.io/v1alpha1",
                "kind": "Cluster",
                "metadata": {"name": "us-east", "labels": {"region": "us"}},
                "spec": {"kubeconfigSecretRef": {"namespace": "flotilla-system", "name": "us"}},
            }
        )
        transformation = {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "ClusterTransformation",
            "metadata": {"name": "gpu"},
            "spec": {
                "transformations": [
                    {"targetClusters": ["us-east"], "patchType": "merge", "patch": {"spec": {}}}
                ]
            },
        }
        await h.create(transformation)

        def clusters() -> list[events.ClusterObserved]:
            return [e.payload for e in h.events if isinstance(e.payload, events.ClusterObserved)]

        await eventually(clusters)
        assert clusters()[0].cluster == "us-east"
        await eventually(
            lambda: [e for e in h.events if e.key.endswith("ClusterTransformation/_/gpu")]
        )

        # A heartbeat (status) is news for a Cluster.
        resource = await h.dyn.resources.get(api_version="flotilla.io/v1alpha1", kind="Cluster")
        status = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Up",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        }
        await h.dyn.patch(
            resource.subresources["status"],
            status,
            name=cluster["metadata"]["name"],
            content_type="application/merge-patch+json",
        )
        await eventually(lambda: len(clusters()) == 2)
        assert clusters()[1].object["status"]["conditions"][0]["status"] == "True"
