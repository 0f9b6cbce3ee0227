"""The pure capacity models: the fit rule the scheduler and the reserve script share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.common import capacity
from flotilla.common.capacity import ClusterCapacity, NodeCapacity, Reservation, Snapshot

GI = 2**30


def node(name: str, **free: int) -> NodeCapacity:
    return NodeCapacity(name=name, allocatable=dict(free), free=dict(free))


def cluster(*nodes: NodeCapacity, reserved: dict[str, int] | None = None) -> ClusterCapacity:
    available = capacity.add(*(n.free for n in nodes))
    return ClusterCapacity(
        cluster="c1",
        allocatable=capacity.add(*(n.allocatable for n in nodes)),
        available=available,
        nodes=list(nodes),
        reserved=reserved or {},
        observed_at=1.0,
    )


@pytest.mark.parametrize(
    ("record", "shape", "expected"),
    [
        (cluster(node("a", cpu=4000, pods=10)), {"cpu": 1000}, 4),
        (cluster(node("a", cpu=4000, pods=10)), {"cpu": 1500}, 2),
        # 6 cpu free in total, but no single node has 4 of them.
        (cluster(node("a", cpu=3000, pods=10), node("b", cpu=3000, pods=10)), {"cpu": 4000}, 0),
        (cluster(node("a", cpu=3000, pods=10), node("b", cpu=3000, pods=10)), {"cpu": 1500}, 4),
        (cluster(node("a", cpu=8000, pods=3)), {"cpu": 1000}, 3),
        (cluster(node("a", cpu=8000, pods=5)), {}, 5),
        (cluster(node("a", cpu=8000)), {"cpu": 1000}, 0),
        (cluster(node("a", cpu=8000, pods=9)), {"cpu": 1000, "nvidia.com/gpu": 1}, 0),
        (
            cluster(node("a", cpu=8000, pods=9, **{"nvidia.com/gpu": 2})),
            {"cpu": 1000, "nvidia.com/gpu": 1},
            2,
        ),
        (cluster(node("a", cpu=4000, memory=3 * GI, pods=9)), {"cpu": 500, "memory": GI}, 3),
        (cluster(node("a", cpu=8000, pods=9), reserved={"cpu": 5000}), {"cpu": 1000}, 3),
        (cluster(node("a", cpu=8000, pods=9), reserved={"pods": 7}), {"cpu": 1000}, 2),
        (cluster(node("a", cpu=-500, pods=9)), {"cpu": 100}, 0),
    ],
    ids=[
        "one-node",
        "rounds-down",
        "fragmentation",
        "fragmented-but-small-fits",
        "pod-slots-bound",
        "zero-request-bounded-by-pods",
        "missing-pods-is-zero",
        "missing-extended-resource-is-zero",
        "extended-resource",
        "memory-binds",
        "reservations-count",
        "reserved-pod-slots-count",
        "overcommitted-node",
    ],
)
def test_fit_replicas(record: ClusterCapacity, shape: dict[str, int], expected: int) -> None:
    assert record.fit_replicas(shape) == expected


def test_without_node_breakdown_the_cluster_level_decides() -> None:
    record = ClusterCapacity(
        cluster="c1",
        allocatable={"cpu": 8000, "pods": 10},
        available={"cpu": 6000, "pods": 10},
        reserved={"cpu": 1000},
        observed_at=0.0,
    )
    assert record.fit_replicas({"cpu": 2000}) == 2
    assert record.headroom == {"cpu": 5000, "pods": 10}


def test_negative_request_is_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        cluster(node("a", cpu=1, pods=1)).fit_replicas({"cpu": -1})


def test_a_shape_requesting_nothing_at_all_is_unbounded() -> None:
    assert cluster(node("a", pods=0)).fit_replicas({"pods": 0}) == capacity.UNBOUNDED


def test_reservation_total_counts_pod_slots() -> None:
    held = Reservation(id="r", cluster="c1", requests={"cpu": 250}, replicas=4, expires_at=9.0)
    assert held.total == {"cpu": 1000, "pods": 4}


def test_snapshot_get_and_models_are_frozen() -> None:
    record = cluster(node("a", cpu=1, pods=1))
    snap = Snapshot(clusters={"c1": record}, taken_at=2.0)
    assert snap.get("c1") is record
    assert snap.get("nope") is None
    with pytest.raises(ValueError, match="frozen"):
        record.cluster = "c2"  # type: ignore[misc]


@given(
    frees=st.lists(
        st.fixed_dictionaries(
            {
                "cpu": st.integers(0, 16_000),
                "memory": st.integers(0, 64),
                "pods": st.integers(0, 20),
            }
        ),
        min_size=1,
        max_size=6,
    ),
    shape=st.fixed_dictionaries(
        {"cpu": st.integers(0, 4000), "memory": st.integers(0, 8)},
    ),
)
def test_fit_never_exceeds_any_node_or_the_cluster(
    frees: list[dict[str, int]], shape: dict[str, int]
) -> None:
    record = cluster(*(node(f"n{i}", **free) for i, free in enumerate(frees)))
    fit = record.fit_replicas(shape)
    # The pods actually fit: place greedily, node by node, and nothing goes negative.
    remaining = [dict(free) for free in frees]
    placed = 0
    for free in remaining:
        while placed < fit and all(
            free[r] >= amount for r, amount in capacity.pod_shape(shape).items()
        ):
            for r, amount in capacity.pod_shape(shape).items():
                free[r] -= amount
            placed += 1
    assert placed == fit
    # And it is the most that fit: no node has room for one more.
    assert not any(
        all(free[r] >= amount for r, amount in capacity.pod_shape(shape).items())
        for free in remaining
    )


def test_a_uniform_cluster_adds_up_its_empty_nodes() -> None:
    record = capacity.uniform("c", {"cpu": 1000, "pods": 10}, 3, observed_at=5.0)
    assert [n.name for n in record.nodes] == ["c-n0", "c-n1", "c-n2"]
    assert record.allocatable == record.available == {"cpu": 3000, "pods": 30}
    assert record.fit_replicas({"cpu": 600}) == 3
