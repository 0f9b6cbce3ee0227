"""`KubeHub`, what the transformer reads from the hub, against a kubesim hub."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.common import api, kube
from flotilla.common.errors import Unavailable
from flotilla.common.events import ObjectRef
from flotilla.common.testing import CRD_DIR
from flotilla.transformer.service import KubeHub

pytestmark = pytest.mark.integration


async def test_reads_objects_as_plain_json_and_a_missing_one_as_none(
    kubesim_factory: Any,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api_client:
        await kube.install_crds(api_client, CRD_DIR.glob("*.yaml"))
        core = client.CoreV1Api(api_client)
        await core.create_namespace({"metadata": {"name": "shop", "labels": {"team": "a"}}})
        await core.create_namespaced_config_map(
            "shop", {"metadata": {"name": "cfg"}, "data": {"a": "1"}}
        )
        custom = client.CustomObjectsApi(api_client)
        await custom.create_cluster_custom_object(
            api.GROUP,
            api.VERSION,
            "clusters",
            {
                "apiVersion": api.API_VERSION,
                "kind": "Cluster",
                "metadata": {"name": "east", "labels": {"region": "us"}},
                "spec": {},
            },
        )
        reader = KubeHub(await DynamicClient(api_client))
        namespace = await reader.get(ObjectRef(api_version="v1", kind="Namespace", name="shop"))
        cfg = await reader.get(
            ObjectRef(api_version="v1", kind="ConfigMap", name="cfg", namespace="shop")
        )
        missing = await reader.get(
            ObjectRef(api_version="v1", kind="ConfigMap", name="nope", namespace="shop")
        )
        unknown = await reader.get(ObjectRef(api_version="example.com/v1", kind="Nope", name="x"))
        clusters = await reader.clusters()
    assert type(namespace) is dict and type(cfg) is dict
    assert namespace["metadata"]["labels"]["team"] == "a"
    assert cfg["data"] == {"a": "1"} and cfg["metadata"]["namespace"] == "shop"
    assert missing is None and unknown is None
    assert list(clusters) == ["east"] and clusters["east"].labels == {"region": "us"}


async def test_a_refusing_hub_is_a_flotilla_error(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api_client:
        reader = KubeHub(await DynamicClient(api_client))
        ref = ObjectRef(api_version="v1", kind="Namespace", name="default")
        assert await reader.get(ref) is not None
        await hub.set_outage(True)
        try:
            with pytest.raises(Unavailable):
                await reader.get(ref)
        finally:
            await hub.set_outage(False)


async def test_a_clusters_facts_are_read_again_only_when_it_changed(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api_client:
        await kube.install_crds(api_client, CRD_DIR.glob("*.yaml"))
        custom = client.CustomObjectsApi(api_client)
        for name in ("east", "west"):
            body = {
                "apiVersion": api.API_VERSION,
                "kind": "Cluster",
                "metadata": {"name": name, "labels": {"region": "us"}},
                "spec": {},
            }
            await custom.create_cluster_custom_object(api.GROUP, api.VERSION, "clusters", body)
        reader = KubeHub(await DynamicClient(api_client), ttl=0)
        first = await reader.clusters()
        patch = [{"op": "replace", "path": "/metadata/labels/region", "value": "eu"}]
        await custom.patch_cluster_custom_object(api.GROUP, api.VERSION, "clusters", "west", patch)
        second = await reader.clusters()
    assert second["east"] is first["east"]  # unchanged: not parsed again
    assert second["west"].labels == {"region": "eu"} and first["west"].labels == {"region": "us"}


async def test_a_types_resource_is_discovered_once(
    kubesim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    looked_up: list[tuple[str, str]] = []
    real = kube.resource_for

    async def resource_for(dyn: DynamicClient, api_version: str, kind: str) -> Any:
        looked_up.append((api_version, kind))
        return await real(dyn, api_version, kind)

    monkeypatch.setattr(kube, "resource_for", resource_for)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api_client:
        reader = KubeHub(await DynamicClient(api_client))
        for name in ("default", "kube-system", "default"):
            ref = ObjectRef(api_version="v1", kind="Namespace", name=name)
            assert await reader.get(ref) is not None
        unknown = ObjectRef(api_version="example.com/v1", kind="Nope", name="x")
        assert await reader.get(unknown) is None
        assert await reader.get(unknown) is None  # not served: asked again each time
    assert looked_up == [
        ("v1", "Namespace"),
        ("example.com/v1", "Nope"),
        ("example.com/v1", "Nope"),
    ]
