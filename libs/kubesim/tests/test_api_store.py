"""Unit tests of the synchronous store: the semantics both kubesim halves rely on."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.kubesim import resources
from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.store import Store, StoreEvent


@pytest.fixture
def store() -> Store:
    return Store(watch_window=5)


def rt(store: Store, api_version: str, kind: str) -> resources.ResourceType:
    return store.resource_type(api_version, kind)


def cm(name: str, ns: str = "default", **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "data": dict(data)}


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
    }


def owned(name: str, owner: dict[str, Any], **extra: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        **extra,
    }
    return {"metadata": {"name": name, "namespace": "default", "ownerReferences": [ref]}}


def test_create_sets_server_fields_and_defaults(store: Store) -> None:
    created = store.create(
        rt(store, "apps/v1", "Deployment"),
        {"metadata": {"name": "web", "namespace": "default"}, "spec": {}},
    )
    meta = created["metadata"]
    assert created["apiVersion"] == "apps/v1"
    assert created["kind"] == "Deployment"
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) == store.resource_version
    assert created["spec"]["replicas"] == 1


def test_default_namespaces_exist(store: Store) -> None:
    names = [n["metadata"]["name"] for n in store.list(resources.NAMESPACE)[0]]
    assert {"default", "kube-system", "kube-node-lease"} <= set(names)


@pytest.mark.parametrize(
    ("obj", "code", "reason"),
    [
        ({"metadata": {"namespace": "default"}}, 422, "Invalid"),
        ({"metadata": {"name": "Bad_Name", "namespace": "default"}}, 422, "Invalid"),
        ({"metadata": {"name": "x"}}, 422, "Invalid"),
        ({"metadata": {"name": "x", "namespace": "nope"}}, 404, "NotFound"),
        ({"metadata": {"name": "x", "namespace": "default", "labels": {"a": 1}}}, 422, "Invalid"),
    ],
    ids=["no-name", "bad-name", "no-namespace", "missing-namespace", "non-string-label"],
)
def test_create_rejects(store: Store, obj: dict[str, Any], code: int, reason: str) -> None:
    with pytest.raises(ApiError) as err:
        store.create(rt(store, "v1", "ConfigMap"), obj)
    assert (err.value.code, err.value.reason) == (code, reason)
    assert err.value.status()["kind"] == "Status"


def test_create_twice_is_already_exists(store: Store) -> None:
    store.create(rt(store, "v1", "ConfigMap"), cm("a"))
    with pytest.raises(ApiError) as err:
        store.create(rt(store, "v1", "ConfigMap"), cm("a"))
    assert (err.value.code, err.value.reason) == (409, "AlreadyExists")


def test_generate_name(store: Store) -> None:
    created = store.create(
        rt(store, "v1", "ConfigMap"), {"metadata": {"generateName": "x-", "namespace": "default"}}
    )
    assert created["metadata"]["name"].startswith("x-")
    assert len(created["metadata"]["name"]) == 7


def test_returned_objects_are_copies(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    source = cm("a", k="v")
    created = store.create(configmaps, source)
    source["data"]["k"] = "changed"
    created["data"]["k"] = "changed"
    store.get(configmaps, "default", "a")["data"]["k"] = "changed"
    store.list(configmaps)[0][0]["data"]["k"] = "changed"
    assert store.get(configmaps, "default", "a")["data"] == {"k": "v"}


def test_get_missing_is_not_found(store: Store) -> None:
    with pytest.raises(ApiError) as err:
        store.get(rt(store, "v1", "ConfigMap"), "default", "nope")
    assert err.value.code == 404
    assert err.value.message == 'configmaps "nope" not found'


def test_list_selectors_and_sorting(store: Store) -> None:
    pods = rt(store, "v1", "Pod")
    store.create(resources.NAMESPACE, {"metadata": {"name": "other"}})
    for ns, name, labels in [
        ("default", "b", {"app": "web", "tier": "fe"}),
        ("default", "a", {"app": "db"}),
        ("other", "c", {"app": "web"}),
    ]:
        store.create(
            pods, {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {}}
        )

    def names(**kw: Any) -> list[str]:
        return [p["metadata"]["name"] for p in store.list(pods, **kw)[0]]

    assert names() == ["a", "b", "c"]
    assert names(namespace="default") == ["a", "b"]
    assert names(label_selector="app=web") == ["b", "c"]
    assert names(label_selector="app in (web,db),!tier") == ["a", "c"]
    assert names(label_selector="app notin (db),tier") == ["b"]
    assert names(label_selector="app!=web") == ["a"]
    assert names(field_selector="metadata.name=c") == ["c"]
    assert names(field_selector="metadata.namespace!=other") == ["a", "b"]
    assert names(field_selector="status.phase=Pending") == ["a", "b", "c"]
    with pytest.raises(ApiError) as err:
        names(label_selector="app in (")
    assert err.value.code == 400


def test_update_conflict_generation_and_noop(store: Store) -> None:
    deployments = rt(store, "apps/v1", "Deployment")
    first = store.create(deployments, deployment("web"))
    relabelled = store.get(deployments, "default", "web")
    relabelled["metadata"]["labels"]["x"] = "y"
    second = store.update(deployments, relabelled)
    assert second["metadata"]["generation"] == 1
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])

    with pytest.raises(ApiError) as err:
        store.update(deployments, first)  # stale resourceVersion
    assert (err.value.code, err.value.reason) == (409, "Conflict")

    scaled = store.get(deployments, "default", "web")
    scaled["spec"]["replicas"] = 3
    third = store.update(deployments, scaled)
    assert third["metadata"]["generation"] == 2

    rv = store.resource_version
    again = store.update(deployments, third)
    assert again["metadata"]["resourceVersion"] == third["metadata"]["resourceVersion"]
    assert store.resource_version == rv


def test_status_subresource_separation(store: Store) -> None:
    deployments = rt(store, "apps/v1", "Deployment")
    store.create(deployments, deployment("web"))
    obj = store.get(deployments, "default", "web")
    obj["status"] = {"replicas": 5}
    obj["spec"]["replicas"] = 9
    after_status = store.update(deployments, obj, subresource="status")
    assert after_status["status"] == {"replicas": 5}
    assert after_status["spec"]["replicas"] == 1
    assert after_status["metadata"]["generation"] == 1

    main = store.get(deployments, "default", "web")
    main["status"] = {"replicas": 0}
    after_main = store.update(deployments, main)
    assert after_main["status"] == {"replicas": 5}


def test_listeners_and_history(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    seen: list[StoreEvent] = []
    unsubscribe = store.add_listener(configmaps, seen.append)
    base = store.resource_version
    store.create(configmaps, cm("a", k="1"))
    updated = store.get(configmaps, "default", "a")
    updated["data"]["k"] = "2"
    store.update(configmaps, updated)
    store.delete(configmaps, "default", "a")
    assert [e.type for e in seen] == ["ADDED", "MODIFIED", "DELETED"]
    assert [e.resource_version for e in seen] == [base + 1, base + 2, base + 3]
    assert seen[-1].object["metadata"]["resourceVersion"] == str(base + 3)
    seen[0].object["data"]["k"] = "mutated"
    assert [r.type for r in store.history_since(configmaps, base + 1)] == ["MODIFIED", "DELETED"]
    unsubscribe()
    store.create(configmaps, cm("b"))
    assert len(seen) == 3


def test_history_window_expires(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    start = store.resource_version
    for i in range(8):  # window is 5
        store.create(configmaps, cm(f"c{i}"))
    assert len(store.history_since(configmaps, start + 3)) == 5
    with pytest.raises(ApiError) as err:
        store.history_since(configmaps, start + 1)
    assert (err.value.code, err.value.reason) == (410, "Expired")


def test_finalizers_hold_deletion(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    obj = cm("a")
    obj["metadata"]["finalizers"] = ["example.com/hold"]
    store.create(configmaps, obj)
    terminating = store.delete(configmaps, "default", "a")
    assert terminating["metadata"]["deletionTimestamp"]
    assert store.get(configmaps, "default", "a")["metadata"]["deletionTimestamp"]
    terminating["metadata"]["finalizers"].append("example.com/new")
    with pytest.raises(ApiError) as err:
        store.update(configmaps, terminating)
    assert err.value.code == 422
    terminating["metadata"]["finalizers"] = []
    store.update(configmaps, terminating)
    with pytest.raises(ApiError):
        store.get(configmaps, "default", "a")


def test_background_gc_is_recursive(store: Store) -> None:
    deployments, replicasets, pods = (
        rt(store, "apps/v1", "Deployment"),
        rt(store, "apps/v1", "ReplicaSet"),
        rt(store, "v1", "Pod"),
    )
    dep = store.create(deployments, deployment("web"))
    rs = store.create(replicasets, owned("web-1", dep))
    store.create(pods, owned("web-1-a", rs))
    store.delete(deployments, "default", "web")
    assert store.list(replicasets)[0] == []
    assert store.list(pods)[0] == []


def test_gc_keeps_dependents_with_another_live_owner(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    a = store.create(configmaps, cm("a"))
    b = store.create(configmaps, cm("b"))
    child = owned("child", a)
    child["metadata"]["ownerReferences"].append(owned("x", b)["metadata"]["ownerReferences"][0])
    store.create(configmaps, child)
    store.delete(configmaps, "default", "a")
    refs = store.get(configmaps, "default", "child")["metadata"]["ownerReferences"]
    assert [r["name"] for r in refs] == ["b"]


def test_foreground_waits_for_dependents(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    owner = store.create(configmaps, cm("owner"))
    child = owned("child", owner, blockOwnerDeletion=True)
    child["metadata"]["finalizers"] = ["example.com/hold"]
    store.create(configmaps, child)
    store.delete(configmaps, "default", "owner", propagation="Foreground")
    held = store.get(configmaps, "default", "owner")
    assert held["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert held["metadata"]["deletionTimestamp"]
    child_now = store.get(configmaps, "default", "child")
    assert child_now["metadata"]["deletionTimestamp"]
    child_now["metadata"]["finalizers"] = []
    store.update(configmaps, child_now)
    assert store.list(configmaps)[0] == []


def test_orphan_strips_owner_references(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    owner = store.create(configmaps, cm("owner"))
    store.create(configmaps, owned("child", owner))
    store.delete(configmaps, "default", "owner", propagation="Orphan")
    child = store.get(configmaps, "default", "child")
    assert "ownerReferences" not in child["metadata"]


def test_namespace_deletion_removes_contents(store: Store) -> None:
    configmaps = rt(store, "v1", "ConfigMap")
    store.create(resources.NAMESPACE, {"metadata": {"name": "team"}})
    held = cm("held", "team")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    store.create(configmaps, held)
    store.create(configmaps, cm("plain", "team"))
    store.delete(resources.NAMESPACE, None, "team")
    assert store.get(resources.NAMESPACE, None, "team")["status"]["phase"] == "Terminating"
    with pytest.raises(ApiError) as err:
        store.create(configmaps, cm("late", "team"))
    assert err.value.code == 403
    remaining = store.get(configmaps, "team", "held")
    remaining["metadata"]["finalizers"] = []
    store.update(configmaps, remaining)
    with pytest.raises(ApiError):
        store.get(resources.NAMESPACE, None, "team")


def crd(kind: str = "Widget", scope: str = "Namespaced") -> dict[str, Any]:
    return {
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": kind},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}},
                {"name": "v2", "served": True, "storage": False},
            ],
        },
    }


def test_crd_registers_and_unregisters_types(store: Store) -> None:
    created = store.create(resources.CRD, crd())
    assert {c["type"] for c in created["status"]["conditions"]} == {"Established", "NamesAccepted"}
    widgets = rt(store, "example.com/v1", "Widget")
    assert widgets.custom
    assert widgets.has_status
    assert widgets.namespaced
    store.create(widgets, {"metadata": {"name": "w", "namespace": "default"}, "spec": {"size": 1}})
    as_v2 = store.get(rt(store, "example.com/v2", "Widget"), "default", "w")
    assert as_v2["apiVersion"] == "example.com/v2"
    store.delete(resources.CRD, None, "widgets.example.com")
    with pytest.raises(ApiError) as err:
        store.resource_type("example.com/v1", "Widget")
    assert err.value.code == 404
    with pytest.raises(ApiError):
        store.list(widgets)


def test_crd_validation(store: Store) -> None:
    bad = crd()
    bad["metadata"]["name"] = "wrong.example.com"
    with pytest.raises(ApiError) as err:
        store.create(resources.CRD, bad)
    assert err.value.code == 422


def test_unknown_kind_is_not_found(store: Store) -> None:
    with pytest.raises(ApiError) as err:
        store.resource_type("example.com/v1", "Nope")
    assert err.value.code == 404


def test_custom_resource_without_status_subresource(store: Store) -> None:
    definition = crd()
    del definition["spec"]["versions"][0]["subresources"]
    store.create(resources.CRD, definition)
    widgets = rt(store, "example.com/v1", "Widget")
    assert not widgets.has_status
    store.create(widgets, {"metadata": {"name": "w", "namespace": "default"}, "spec": {}})
    obj = store.get(widgets, "default", "w")
    obj["status"] = {"phase": "Ready"}
    updated = store.update(widgets, obj)
    assert updated["status"] == {"phase": "Ready"}
    assert updated["metadata"]["generation"] == 2
