"""The autoscaling/v1 `scale` subresource of workloads and of CRDs that declare one."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException


def deployment() -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }


async def test_deployment_scale(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await apps.create_namespaced_deployment("default", deployment())
    scale = await apps.read_namespaced_deployment_scale("web", "default")
    assert scale.spec.replicas == 2
    assert scale.status.selector == "app=web"

    patched = await apps.patch_namespaced_deployment_scale(
        "web", "default", {"spec": {"replicas": 5}}
    )
    assert patched.spec.replicas == 5
    dep = await apps.read_namespaced_deployment("web", "default")
    assert dep.spec.replicas == 5
    assert dep.metadata.generation == 2

    scale = await apps.read_namespaced_deployment_scale("web", "default")
    scale.spec.replicas = 1
    replaced = await apps.replace_namespaced_deployment_scale("web", "default", scale)
    assert replaced.spec.replicas == 1

    with pytest.raises(ApiException) as err:
        await apps.replace_namespaced_deployment_scale("web", "default", scale)  # stale
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        await apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": -1}})
    assert err.value.status == 422


async def test_custom_resource_scale(client: Any) -> None:
    crd = {
        "metadata": {"name": "flinks.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "flinks", "kind": "Flink"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.parallelism",
                            "statusReplicasPath": ".status.running",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                }
            ],
        },
    }
    await k8s.ApiextensionsV1Api(client).create_custom_resource_definition(crd)
    custom = k8s.CustomObjectsApi(client)
    args = ("example.com", "v1", "default", "flinks")
    await custom.create_namespaced_custom_object(
        *args,
        {
            "apiVersion": "example.com/v1",
            "kind": "Flink",
            "metadata": {"name": "f"},
            "spec": {"parallelism": 3},
        },
    )
    await custom.patch_namespaced_custom_object_status(
        *args,
        "f",
        {"status": {"running": 2, "selector": "app=f"}},
        _content_type="application/merge-patch+json",
    )
    scale = await custom.get_namespaced_custom_object_scale(*args, "f")
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"] == {"replicas": 2, "selector": "app=f"}
    await custom.patch_namespaced_custom_object_scale(
        *args, "f", {"spec": {"replicas": 6}}, _content_type="application/merge-patch+json"
    )
    obj = await custom.get_namespaced_custom_object(*args, "f")
    assert obj["spec"]["parallelism"] == 6
