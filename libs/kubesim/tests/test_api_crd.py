"""CRDs served dynamically: ApiextensionsV1Api, CustomObjectsApi and the DynamicClient."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient


def widget_crd(scope: str = "Namespaced") -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "shortNames": ["wd"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": schema,
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def widget(name: str, size: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": size},
    }


async def install_crd(client: Any) -> None:
    ext = k8s.ApiextensionsV1Api(client)
    created = await ext.create_custom_resource_definition(widget_crd())
    established = {c.type: c.status for c in created.status.conditions}
    assert established["Established"] == "True"


async def test_custom_objects_crud_and_status(client: Any) -> None:
    await install_crd(client)
    custom = k8s.CustomObjectsApi(client)
    args = ("example.com", "v1", "default", "widgets")
    created = await custom.create_namespaced_custom_object(*args, widget("w1"))
    assert created["metadata"]["generation"] == 1

    listed = await custom.list_namespaced_custom_object(*args)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]
    assert listed["kind"] == "WidgetList"

    patched = await custom.patch_namespaced_custom_object(
        *args, "w1", {"spec": {"size": 3}}, _content_type="application/merge-patch+json"
    )
    assert patched["spec"]["size"] == 3
    assert patched["metadata"]["generation"] == 2

    with_status = await custom.patch_namespaced_custom_object_status(
        *args, "w1", {"status": {"ready": True}}, _content_type="application/merge-patch+json"
    )
    assert with_status["status"] == {"ready": True}
    assert with_status["metadata"]["generation"] == 2

    current = await custom.get_namespaced_custom_object(*args, "w1")
    current["status"] = {"ready": False}
    current["spec"]["size"] = 4
    replaced = await custom.replace_namespaced_custom_object(*args, "w1", current)
    assert replaced["status"] == {"ready": True}  # main resource ignores status
    assert replaced["spec"]["size"] == 4

    jsonpatched = await custom.patch_namespaced_custom_object(
        *args, "w1", [{"op": "replace", "path": "/spec/size", "value": 5}]
    )
    assert jsonpatched["spec"]["size"] == 5

    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object(
            *args,
            "w1",
            {"spec": {"size": 6}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert err.value.status == 415

    await custom.delete_namespaced_custom_object(*args, "w1")
    with pytest.raises(ApiException) as err:
        await custom.get_namespaced_custom_object(*args, "w1")
    assert err.value.status == 404


async def test_crd_appears_in_discovery_and_disappears(client: Any) -> None:
    await install_crd(client)
    group = await k8s.ApisApi(client).get_api_versions()
    assert "example.com" in {g.name for g in group.groups}
    resources = await client.call_api(
        "/apis/example.com/v1",
        "GET",
        auth_settings=["BearerToken"],
        response_types_map={200: "V1APIResourceList"},
        _return_http_data_only=True,
    )
    assert {r.name for r in resources.resources} == {"widgets", "widgets/status"}
    await k8s.ApiextensionsV1Api(client).delete_custom_resource_definition("widgets.example.com")
    with pytest.raises(ApiException) as err:
        await k8s.CustomObjectsApi(client).list_namespaced_custom_object(
            "example.com", "v1", "default", "widgets"
        )
    assert err.value.status == 404


async def test_custom_object_watch(client: Any) -> None:
    await install_crd(client)
    custom = k8s.CustomObjectsApi(client)
    args = ("example.com", "v1", "default", "widgets")
    listed = await custom.list_namespaced_custom_object(*args)
    rv = listed["metadata"]["resourceVersion"]
    await custom.create_namespaced_custom_object(*args, widget("w"))
    async with watch.Watch() as w:
        stream = w.stream(
            custom.list_namespaced_custom_object, *args, resource_version=rv, timeout_seconds=5
        )
        event = await asyncio.wait_for(stream.__anext__(), 5)
    assert event["type"] == "ADDED"
    assert event["object"]["metadata"]["name"] == "w"


async def test_dynamic_client(client: Any, tmp_path: Path) -> None:
    await install_crd(client)
    dyn = await DynamicClient(client, cache_file=str(tmp_path / "discovery.json"))
    widgets = await dyn.resources.get(api_version="example.com/v1", kind="Widget")
    deployments = await dyn.resources.get(api_version="apps/v1", kind="Deployment")
    assert deployments.namespaced

    created = await dyn.create(widgets, body=widget("dyn"), namespace="default")
    assert created.metadata.name == "dyn"
    fetched = await dyn.get(widgets, name="dyn", namespace="default")
    assert fetched.spec.size == 1
    patched = await dyn.patch(
        widgets,
        body={"spec": {"size": 2}},
        name="dyn",
        namespace="default",
        content_type="application/merge-patch+json",
    )
    assert patched.spec.size == 2
    applied = await dyn.server_side_apply(
        widgets,
        body={**widget("dyn", size=7)},
        namespace="default",
        field_manager="dyn-test",
        force_conflicts=True,
    )
    assert applied.spec.size == 7
    listed = await dyn.get(widgets, namespace="default")
    assert [i.metadata.name for i in listed.items] == ["dyn"]

    events = []
    async for event in dyn.watch(widgets, namespace="default", timeout=1):
        events.append((event["type"], event["object"].metadata.name))
    assert events == [("ADDED", "dyn")]

    await dyn.delete(widgets, name="dyn", namespace="default")
    listed = await dyn.get(widgets, namespace="default")
    assert listed.items == []


async def test_cluster_scoped_crd(client: Any) -> None:
    crd = widget_crd(scope="Cluster")
    await k8s.ApiextensionsV1Api(client).create_custom_resource_definition(crd)
    custom = k8s.CustomObjectsApi(client)
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "global"}}
    await custom.create_cluster_custom_object("example.com", "v1", "widgets", obj)
    got = await custom.get_cluster_custom_object("example.com", "v1", "widgets", "global")
    assert "namespace" not in got["metadata"]


async def test_invalid_crd_is_422(client: Any) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "wrong.example.com"
    with pytest.raises(ApiException) as err:
        await k8s.ApiextensionsV1Api(client).create_custom_resource_definition(crd)
    assert err.value.status == 422
