"""Merge, JSON and strategic merge patches, and server-side apply, over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.kubesim import patch as patches
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import http_session

from . import builders


def deployment(name: str = "web", replicas: int = 2) -> dict[str, Any]:
    main = builders.container(
        env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        ports=[{"containerPort": 80}],
    )
    return builders.deployment(
        name,
        replicas,
        containers=[main, builders.container("sidecar", "envoy:1")],
        tolerations=[{"key": "a", "operator": "Exists"}],
    )


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        ({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}, {"a": 1, "b": {"d": 3}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": 1}, {"a": None}, {}),
        ({"a": {"b": 1}}, {"a": "x"}, {"a": "x"}),
    ],
    ids=["nested-delete-add", "lists-replace", "delete-key", "map-to-scalar"],
)
def test_merge_patch_rfc7386(target: Any, patch: Any, expected: Any) -> None:
    before = json.dumps(target)
    assert patches.merge_patch(target, patch) == expected
    assert json.dumps(target) == before


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        (
            {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
            {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}]},
            {
                "containers": [
                    {"name": "a", "image": "1"},
                    {"name": "b", "image": "2"},
                    {"name": "c", "image": "3"},
                ]
            },
        ),
        (
            {"containers": [{"name": "a"}, {"name": "b"}]},
            {"containers": [{"name": "a", "$patch": "delete"}]},
            {"containers": [{"name": "b"}]},
        ),
        (
            {"containers": [{"name": "a"}, {"name": "b"}]},
            {"containers": [{"$patch": "replace"}, {"name": "z"}]},
            {"containers": [{"name": "z"}]},
        ),
        (
            {"tolerations": [{"key": "a"}]},
            {"tolerations": [{"key": "b"}]},
            {"tolerations": [{"key": "b"}]},
        ),
        (
            {"ports": [{"containerPort": 80, "name": "http"}]},
            {"ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 81}]},
            {
                "ports": [
                    {"containerPort": 80, "name": "http", "protocol": "TCP"},
                    {"containerPort": 81},
                ]
            },
        ),
        (
            {"ports": [{"port": 80, "name": "http"}]},
            {"ports": [{"port": 80, "targetPort": 8080}]},
            {"ports": [{"port": 80, "name": "http", "targetPort": 8080}]},
        ),
        (
            {"selector": {"a": "1", "b": "2"}},
            {"selector": {"$patch": "replace", "c": "3"}},
            {"selector": {"c": "3"}},
        ),
        ({"spec": {"a": 1}}, {"spec": {"$patch": "delete"}}, {}),
        (
            {"finalizers": ["a", "b"]},
            {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            {"finalizers": ["b", "c"]},
        ),
        (
            {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
            {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}},
            {"strategy": {"type": "Recreate"}},
        ),
        (
            {"imagePullSecrets": [{"name": "a"}], "env": [{"name": "X", "value": "1"}]},
            {"imagePullSecrets": [{"name": "b"}], "env": [{"name": "X", "value": None}]},
            {"imagePullSecrets": [{"name": "a"}, {"name": "b"}], "env": [{"name": "X"}]},
        ),
    ],
    ids=[
        "merge-by-name",
        "delete-directive",
        "replace-list-directive",
        "tolerations-replace",
        "container-ports-by-containerPort",
        "service-ports-by-port",
        "replace-map-directive",
        "delete-map-directive",
        "primitive-list-merge-and-delete",
        "retain-keys",
        "image-pull-secrets-and-env-null",
    ],
)
def test_strategic_merge_patch(target: Any, patch: Any, expected: Any) -> None:
    assert patches.strategic_merge_patch(target, patch) == expected


async def test_patch_types_over_http(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await apps.create_namespaced_deployment("default", deployment())

    smp = {
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "main", "env": [{"name": "C", "value": "3"}]}]}
            }
        }
    }
    patched = await apps.patch_namespaced_deployment("web", "default", smp)
    containers = patched.spec.template.spec.containers
    assert [c.name for c in containers] == ["main", "sidecar"]
    assert [e.name for e in containers[0].env] == ["A", "B", "C"]
    assert patched.metadata.generation == 2

    merged = await apps.patch_namespaced_deployment(
        "web",
        "default",
        {"metadata": {"labels": {"tier": "fe"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"app": "web", "tier": "fe"}
    assert merged.metadata.generation == 2

    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 5},
    ]
    jsonpatched = await apps.patch_namespaced_deployment("web", "default", ops)
    assert jsonpatched.spec.replicas == 5

    with pytest.raises(ApiException) as err:
        await apps.patch_namespaced_deployment(
            "web", "default", [{"op": "test", "path": "/spec/replicas", "value": 2}]
        )
    assert err.value.status == 422


async def test_status_patch_changes_only_status(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await apps.create_namespaced_deployment("default", deployment())
    patched = await apps.patch_namespaced_deployment_status(
        "web", "default", {"status": {"readyReplicas": 2}, "spec": {"replicas": 9}}
    )
    assert patched.status.ready_replicas == 2
    assert patched.spec.replicas == 2
    main = await apps.patch_namespaced_deployment(
        "web", "default", {"status": {"readyReplicas": 0}}
    )
    assert main.status.ready_replicas == 2


async def test_patch_with_stale_resource_version_conflicts(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c"), data={"a": "1"})
    )
    with pytest.raises(ApiException) as err:
        await core.patch_namespaced_config_map(
            "c", "default", {"metadata": {"resourceVersion": "1"}, "data": {"a": "2"}}
        )
    assert err.value.status == 409


def apply_body(replicas: int, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "applied", "namespace": "default", "labels": labels or {"app": "a"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "a"}},
            "template": {
                "metadata": {"labels": {"app": "a"}},
                "spec": {"containers": [{"name": "main", "image": "nginx:1"}]},
            },
        },
    }
    return obj


async def ssa(client: Any, body: dict[str, Any], manager: str, force: bool = False) -> Any:
    """Server-side apply the way a service does it with the typed client."""
    applied = await k8s.AppsV1Api(client).patch_namespaced_deployment(
        "applied",
        "default",
        body,
        field_manager=manager,
        force=force,
        _content_type="application/apply-patch+yaml",
    )
    return client.sanitize_for_serialization(applied)


async def test_server_side_apply_ownership_and_conflicts(client: Any) -> None:
    created = await ssa(client, apply_body(2), "alice")
    assert created["spec"]["replicas"] == 2
    managers = {m["manager"]: m for m in created["metadata"]["managedFields"]}
    assert managers["alice"]["operation"] == "Apply"
    assert "f:replicas" in managers["alice"]["fieldsV1"]["f:spec"]

    same = await ssa(client, apply_body(2), "bob")
    assert same["spec"]["replicas"] == 2  # same value: shared ownership, no conflict

    with pytest.raises(ApiException) as err:
        await ssa(client, apply_body(3), "carol")
    assert err.value.status == 409
    status = json.loads(err.value.body)
    assert status["reason"] == "Conflict"
    assert any(c["field"] == ".spec.replicas" for c in status["details"]["causes"])

    forced = await ssa(client, apply_body(3), "carol", force=True)
    assert forced["spec"]["replicas"] == 3

    with pytest.raises(ApiException) as err:
        await ssa(client, apply_body(4), "alice")
    assert err.value.status == 409


async def test_apply_removes_fields_the_manager_dropped(client: Any) -> None:
    await ssa(client, apply_body(1, labels={"app": "a", "extra": "x"}), "alice")
    after = await ssa(client, apply_body(1), "alice")
    assert after["metadata"]["labels"] == {"app": "a"}


async def test_update_takes_ownership_from_apply(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await ssa(client, apply_body(1), "alice")
    await apps.patch_namespaced_deployment(
        "applied", "default", {"spec": {"replicas": 4}}, field_manager="hpa"
    )
    with pytest.raises(ApiException) as err:
        await ssa(client, apply_body(2), "alice")
    assert "hpa" in json.loads(err.value.body)["message"]


async def test_apply_requires_field_manager(client: Any) -> None:
    with pytest.raises(ApiException) as err:
        await k8s.AppsV1Api(client).patch_namespaced_deployment(
            "applied", "default", apply_body(1), _content_type="application/apply-patch+yaml"
        )
    assert err.value.status == 422


async def test_apply_accepts_yaml_and_creates(hub: KubeSim) -> None:
    body = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "from-yaml", "namespace": "default"},
            "data": {"k": "v"},
        }
    )
    url = f"{hub.url}/api/v1/namespaces/default/configmaps/from-yaml?fieldManager=me"
    headers = {
        "Authorization": f"Bearer {hub.token}",
        "Content-Type": "application/apply-patch+yaml",
    }
    async with http_session(hub, headers=headers) as session:
        async with session.patch(url, data=body) as resp:
            assert resp.status == 201
            created = await resp.json()
        async with session.patch(url, data=body) as resp:
            assert resp.status == 200
            again = await resp.json()
    assert created["data"] == {"k": "v"}
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_apply_to_the_status_subresource(client: Any) -> None:
    apps = k8s.AppsV1Api(client)
    await ssa(client, apply_body(2), "alice")
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "applied", "namespace": "default"},
        "spec": {"replicas": 9},
        "status": {"readyReplicas": 2, "replicas": 2},
    }
    result = await apps.patch_namespaced_deployment_status(
        "applied",
        "default",
        body,
        field_manager="aggregator",
        _content_type="application/apply-patch+yaml",
    )
    assert result.status.ready_replicas == 2
    assert result.spec.replicas == 2
    entries = {(m.manager, m.subresource) for m in result.metadata.managed_fields}
    assert ("aggregator", "status") in entries
    assert ("alice", None) in entries


_KEYS = st.sampled_from(["a", "b", "c", "spec", "metadata"])
_SCALARS = st.one_of(st.integers(), st.text(max_size=3), st.booleans())
_MAPS = st.recursive(
    st.dictionaries(_KEYS, _SCALARS, max_size=3),
    lambda children: st.dictionaries(_KEYS, st.one_of(_SCALARS, children), max_size=3),
    max_leaves=10,
)
_PATCHES = st.recursive(
    st.dictionaries(_KEYS, st.one_of(_SCALARS, st.none()), max_size=3),
    lambda children: st.dictionaries(_KEYS, st.one_of(_SCALARS, st.none(), children), max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(target=_MAPS, patch=_PATCHES)
def test_patch_properties(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = patches.merge_patch(target, patch)
    assert patches.merge_patch(once, patch) == once  # idempotent
    # Without lists or directives, a strategic merge patch is a JSON merge patch.
    assert patches.strategic_merge_patch(target, patch) == once
