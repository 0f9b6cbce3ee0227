"""A member's capacity record from its Nodes and Pods."""

from __future__ import annotations

from typing import Any

from flotilla.syncer import usage


def node(
    name: str, *, cpu: str = "4", memory: str = "8Gi", ready: bool = True, cordoned: bool = False
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": cordoned},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(node_name: str | None, *, cpu: str = "500m", phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}}


def test_free_is_allocatable_minus_bound_unfinished_pods_per_node() -> None:
    record = usage.cluster_capacity(
        "east",
        [node("n2"), node("n1")],
        [
            pod("n1"),
            pod("n1", cpu="1"),
            pod("n2", phase="Succeeded"),  # finished: holds nothing
            pod(None),  # not bound yet: holds nothing
        ],
        observed_at=5.0,
    )
    assert [n.name for n in record.nodes] == ["n1", "n2"]
    n1, n2 = record.nodes
    assert n1.free == {"cpu": 2500, "memory": 6 * 2**30, "pods": 8}
    assert n2.free == n2.allocatable == {"cpu": 4000, "memory": 8 * 2**30, "pods": 10}
    assert record.allocatable == {"cpu": 8000, "memory": 16 * 2**30, "pods": 20}
    assert record.available == {"cpu": 6500, "memory": 14 * 2**30, "pods": 18}
    # The node-level summary is what lets the scheduler see a shape fits no node.
    assert record.fit_replicas({"cpu": 3000}) == 1


def test_cordoned_and_not_ready_nodes_offer_nothing_new() -> None:
    record = usage.cluster_capacity(
        "east", [node("a", cordoned=True), node("b", ready=False), node("c")], [], observed_at=0
    )
    assert record.allocatable["cpu"] == 12000
    assert record.available["cpu"] == 4000
    assert record.nodes[0].free == {"cpu": 0, "memory": 0, "pods": 0}
