"""The pure core: one decision and analysis in, per-cluster manifests out."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.common.api import GroupVersionKind, PlacementState, Strategy, TransformationSpec
from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.common.events import (
    ClusterPlacement,
    ObjectRef,
    PlacementDecided,
    ResourceAnalyzed,
)
from flotilla.common.interpreters import Registry
from flotilla.transformer import rendering, steps
from flotilla.transformer.steps import ClusterFacts
from flotilla.transformer.transformations import TRANSFORMATION, NamedTransformation

REGISTRY = Registry.with_builtins()
DEPLOYMENT = GroupVersionKind("apps", "v1", "Deployment")


def deployment(replicas: int = 9, **metadata: Any) -> dict[str, Any]:
    obj = manifest(
        "apps/v1",
        "Deployment",
        {"replicas": replicas, "template": template(pod_spec(container("app")))},
    )
    obj["metadata"].update({"uid": "u-1", "generation": 2, "resourceVersion": "7", **metadata})
    obj["status"] = {"replicas": replicas}
    return obj


def analyzed(obj: dict[str, Any]) -> ResourceAnalyzed:
    interpreter = REGISTRY.for_object(obj)
    return ResourceAnalyzed(
        ref=ObjectRef.of(obj),
        object=obj,
        strategy=Strategy.SPLIT,
        replicas=obj["spec"]["replicas"],
        interpreter=interpreter.spec,
    )


def decided(
    *placements: tuple[str, int | None, PlacementState], ref: ObjectRef
) -> PlacementDecided:
    return PlacementDecided(
        ref=ref,
        decision_id="d-1",
        clusters=[ClusterPlacement(cluster=c, replicas=r, state=s) for c, r, s in placements],
    )


ACTIVE, RETIRING = PlacementState.ACTIVE, PlacementState.RETIRING


def test_each_cluster_gets_its_share_and_retiring_keeps_its_manifest() -> None:
    obj = deployment()
    decision = decided(
        ("a", 3, ACTIVE), ("b", 6, ACTIVE), ("c", 2, RETIRING), ref=ObjectRef.of(obj)
    )
    rendered, failed = rendering.render_placement(analyzed(obj), decision, {})
    assert failed == []
    assert [(w.cluster, w.manifest["spec"]["replicas"], w.state) for w in rendered] == [
        ("a", 3, ACTIVE),
        ("b", 6, ACTIVE),
        ("c", 2, RETIRING),
    ]
    first = rendered[0].manifest
    assert "status" not in first and "uid" not in first["metadata"]
    assert first["metadata"]["annotations"]["flotilla.io/hub-generation"] == "2"
    assert obj["spec"]["replicas"] == 9  # the analysis is never modified


def test_a_cluster_without_the_type_gets_no_work_and_the_others_do() -> None:
    obj = deployment()
    clusters = {
        "old": ClusterFacts("old", api_resources=frozenset({GroupVersionKind("", "v1", "Pod")})),
        "new": ClusterFacts("new", api_resources=frozenset({DEPLOYMENT})),
    }
    decision = decided(
        ("old", 3, ACTIVE), ("new", 3, ACTIVE), ("unreported", 3, ACTIVE), ref=ObjectRef.of(obj)
    )
    rendered, failed = rendering.render_placement(analyzed(obj), decision, clusters)
    assert [w.cluster for w in rendered] == ["new", "unreported"]
    assert [(f.cluster, f.reason) for f in failed] == [("old", "IncompatibleCluster")]
    assert "cluster old" in failed[0].message and "apps/v1, Kind=Deployment" in failed[0].message


def test_a_failing_transformation_fails_only_its_cluster() -> None:
    obj = deployment()
    broken = NamedTransformation(
        TRANSFORMATION,
        "broken",
        TransformationSpec.model_validate(
            {
                "transformations": [
                    {
                        "targetClusters": ["b"],
                        "patchType": "json",
                        "patch": [{"op": "remove", "path": "/spec/missing"}],
                    }
                ]
            }
        ),
    )
    decision = decided(("a", 4, ACTIVE), ("b", 5, ACTIVE), ref=ObjectRef.of(obj))
    rendered, failed = rendering.render_placement(analyzed(obj), decision, {}, (broken,))
    assert [w.cluster for w in rendered] == ["a"]
    assert failed[0].cluster == "b" and "Transformation broken" in failed[0].message


labels = st.dictionaries(
    st.sampled_from([steps.SECURITY_DEFAULTS_LABEL, steps.NAMESPACE_PREFIX_LABEL, "region"]),
    st.sampled_from(["restricted", "eu-", "x"]),
)
extra_annotations = st.dictionaries(
    st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4
)


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    cluster_labels=labels,
    annotations=extra_annotations,
)
def test_rendering_is_deterministic(
    replicas: list[int], cluster_labels: dict[str, str], annotations: dict[str, str]
) -> None:
    """Same inputs, byte-identical manifests; insertion order of the input does not matter."""
    obj = deployment(annotations=annotations)
    shuffled = copy.deepcopy(obj)
    shuffled["metadata"] = dict(reversed(list(shuffled["metadata"].items())))
    shuffled["metadata"]["annotations"] = dict(reversed(list(annotations.items())))
    names = [f"c{i}" for i in range(len(replicas))]
    clusters = {n: ClusterFacts(n, cluster_labels) for n in names}
    decision = decided(
        *((n, r, ACTIVE) for n, r in zip(names, replicas, strict=True)), ref=ObjectRef.of(obj)
    )
    first, _ = rendering.render_placement(analyzed(obj), decision, clusters)
    again, _ = rendering.render_placement(analyzed(shuffled), decision, clusters)
    assert [rendering.canonical(w.manifest) for w in first] == [
        rendering.canonical(w.manifest) for w in again
    ]
    assert [w.manifest["spec"]["replicas"] for w in first] == replicas


def test_a_dependency_renders_without_replicas_or_transformations() -> None:
    config = manifest("v1", "ConfigMap", name="settings", data={"a": "1"})
    config["metadata"]["resourceVersion"] = "3"
    result = rendering.render_dependency(config, ClusterFacts("a"), "d-9")
    assert result["data"] == {"a": "1"}
    assert result["metadata"]["labels"] == {"flotilla.io/origin": "v1-configmap-shop-settings"}
    assert result["metadata"]["annotations"]["flotilla.io/decision"] == "d-9"
    assert "resourceVersion" not in result["metadata"]


def ref(kind: str, name: str = "x", api_version: str = "v1") -> ObjectRef:
    return ObjectRef(api_version=api_version, kind=kind, name=name, namespace="shop")


A, B, C = (
    ref("Deployment", "a", "apps/v1"),
    ref("Deployment", "b", "apps/v1"),
    ref("Job", "c", "batch/v1"),
)
DEPENDENT_CASES = [
    ("first dependent", {}, A, {"x"}, {"x": [A]}),
    ("second dependent joins, sorted", {"x": [B]}, A, {"x"}, {"x": [A, B]}),
    ("leaves one cluster, stays on another", {"x": [A], "y": [A, B]}, A, {"y"}, {"y": [A, B]}),
    ("last dependent leaves", {"x": [A]}, A, set(), {}),
    ("others untouched", {"x": [B, C]}, A, set(), {"x": [B, C]}),
    ("idempotent", {"x": [A]}, A, {"x"}, {"x": [A]}),
]


@pytest.mark.parametrize(
    ("current", "dependent", "needed_on", "expected"),
    [c[1:] for c in DEPENDENT_CASES],
    ids=[c[0] for c in DEPENDENT_CASES],
)
def test_dependents_after(
    current: dict[str, list[ObjectRef]],
    dependent: ObjectRef,
    needed_on: set[str],
    expected: dict[str, list[ObjectRef]],
) -> None:
    assert rendering.dependents_after(current, dependent, needed_on) == expected


def test_install_order_puts_namespaces_first() -> None:
    refs = [
        ref("RoleBinding", api_version="rbac.authorization.k8s.io/v1"),
        ref("ConfigMap"),
        ObjectRef(api_version="v1", kind="Namespace", name="shop"),
        ref("ServiceAccount"),
        ref("Widget", api_version="example.com/v1"),
    ]
    ordered = sorted(refs, key=rendering.install_rank)
    assert [r.kind for r in ordered] == [
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "RoleBinding",
        "Widget",
    ]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (manifest("v1", "ConfigMap"), True),
        (manifest("v1", "Secret"), True),
        (manifest("v1", "ConfigMap", annotations={"flotilla.io/strategy": "copy"}), False),
        (manifest("apps/v1", "Deployment", {"replicas": 1}), False),
    ],
    ids=["configmap", "secret", "configmap annotated copy", "deployment"],
)
def test_is_as_needed(obj: dict[str, Any], expected: bool) -> None:
    assert rendering.is_as_needed(obj) is expected
