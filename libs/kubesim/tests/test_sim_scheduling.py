"""Table-driven tests of the simulated scheduler's fit, toleration and scoring rules."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from flotilla.kubesim.sim.nodes import NodeShape, node_info, node_object
from flotilla.kubesim.sim.scheduling import (
    NodeInfo,
    PodSchedulingSpec,
    choose_node,
    filter_node,
    pod_requests,
    tolerates,
    unschedulable_message,
)

GIB = 2**30


def container(cpu: str | None = None, memory: str | None = None, **extra: str) -> dict[str, Any]:
    requests = {k: v for k, v in {"cpu": cpu, "memory": memory, **extra}.items() if v}
    return {"name": "c", "image": "busybox", "resources": {"requests": requests}}


def node(
    name: str = "n1",
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: int = 110,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> NodeInfo:
    shape = NodeShape(
        cpu=cpu, memory=memory, pods=pods, gpus=gpus, labels=labels or {}, taints=taints or []
    )
    obj = node_object(name, 1, shape, "c")
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return node_info(obj)


def pod(**spec: Any) -> PodSchedulingSpec:
    spec.setdefault("containers", [container(cpu="100m", memory="64Mi")])
    return PodSchedulingSpec.from_pod_spec(spec)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": []}, {"pods": 1}, id="empty-pod-counts-one-pod-slot"),
        pytest.param(
            {"containers": [container(cpu="250m", memory="1Gi"), container(cpu="1")]},
            {"cpu": 1250, "memory": GIB, "pods": 1},
            id="sum-of-containers",
        ),
        pytest.param(
            {
                "containers": [container(cpu="500m")],
                "initContainers": [container(cpu="2", memory="64Mi")],
            },
            {"cpu": 2000, "memory": 64 * 2**20, "pods": 1},
            id="init-container-peak-wins",
        ),
        pytest.param(
            {
                "containers": [container(cpu="500m")],
                "initContainers": [
                    {**container(cpu="300m"), "restartPolicy": "Always"},
                    container(cpu="400m"),
                ],
            },
            {"cpu": 800, "pods": 1},
            id="sidecar-adds-to-containers",
        ),
        pytest.param(
            {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]},
            {"cpu": 2000, "memory": GIB, "pods": 1},
            id="limits-default-requests",
        ),
        pytest.param(
            {"containers": [container(**{"nvidia.com/gpu": "2"})], "overhead": {"cpu": "50m"}},
            {"nvidia.com/gpu": 2, "cpu": 50, "pods": 1},
            id="extended-resource-and-overhead",
        ),
    ],
)
def test_pod_requests(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests(spec) == expected


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param(
            {"key": "a", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
            {"key": "a", "value": "x", "effect": "NoSchedule"},
            True,
            id="equal-match",
        ),
        pytest.param(
            {"key": "a", "value": "x"},
            {"key": "a", "value": "x", "effect": "NoExecute"},
            True,
            id="default-operator-equal-any-effect",
        ),
        pytest.param(
            {"key": "a", "operator": "Equal", "value": "y"},
            {"key": "a", "value": "x", "effect": "NoSchedule"},
            False,
            id="value-differs",
        ),
        pytest.param(
            {"key": "a", "operator": "Exists"},
            {"key": "a", "value": "x", "effect": "NoSchedule"},
            True,
            id="exists-by-key",
        ),
        pytest.param(
            {"operator": "Exists"},
            {"key": "b", "effect": "NoExecute"},
            True,
            id="exists-without-key-tolerates-all",
        ),
        pytest.param(
            {"key": "a", "operator": "Exists", "effect": "NoExecute"},
            {"key": "a", "effect": "NoSchedule"},
            False,
            id="effect-differs",
        ),
        pytest.param(
            {"key": "b", "operator": "Exists"},
            {"key": "a", "effect": "NoSchedule"},
            False,
            id="key-differs",
        ),
    ],
)
def test_tolerates(toleration: dict[str, Any], taint: dict[str, Any], expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


GPU_TAINT = {"key": "gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("pod_spec", "node_info_", "reasons"),
    [
        pytest.param(pod(), node(), [], id="fits"),
        pytest.param(
            pod(containers=[container(cpu="5")]),
            node(cpu="4"),
            ["Insufficient cpu"],
            id="too-much-cpu",
        ),
        pytest.param(
            pod(containers=[container(cpu="5", memory="32Gi")]),
            node(),
            ["Insufficient cpu", "Insufficient memory"],
            id="cpu-and-memory",
        ),
        pytest.param(pod(), node(pods=0), ["Too many pods"], id="no-pod-slots"),
        pytest.param(
            pod(containers=[container(**{"nvidia.com/gpu": "1"})]),
            node(),
            ["Insufficient nvidia.com/gpu"],
            id="gpu-on-cpu-node",
        ),
        pytest.param(
            pod(containers=[container(**{"nvidia.com/gpu": "2"})]), node(gpus=2), [], id="gpu-fits"
        ),
        pytest.param(
            pod(nodeSelector={"disk": "ssd"}),
            node(labels={"disk": "hdd"}),
            ["node(s) didn't match Pod's node affinity/selector"],
            id="selector-mismatch",
        ),
        pytest.param(
            pod(nodeSelector={"topology.kubernetes.io/zone": "z1"}),
            node(labels={"zone": "z1"}),
            [],
            id="zone-shorthand-sets-topology-label",
        ),
        pytest.param(
            pod(),
            node(taints=[GPU_TAINT]),
            ["node(s) had untolerated taint {gpu: true}"],
            id="untolerated-noschedule",
        ),
        pytest.param(
            pod(tolerations=[{"key": "gpu", "operator": "Exists"}]),
            node(taints=[GPU_TAINT]),
            [],
            id="tolerated-noschedule",
        ),
        pytest.param(
            pod(),
            node(taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
            [],
            id="prefer-noschedule-ignored",
        ),
        pytest.param(
            pod(),
            node(taints=[{"key": "x", "effect": "NoExecute"}]),
            ["node(s) had untolerated taint {x: }"],
            id="untolerated-noexecute",
        ),
        pytest.param(
            pod(), node(unschedulable=True), ["node(s) were unschedulable"], id="cordoned"
        ),
        pytest.param(
            pod(
                tolerations=[
                    {
                        "key": "node.kubernetes.io/unschedulable",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
            ),
            node(unschedulable=True),
            [],
            id="cordon-tolerated",
        ),
        pytest.param(
            pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {
                                            "key": "metadata.name",
                                            "operator": "In",
                                            "values": ["other"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            ),
            node(name="n1"),
            ["node(s) didn't match Pod's node affinity/selector"],
            id="affinity-pins-other-node",
        ),
        pytest.param(
            pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                                {
                                    "matchExpressions": [
                                        {"key": "cores", "operator": "Gt", "values": ["8"]}
                                    ]
                                },
                            ]
                        }
                    }
                }
            ),
            node(labels={"cores": "16"}),
            [],
            id="affinity-terms-are-ored",
        ),
        pytest.param(
            pod(nodeName="n2"),
            node(name="n1"),
            ["node(s) didn't match the requested node name"],
            id="node-name-elsewhere",
        ),
    ],
)
def test_filter_node(pod_spec: PodSchedulingSpec, node_info_: NodeInfo, reasons: list[str]) -> None:
    assert filter_node(pod_spec, node_info_) == reasons


def test_requests_already_bound_count_against_the_node() -> None:
    target = node(cpu="1")
    target.reserve({"cpu": 800, "pods": 1})
    assert filter_node(pod(containers=[container(cpu="300m")]), target) == ["Insufficient cpu"]
    target.release({"cpu": 800, "pods": 1})
    assert filter_node(pod(containers=[container(cpu="300m")]), target) == []


def test_choose_node_prefers_the_least_allocated_node() -> None:
    busy, idle = node("busy"), node("idle")
    busy.reserve({"cpu": 3000, "memory": 8 * GIB, "pods": 10})
    assert choose_node(pod(), [busy, idle]).node == "idle"


def test_choose_node_breaks_ties_by_name() -> None:
    assert choose_node(pod(), [node("b"), node("a")]).node == "a"


def test_choose_node_reports_reasons_per_node() -> None:
    decision = choose_node(
        pod(containers=[container(cpu="6")]),
        [node("a"), node("b"), node("c", cpu="8", unschedulable=True)],
    )
    assert not decision.scheduled
    assert decision.reasons == Counter({"Insufficient cpu": 2, "node(s) were unschedulable": 1})
    assert unschedulable_message(3, decision.reasons) == (
        "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) were unschedulable."
    )


def test_unschedulable_message_without_nodes() -> None:
    assert unschedulable_message(0, Counter()) == (
        "0/0 nodes are available: no nodes available to schedule pods."
    )
