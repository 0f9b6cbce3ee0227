"""CRUD, list, errors and status semantics through kubernetes_asyncio's typed clients."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import http_session

from . import builders


def deployment(name: str, replicas: int = 1, image: str = "nginx:1") -> dict[str, Any]:
    return builders.deployment(name, replicas, containers=[builders.container(image=image)])


def status_of(exc: ApiException) -> tuple[int, str]:
    import json

    body = json.loads(exc.body)
    assert body["kind"] == "Status"
    return exc.status, body["reason"]


async def test_discovery_and_version(client: Any) -> None:
    version = await k8s.VersionApi(client).get_code()
    assert version.major == "1"
    groups = await k8s.ApisApi(client).get_api_versions()
    names = {g.name for g in groups.groups}
    assert {"apps", "batch", "apiextensions.k8s.io", "coordination.k8s.io"} <= names
    core = await k8s.CoreV1Api(client).get_api_resources()
    by_name = {r.name: r for r in core.resources}
    assert by_name["pods"].namespaced
    assert not by_name["nodes"].namespaced
    assert "pods/status" in by_name
    assert "watch" in by_name["configmaps"].verbs


async def test_create_get_update_delete_configmap(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="cfg"), data={"a": "1"})
    created = await core.create_namespaced_config_map("default", body)
    assert created.metadata.uid
    assert created.metadata.resource_version
    fetched = await core.read_namespaced_config_map("cfg", "default")
    assert fetched.data == {"a": "1"}
    fetched.data["a"] = "2"
    updated = await core.replace_namespaced_config_map("cfg", "default", fetched)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    await core.delete_namespaced_config_map("cfg", "default")
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_config_map("cfg", "default")
    assert status_of(err.value) == (404, "NotFound")


async def test_already_exists_and_invalid(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="dup"))
    await core.create_namespaced_config_map("default", body)
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map("default", body)
    assert status_of(err.value) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map(
            "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="Not_Valid"))
        )
    assert status_of(err.value) == (422, "Invalid")
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map(
            "missing-ns", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="x"))
        )
    assert status_of(err.value) == (404, "NotFound")


async def test_stale_update_conflicts(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c"), data={"v": "0"})
    )
    first = await core.read_namespaced_config_map("c", "default")
    second = await core.read_namespaced_config_map("c", "default")
    first.data["v"] = "1"
    await core.replace_namespaced_config_map("c", "default", first)
    second.data["v"] = "2"
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("c", "default", second)
    assert status_of(err.value) == (409, "Conflict")


async def test_generation_and_status_subresource(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    created = await apps.create_namespaced_deployment("default", deployment("web"))
    assert created.metadata.generation == 1
    assert created.status is None or created.status.replicas is None

    current = await apps.read_namespaced_deployment("web", "default")
    current.metadata.labels["team"] = "a"
    relabelled = await apps.replace_namespaced_deployment("web", "default", current)
    assert relabelled.metadata.generation == 1

    relabelled.spec.replicas = 3
    relabelled.status = k8s.V1DeploymentStatus(replicas=99)
    scaled = await apps.replace_namespaced_deployment("web", "default", relabelled)
    assert scaled.metadata.generation == 2
    assert scaled.status is None or scaled.status.replicas is None

    scaled.status = k8s.V1DeploymentStatus(replicas=3, ready_replicas=2)
    scaled.spec.replicas = 7
    with_status = await apps.replace_namespaced_deployment_status("web", "default", scaled)
    assert with_status.status.ready_replicas == 2
    assert with_status.spec.replicas == 3
    assert with_status.metadata.generation == 2
    read_status = await apps.read_namespaced_deployment_status("web", "default")
    assert read_status.status.replicas == 3


async def test_noop_update_keeps_resource_version(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    created = await core.create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="same"), data={"k": "v"})
    )
    again = await core.replace_namespaced_config_map("same", "default", created)
    assert again.metadata.resource_version == created.metadata.resource_version


async def test_list_selectors_limit_continue(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="other")))
    for i in range(7):
        labels = {"idx": str(i), "parity": "even" if i % 2 == 0 else "odd"}
        await core.create_namespaced_config_map(
            "default" if i < 5 else "other",
            k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i}", labels=labels)),
        )

    async def names(**kwargs: Any) -> list[str]:
        result = await core.list_config_map_for_all_namespaces(**kwargs)
        return [item.metadata.name for item in result.items]

    assert await names(label_selector="parity=even") == ["cm-0", "cm-2", "cm-4", "cm-6"]
    assert await names(label_selector="idx in (1,5),parity!=even") == ["cm-1", "cm-5"]
    assert await names(label_selector="!parity") == []
    assert await names(field_selector="metadata.namespace=other") == ["cm-5", "cm-6"]
    assert await names(field_selector="metadata.name=cm-3") == ["cm-3"]

    seen: list[str] = []
    token = None
    pages = 0
    first_rv = None
    while True:
        page = await core.list_namespaced_config_map("default", limit=2, _continue=token)
        first_rv = first_rv or page.metadata.resource_version
        assert page.metadata.resource_version == first_rv
        seen += [item.metadata.name for item in page.items]
        pages += 1
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(seen)
    assert seen == [f"cm-{i}" for i in range(5)]
    assert pages == 3


async def test_delete_collection(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    for i in range(4):
        await core.create_namespaced_config_map(
            "default",
            k8s.V1ConfigMap(
                metadata=k8s.V1ObjectMeta(name=f"d-{i}", labels={"drop": str(i < 3).lower()})
            ),
        )
    await core.delete_collection_namespaced_config_map("default", label_selector="drop=true")
    remaining = await core.list_namespaced_config_map("default")
    assert [i.metadata.name for i in remaining.items] == ["d-3"]


async def test_namespace_lifecycle(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="team")))
    await core.create_namespaced_secret(
        "team", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s"), string_data={"k": "v"})
    )
    await core.delete_namespace("team")
    with pytest.raises(ApiException) as err:
        await core.read_namespace("team")
    assert err.value.status == 404
    with pytest.raises(ApiException):
        await core.read_namespaced_secret("s", "team")


@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong", "Basic abc"],
    ids=["no-token", "wrong-token", "wrong-scheme"],
)
async def test_unauthorized(hub: KubeSim, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    async with (
        http_session(hub) as session,
        session.get(f"{hub.url}/api/v1/namespaces", headers=headers) as resp,
    ):
        assert resp.status == 401
        body = await resp.json()
    assert body["kind"] == "Status"
    assert body["reason"] == "Unauthorized"


async def test_all_builtin_kinds_round_trip(hub: KubeSim, client: Any) -> None:
    dynamic_free = [
        ("v1", "ServiceAccount", "serviceaccounts", True),
        ("v1", "Service", "services", True),
        ("v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
        ("v1", "Event", "events", True),
        ("events.k8s.io/v1", "Event", "events", True),
        ("apps/v1", "StatefulSet", "statefulsets", True),
        ("apps/v1", "DaemonSet", "daemonsets", True),
        ("apps/v1", "ReplicaSet", "replicasets", True),
        ("batch/v1", "Job", "jobs", True),
        ("batch/v1", "CronJob", "cronjobs", True),
        ("networking.k8s.io/v1", "Ingress", "ingresses", True),
        ("rbac.authorization.k8s.io/v1", "Role", "roles", True),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
        ("coordination.k8s.io/v1", "Lease", "leases", True),
        ("v1", "Node", "nodes", False),
    ]
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with http_session(hub, headers=headers) as session:
        for api_version, kind, plural, namespaced in dynamic_free:
            prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            base = f"{hub.url}{prefix}/" + (
                f"namespaces/default/{plural}" if namespaced else plural
            )
            name = "system:thing" if kind.startswith("Cluster") else "thing"
            obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
            async with session.post(base, json=obj) as resp:
                assert resp.status == 201, (kind, await resp.text())
            async with session.get(f"{base}/{name}") as resp:
                assert resp.status == 200, kind
                assert (await resp.json())["kind"] == kind
            async with session.delete(f"{base}/{name}") as resp:
                assert resp.status == 200, kind
