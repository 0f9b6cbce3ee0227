"""Finalizers and ownerReference garbage collection through the typed clients."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException


def owner_ref(owner: Any, kind: str, api_version: str, block: bool = False) -> k8s.V1OwnerReference:
    return k8s.V1OwnerReference(
        api_version=api_version,
        kind=kind,
        name=owner.metadata.name,
        uid=owner.metadata.uid,
        block_owner_deletion=block or None,
    )


async def make_tree(client: Any) -> tuple[Any, Any, Any]:
    """Deployment -> ReplicaSet -> Pod, linked by ownerReferences."""
    apps, core = k8s.AppsV1Api(client), k8s.CoreV1Api(client)
    labels = {"app": "gc"}
    template = k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
    )
    selector = k8s.V1LabelSelector(match_labels=labels)
    dep = await apps.create_namespaced_deployment(
        "default",
        k8s.V1Deployment(
            metadata=k8s.V1ObjectMeta(name="gc"),
            spec=k8s.V1DeploymentSpec(selector=selector, template=template),
        ),
    )
    rs = await apps.create_namespaced_replica_set(
        "default",
        k8s.V1ReplicaSet(
            metadata=k8s.V1ObjectMeta(
                name="gc-1", owner_references=[owner_ref(dep, "Deployment", "apps/v1", True)]
            ),
            spec=k8s.V1ReplicaSetSpec(selector=selector, template=template),
        ),
    )
    pod = await core.create_namespaced_pod(
        "default",
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name="gc-1-a",
                labels=labels,
                owner_references=[owner_ref(rs, "ReplicaSet", "apps/v1", True)],
            ),
            spec=template.spec,
        ),
    )
    return dep, rs, pod


async def exists(call: Any, *args: Any) -> bool:
    try:
        await call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def test_pod_starts_pending(client: Any) -> None:
    _, _, pod = await make_tree(client)
    assert pod.status.phase == "Pending"


async def test_background_deletion_collects_dependents(client: Any) -> None:
    apps, core = k8s.AppsV1Api(client), k8s.CoreV1Api(client)
    await make_tree(client)
    await apps.delete_namespaced_deployment("gc", "default")
    assert not await exists(apps.read_namespaced_replica_set, "gc-1", "default")
    assert not await exists(core.read_namespaced_pod, "gc-1-a", "default")


async def test_foreground_deletion_waits_for_finalized_dependents(client: Any) -> None:
    apps, core = k8s.AppsV1Api(client), k8s.CoreV1Api(client)
    await make_tree(client)
    await core.patch_namespaced_pod(
        "gc-1-a", "default", {"metadata": {"finalizers": ["example.com/hold"]}}
    )
    await apps.delete_namespaced_deployment(
        "gc", "default", body=k8s.V1DeleteOptions(propagation_policy="Foreground")
    )
    held = await apps.read_namespaced_deployment("gc", "default")
    assert held.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in held.metadata.finalizers
    pod = await core.read_namespaced_pod("gc-1-a", "default")
    assert pod.metadata.deletion_timestamp is not None

    await core.patch_namespaced_pod(
        "gc-1-a",
        "default",
        [{"op": "remove", "path": "/metadata/finalizers"}],
    )
    assert not await exists(core.read_namespaced_pod, "gc-1-a", "default")
    assert not await exists(apps.read_namespaced_replica_set, "gc-1", "default")
    assert not await exists(apps.read_namespaced_deployment, "gc", "default")


async def test_orphan_deletion_keeps_dependents(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await make_tree(client)
    await apps.delete_namespaced_deployment("gc", "default", propagation_policy="Orphan")
    rs = await apps.read_namespaced_replica_set("gc-1", "default")
    assert rs.metadata.owner_references is None


async def test_finalizer_holds_then_releases(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespaced_config_map(
        "default",
        k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="held", finalizers=["example.com/x"])),
    )
    response = await core.delete_namespaced_config_map("held", "default")
    assert response is not None
    held = await core.read_namespaced_config_map("held", "default")
    assert held.metadata.deletion_timestamp is not None
    held.metadata.finalizers = []
    await core.replace_namespaced_config_map("held", "default", held)
    assert not await exists(core.read_namespaced_config_map, "held", "default")


async def test_delete_precondition(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="pre"))
    )
    with pytest.raises(ApiException) as err:
        await core.delete_namespaced_config_map(
            "pre", "default", body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid="x"))
        )
    assert err.value.status == 409
