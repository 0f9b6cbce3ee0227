"""Simulated Node objects: names, well-known labels, capacity, and reading any Node back."""

from __future__ import annotations

import pytest

from flotilla.kubesim.sim.nodes import (
    NodeShape,
    is_ready,
    node_info,
    node_labels,
    node_name_prefix,
    node_object,
)


@pytest.mark.parametrize(
    ("cluster", "prefix"),
    [
        pytest.param("us-east", "us-east-node", id="plain"),
        pytest.param("EU_West.1", "eu-west.1-node", id="lowercased-and-cleaned"),
        pytest.param("__", "kubesim-node", id="nothing-usable-left"),
    ],
)
def test_node_name_prefix(cluster: str, prefix: str) -> None:
    assert node_name_prefix(cluster) == prefix


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({}, {}, id="well-known-only"),
        pytest.param(
            {"region": "eu", "zone": "eu-1a"},
            {
                "region": "eu",
                "zone": "eu-1a",
                "topology.kubernetes.io/region": "eu",
                "topology.kubernetes.io/zone": "eu-1a",
            },
            id="short-topology-keys",
        ),
        pytest.param(
            {"topology.kubernetes.io/zone": "z9", "gpu": "v100"},
            {"topology.kubernetes.io/zone": "z9", "gpu": "v100"},
            id="full-keys-kept-as-given",
        ),
        pytest.param(
            {"zone": "short", "topology.kubernetes.io/zone": "full"},
            {"zone": "short", "topology.kubernetes.io/zone": "full"},
            id="explicit-full-key-wins-over-short",
        ),
    ],
)
def test_node_labels(extra: dict[str, str], expected: dict[str, str]) -> None:
    labels = node_labels("n1", extra)
    assert labels["kubernetes.io/hostname"] == "n1"
    assert labels["kubernetes.io/os"] == "linux"
    assert {k: labels[k] for k in expected} == expected


def test_node_object_reads_back_as_node_info() -> None:
    shape = NodeShape(
        cpu="16",
        memory="64Gi",
        pods=50,
        gpus=4,
        labels={"tier": "gold"},
        taints=[{"key": "gpu", "effect": "NoSchedule"}],
    )
    obj = node_object("n7", 7, shape, "c1")

    info = node_info(obj)

    assert is_ready(obj)
    assert obj["spec"]["providerID"] == "kubesim://c1/n7"
    assert info.name == "n7"
    assert info.allocatable["cpu"] == 16000
    assert info.allocatable["memory"] == 64 * 2**30
    assert info.allocatable["pods"] == 50
    assert info.allocatable["nvidia.com/gpu"] == 4
    assert info.taints == [{"key": "gpu", "effect": "NoSchedule"}]
    assert info.labels["tier"] == "gold"
    assert not info.unschedulable


def test_node_info_treats_garbage_quantities_as_zero() -> None:
    obj = node_object("n1", 1, NodeShape(), "c")
    obj["status"]["allocatable"]["cpu"] = "plenty"
    assert node_info(obj).allocatable["cpu"] == 0
