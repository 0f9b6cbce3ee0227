from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from flotilla.common import api
from flotilla.common.api import GroupVersionKind, InvalidObjectError, Strategy

# --- builders -----------------------------------------------------------------------


def policy(namespace: str | None = "shop", **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "web"}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "PlacementPolicy" if namespace else "ClusterPlacementPolicy",
        "metadata": metadata,
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}], **spec},
    }


def rule(**fields: Any) -> dict[str, Any]:
    return {
        "targetClusters": ["eu-west"],
        "patchType": "merge",
        "patch": {"spec": {"replicas": 1}},
        **fields,
    }


def transformation(*rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Transformation",
        "metadata": {"name": "eu", "namespace": "shop"},
        "spec": {"transformations": list(rules) or [rule()]},
    }


def interpreter(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ResourceInterpreter",
        "metadata": {"name": "widgets"},
        "spec": {"target": {"apiVersion": "example.com/v1", "kind": "Widget"}, **spec},
    }


def cluster(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "us-east"},
        "spec": {},
        "status": status,
    }


def without(obj: dict[str, Any], *path: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    node = obj
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return obj


# --- the rules, each rejected with a message a user can act on --------------------------


@pytest.mark.parametrize(
    ("kind", "obj", "field", "message"),
    [
        pytest.param(
            "PlacementPolicy",
            policy(weights=[{"clusterSelector": {}, "weight": -1}]),
            "spec.weights[0].weight",
            "weight must be 0 or more, got -1",
            id="negative-weight",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(maxClusters=0),
            "spec.maxClusters",
            "maxClusters must be 1 or more, got 0; omit it for no limit",
            id="max-clusters-zero",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(spread={"labelKey": "region", "minGroups": 3, "maxGroups": 2}),
            "spec.spread",
            "minGroups (3) must not be greater than maxGroups (2)",
            id="min-groups-above-max",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(strategy="spread"),
            "spec.strategy",
            "unknown strategy 'spread'; use one of split, copy, any, as-needed",
            id="unknown-strategy",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(maxCluster=2),
            "spec.maxCluster",
            "unknown field (check the spelling against the CRD)",
            id="typo",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(splitBy="weights"),
            "spec",
            "splitBy: weights needs at least one entry in weights",
            id="weights-split-without-weights",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(resourceSelectors=[]),
            "spec.resourceSelectors",
            "at least 1 item",
            id="no-selectors",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(tolerations=[{"key": "gpu", "operator": "Exists", "value": "v100"}]),
            "spec.tolerations[0]",
            "operator Exists matches any value; remove value",
            id="toleration-exists-with-value",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(tolerations=[{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}]),
            "spec.tolerations[0]",
            "tolerationSeconds only applies to effect NoExecute",
            id="toleration-seconds-without-noexecute",
        ),
        pytest.param(
            "PlacementPolicy",
            policy(clusterSelector={"matchExpressions": [{"key": "gpu", "operator": "In"}]}),
            "spec.clusterSelector.matchExpressions[0]",
            "operator In needs at least one entry in values",
            id="selector-in-without-values",
        ),
        pytest.param(
            "Transformation",
            transformation(rule(targetSelector={"matchLabels": {"region": "eu"}})),
            "spec.transformations[0]",
            "set exactly one of targetClusters or targetSelector",
            id="both-targets",
        ),
        pytest.param(
            "Transformation",
            transformation(without(rule(), "targetClusters")),
            "spec.transformations[0]",
            "set exactly one of targetClusters or targetSelector",
            id="no-target",
        ),
        pytest.param(
            "Transformation",
            transformation(rule(patchType="xml")),
            "spec.transformations[0].patchType",
            "Input should be 'strategic', 'merge' or 'json'",
            id="patch-type",
        ),
        pytest.param(
            "Transformation",
            transformation(rule(patchType="json")),
            "spec.transformations[0]",
            "patchType json needs patch to be a list of RFC 6902 operations",
            id="json-patch-not-a-list",
        ),
        pytest.param(
            "Transformation",
            transformation(
                rule(patchType="json", patch=[{"op": "replace", "path": "/metadata/name"}])
            ),
            "spec.transformations[0]",
            "patch[0] touches '/metadata/name'; a transformation may not change",
            id="json-patch-renames",
        ),
        pytest.param(
            "Transformation",
            transformation(rule(patch={"kind": "StatefulSet"})),
            "spec.transformations[0]",
            "patch sets kind; a transformation may not change",
            id="merge-patch-changes-kind",
        ),
        pytest.param(
            "Transformation",
            transformation(rule(patchType="strategic", patch={"metadata": {"namespace": "x"}})),
            "spec.transformations[0]",
            "patch sets metadata.namespace",
            id="strategic-patch-moves-namespace",
        ),
        pytest.param(
            "ResourceInterpreter",
            interpreter(podTemplate={"path": ".spec.template"}, podSpec={"path": ".spec"}),
            "spec",
            "set podTemplate or podSpec, not both",
            id="two-pod-sources",
        ),
        pytest.param(
            "ResourceInterpreter",
            interpreter(
                components=[
                    {"name": "a", "podTemplatePath": ".spec.a"},
                    {"name": "a", "podTemplatePath": ".spec.b"},
                ]
            ),
            "spec",
            "component names must be unique; repeated: a",
            id="duplicate-components",
        ),
        pytest.param(
            "ResourceInterpreter",
            interpreter(replicas={"path": "spec.replicas"}),
            "spec.replicas.path",
            "must start with '.'",
            id="path-without-dot",
        ),
        pytest.param(
            "ResourceInterpreter",
            interpreter(statusAggregation=[{"path": ".status.x", "op": "avg"}]),
            "spec.statusAggregation[0].op",
            "Input should be",
            id="unknown-op",
        ),
        pytest.param(
            "ResourceInterpreter",
            interpreter(follows=[{"path": ".spec.backend"}]),
            "spec.follows[0]",
            "by: name needs apiVersion and kind",
            id="follow-by-name-without-type",
        ),
        pytest.param(
            "Cluster",
            cluster(allocatable={"cpu": "lots"}),
            "status.allocatable.cpu",
            "'lots' is not a Kubernetes quantity",
            id="quantity",
        ),
        pytest.param(
            "Cluster",
            {**cluster(), "spec": {"taints": [{"key": "a", "effect": "PreferNoSchedule"}]}},
            "spec.taints[0].effect",
            "Input should be 'NoSchedule' or 'NoExecute'",
            id="taint-effect",
        ),
        pytest.param(
            "Cluster",
            {**cluster(), "apiVersion": "flotilla.io/v1"},
            "apiVersion",
            "Input should be 'flotilla.io/v1alpha1'",
            id="api-version",
        ),
    ],
)
def test_invalid_objects_name_the_field(
    kind: str, obj: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidObjectError) as raised:
        api.parse_object(kind, obj)
    error = raised.value
    assert isinstance(error, ValueError)
    assert field in error.fields
    assert any(e.field == field and message in e.message for e in error.errors), error.errors
    assert message in str(error)


def test_every_error_is_reported_at_once() -> None:
    obj = policy(maxClusters=0, weights=[{"clusterSelector": {}, "weight": -2}])
    with pytest.raises(InvalidObjectError) as raised:
        api.parse_object("PlacementPolicy", obj)
    assert sorted(raised.value.fields) == ["spec.maxClusters", "spec.weights[0].weight"]
    assert str(raised.value).startswith("invalid PlacementPolicy 'web': ")


@pytest.mark.parametrize(
    ("kind", "obj", "message"),
    [
        pytest.param("Widget", policy(), "not a Flotilla kind", id="unknown-kind"),
        pytest.param("Cluster", policy(), "object is a 'PlacementPolicy'", id="kind-mismatch"),
    ],
)
def test_wrong_kind(kind: str, obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObjectError, match=message) as raised:
        api.parse_object(kind, obj)
    assert raised.value.fields == ["kind"]


def test_parse_as_is_typed_and_checks_the_kind() -> None:
    parsed = api.parse_as(api.ClusterPlacementPolicy, policy(namespace=None))
    assert parsed.metadata.name == "web"
    with pytest.raises(InvalidObjectError, match="object is a 'ClusterPlacementPolicy'"):
        api.parse_as(api.PlacementPolicy, policy(namespace=None))


# --- reading and writing --------------------------------------------------------------


def test_wire_names_and_python_names_both_read_and_dumps_use_wire_names() -> None:
    from_wire = api.PlacementPolicySpec.model_validate(
        {"resourceSelectors": [{"apiVersion": "v1", "kind": "Pod"}], "maxClusters": 2}
    )
    from_python = api.PlacementPolicySpec(
        resource_selectors=[api.ResourceSelector(api_version="v1", kind="Pod")], max_clusters=2
    )
    assert from_wire == from_python
    dumped = from_python.model_dump(mode="json", exclude_defaults=True)
    assert dumped == {"resourceSelectors": [{"apiVersion": "v1", "kind": "Pod"}], "maxClusters": 2}


def test_defaults() -> None:
    parsed = api.parse_object("PlacementPolicy", policy())
    assert isinstance(parsed, api.PlacementPolicy)
    spec = parsed.spec
    assert (spec.priority, spec.strategy, spec.split_by, spec.max_clusters) == (
        0,
        None,
        api.SplitBy.CAPACITY,
        None,
    )
    assert api.Spread(label_key="region").min_groups == 1
    assert api.Toleration(operator=api.TolerationOperator.EXISTS).key == ""
    cluster_obj = api.parse_object("Cluster", {"metadata": {"name": "c"}})
    assert isinstance(cluster_obj, api.Cluster)
    assert not cluster_obj.spec.unschedulable
    assert cluster_obj.status.placements == 0


def test_status_tolerates_fields_it_does_not_know() -> None:
    parsed = api.parse_object("Cluster", cluster(placements=3, futureField={"x": 1}))
    assert isinstance(parsed, api.Cluster)
    assert parsed.status.placements == 3


def test_metadata_keeps_unknown_fields() -> None:
    obj = policy()
    obj["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    parsed = api.parse_object("PlacementPolicy", obj)
    dumped = parsed.model_dump(mode="json", exclude_none=True)
    assert dumped["metadata"]["managedFields"] == [{"manager": "kubectl"}]


def test_quantities_keep_their_text_and_accept_numbers() -> None:
    status = api.ClusterStatus.model_validate({"allocatable": {"cpu": 24, "memory": "96Gi"}})
    assert status.allocatable == {"cpu": "24", "memory": "96Gi"}


# --- names and enums ------------------------------------------------------------------


def test_annotation_names() -> None:
    assert api.STRATEGY_ANNOTATION == "flotilla.io/strategy"
    assert api.DEPENDENCIES_ANNOTATION == "flotilla.io/dependencies"
    assert api.PLACEMENT_ANNOTATION == "flotilla.io/placement"
    assert all(name.startswith(api.ANNOTATION_PREFIX) for name in api.ANNOTATIONS)
    assert len(set(api.ANNOTATIONS)) == 6


def test_origin_names_on_member_copies() -> None:
    assert api.ORIGIN_LABEL == api.ORIGIN_ANNOTATION == "flotilla.io/origin"
    assert api.DECISION_ANNOTATION == "flotilla.io/decision"
    assert api.HUB_GENERATION_ANNOTATION == "flotilla.io/hub-generation"


def test_origin_label_is_the_key_in_label_characters() -> None:
    assert api.origin_label("apps/v1/Deployment/shop/web") == "apps-v1-deployment-shop-web"
    assert api.origin_label("v1/Namespace/_/shop") == "v1-namespace-shop"


def test_origin_label_of_a_long_key_is_short_and_distinct() -> None:
    a = api.origin_label("apps/v1/Deployment/shop/" + "x" * 200)
    b = api.origin_label("apps/v1/Deployment/shop/" + "x" * 199 + "y")
    assert len(a) <= 63 and len(b) <= 63 and a != b
    assert a[0].isalnum() and a[-1].isalnum()


def test_strategy_values_and_parsing() -> None:
    assert [s.value for s in Strategy] == ["split", "copy", "any", "as-needed"]
    assert api.parse_strategy("as-needed") is Strategy.AS_NEEDED
    with pytest.raises(ValueError, match=r"^flotilla.io/strategy: unknown strategy 'Split'"):
        api.parse_strategy("Split", source="flotilla.io/strategy")


@pytest.mark.parametrize(
    ("api_version", "kind", "gvk"),
    [
        ("v1", "Pod", GroupVersionKind("", "v1", "Pod")),
        ("apps/v1", "Deployment", GroupVersionKind("apps", "v1", "Deployment")),
        (
            "flink.apache.org/v1beta1",
            "FlinkDeployment",
            GroupVersionKind("flink.apache.org", "v1beta1", "FlinkDeployment"),
        ),
    ],
    ids=["core", "apps", "crd"],
)
def test_group_version_kind(api_version: str, kind: str, gvk: GroupVersionKind) -> None:
    parsed = GroupVersionKind.from_api_version(api_version, kind)
    assert parsed == gvk
    assert parsed.api_version == api_version


# --- annotation payloads ----------------------------------------------------------------


def test_dependencies_round_trip_as_compact_json() -> None:
    value = (
        '[{"apiVersion":"example.com/v1","kind":"Database","name":"orders","detected":false},'
        '{"apiVersion":"v1","kind":"Secret","name":"db","namespace":"shop","detected":true}]'
    )
    entries = api.parse_dependencies(value)
    assert entries[0].namespace is None
    assert entries[1] == api.DependencyEntry(
        api_version="v1", kind="Secret", name="db", namespace="shop", detected=True
    )
    assert api.dump_dependencies(entries) == value


def test_dependency_entry_without_detected_is_the_users() -> None:
    [entry] = api.parse_dependencies('[{"apiVersion":"v1","kind":"Secret","name":"x"}]')
    assert entry.detected is False


@pytest.mark.parametrize(
    ("value", "names"),
    [
        pytest.param("use-v100-32g", ["use-v100-32g"], id="one"),
        pytest.param("a,b", ["a", "b"], id="two"),
        pytest.param(" b , a,,b ", ["b", "a"], id="spaces-blanks-repeats"),
        pytest.param("", [], id="empty"),
    ],
)
def test_transformations_annotation(value: str, names: list[str]) -> None:
    assert api.parse_transformations(value) == names


def test_placement_annotation_round_trip() -> None:
    value = (
        '{"clusters":[{"cluster":"us-east","replicas":2,"state":"Active"},'
        '{"cluster":"eu-west","replicas":1,"state":"Retiring"}],'
        '"decision":"d-42","reason":"drain of eu-west"}'
    )
    placement = api.PlacementAnnotation.from_annotation(value)
    assert placement.clusters[1].state is api.PlacementState.RETIRING
    assert placement.to_annotation() == value


def test_placement_annotation_rejects_unknown_state() -> None:
    with pytest.raises(ValueError, match="Active"):
        api.PlacementAnnotation.from_annotation('{"clusters":[{"cluster":"a","state":"Gone"}]}')


def test_failover_record_uses_from_and_to() -> None:
    record = api.FailoverRecord.model_validate(
        {"from": "eu-west", "to": "us-east", "at": "2026-11-29T12:00:00Z", "reason": "NotReady"}
    )
    assert record.from_cluster == "eu-west"
    assert record.at == datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert json.loads(api.compact_json(record.model_dump(mode="json")))["from"] == "eu-west"


# --- taints and tolerations -------------------------------------------------------------

DEDICATED_BATCH = api.Taint(key="dedicated", value="batch", effect=api.TaintEffect.NO_SCHEDULE)


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        pytest.param({"key": "dedicated", "value": "batch"}, True, id="equal-any-effect"),
        pytest.param({"key": "dedicated", "value": "web"}, False, id="equal-other-value"),
        pytest.param({"key": "gpu", "value": "batch"}, False, id="other-key"),
        pytest.param({"key": "dedicated", "operator": "Exists"}, True, id="exists"),
        pytest.param({"operator": "Exists"}, True, id="empty-key-exists-tolerates-all"),
        pytest.param(
            {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
            True,
            id="same-effect",
        ),
        pytest.param(
            {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
            False,
            id="other-effect",
        ),
    ],
)
def test_toleration_tolerates(toleration: dict[str, Any], expected: bool) -> None:
    assert api.Toleration.model_validate(toleration).tolerates(DEDICATED_BATCH) is expected
