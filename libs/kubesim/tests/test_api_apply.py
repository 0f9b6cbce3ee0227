"""Unit tests of the field-ownership model behind server-side apply."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.kubesim import apply as ssa
from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.resources import BUILTIN_TYPES, ResourceType
from flotilla.kubesim.store import types_from_crd

DEPLOYMENT = next(rt for rt in BUILTIN_TYPES if rt.kind == "Deployment")
WIDGET = ResourceType("example.com", "v1", "Widget", "widgets", True, custom=True)
NOW = "2026-01-01T00:00:00Z"


def config(*containers: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if containers:
        spec["template"] = {"spec": {"containers": list(containers)}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "default"},
        "spec": spec,
    }


def test_field_paths_use_merge_keys_for_builtin_lists() -> None:
    paths = ssa.field_paths(config({"name": "a", "image": "x"}, replicas=2), DEPLOYMENT)
    assert paths == {
        ("f:spec", "f:replicas"),
        ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"a"}', "f:name"),
        ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"a"}', "f:image"),
    }


def test_custom_resource_lists_are_atomic() -> None:
    obj = {"metadata": {"name": "w"}, "spec": {"containers": [{"name": "a"}]}}
    assert ssa.field_paths(obj, WIDGET) == {("f:spec", "f:containers")}


def test_fields_v1_round_trip() -> None:
    paths = {("f:a",), ("f:a", "f:b"), ("f:c", 'k:{"name":"x"}', "f:name")}
    tree = ssa.to_fields_v1(paths)
    assert tree["f:a"] == {".": {}, "f:b": {}}
    assert ssa.from_fields_v1(tree) == paths


def test_apply_merges_keyed_items_and_removes_dropped_ones() -> None:
    created = ssa.apply(
        None,
        config({"name": "a", "image": "1"}, {"name": "b", "image": "1"}),
        rt=DEPLOYMENT,
        manager="m",
        force=False,
        now=NOW,
    )
    updated = ssa.apply(
        created,
        config({"name": "a", "image": "2"}),
        rt=DEPLOYMENT,
        manager="m",
        force=False,
        now=NOW,
    )
    assert updated["spec"]["template"]["spec"]["containers"] == [{"name": "a", "image": "2"}]


def test_fields_owned_by_someone_else_survive_removal() -> None:
    first = ssa.apply(
        None,
        config({"name": "a", "image": "1"}, replicas=1),
        rt=DEPLOYMENT,
        manager="m",
        force=False,
        now=NOW,
    )
    shared = ssa.apply(
        first, config(replicas=1), rt=DEPLOYMENT, manager="other", force=False, now=NOW
    )
    dropped = ssa.apply(
        shared,
        config({"name": "a", "image": "1"}),
        rt=DEPLOYMENT,
        manager="m",
        force=False,
        now=NOW,
    )
    assert dropped["spec"]["replicas"] == 1


def test_conflict_names_the_owner_and_field() -> None:
    live = ssa.apply(None, config(replicas=1), rt=DEPLOYMENT, manager="a", force=False, now=NOW)
    with pytest.raises(ApiError) as err:
        ssa.apply(live, config(replicas=2), rt=DEPLOYMENT, manager="b", force=False, now=NOW)
    assert err.value.code == 409
    assert err.value.details is not None
    assert err.value.details["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "a" using apps/v1',
            "field": ".spec.replicas",
        }
    ]
    forced = ssa.apply(live, config(replicas=2), rt=DEPLOYMENT, manager="b", force=True, now=NOW)
    owners = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert "a" not in owners  # its only field was taken over
    assert owners["b"]["f:spec"]["f:replicas"] == {}


def test_record_update_takes_changed_fields() -> None:
    live = ssa.apply(None, config(replicas=1), rt=DEPLOYMENT, manager="a", force=False, now=NOW)
    new = {**live, "spec": {**live["spec"], "replicas": 5}, "metadata": dict(live["metadata"])}
    ssa.record_update(live, new, rt=DEPLOYMENT, manager="scaler", now=NOW)
    managers = {e["manager"]: e for e in new["metadata"]["managedFields"]}
    assert managers["scaler"]["operation"] == "Update"
    assert "f:replicas" in managers["scaler"]["fieldsV1"]["f:spec"]
    assert "a" not in managers


def test_a_custom_list_declared_a_map_merges_by_key_between_managers() -> None:
    """Two managers each apply their own conditions of one custom resource's status
    (a list declared ``x-kubernetes-list-type: map`` keyed by ``type``): neither
    removes nor conflicts with the other's."""
    schema = {
        "type": "object",
        "properties": {
            "status": {
                "type": "object",
                "properties": {
                    "conditions": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                        "items": {"type": "object"},
                    }
                },
            }
        },
    }
    crd = {
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
    (rt,) = types_from_crd(crd)
    assert rt.keyed_lists == (("conditions", "type"),)

    def status(*types: str) -> dict[str, Any]:
        conditions = [{"type": t, "status": "True"} for t in types]
        return {"metadata": {"name": "w"}, "status": {"conditions": conditions}}

    live: dict[str, Any] = {"metadata": {"name": "w"}}
    live = ssa.apply(
        live, status("Ready"), rt=rt, manager="syncer", force=False, now=NOW, subresource="status"
    )
    for manager, types in (("drain", ("Cordoned", "Drained")), ("drain", ("Cordoned",))):
        live = ssa.apply(
            live, status(*types), rt=rt, manager=manager, force=False, now=NOW, subresource="status"
        )
    assert [c["type"] for c in live["status"]["conditions"]] == ["Ready", "Cordoned"]
    assert WIDGET.list_key("conditions") is None  # no schema: still atomic
