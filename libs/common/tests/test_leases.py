from collections import Counter

import pytest

from flotilla.common import dispatch, leases
from flotilla.common.errors import PermanentError, TemporaryError
from flotilla.common.topology import ConsumerSpec, Topology, partition_of


@pytest.mark.parametrize(("partitions", "members"), [(4, 2), (16, 3), (400, 4), (3, 5)])
def test_assignment_is_balanced_and_order_independent(partitions: int, members: int) -> None:
    names = [f"m{i}" for i in range(members)]
    owners = leases.assignment(partitions, names)
    assert sorted(owners) == list(range(partitions))
    load = Counter(owners.values())
    assert max(load.values()) <= -(-partitions // members)
    assert len(load) == min(partitions, members)
    assert owners == leases.assignment(partitions, list(reversed(names)))
    assert leases.assignment(partitions, []) == {}


def test_a_leaving_member_moves_few_partitions() -> None:
    before = leases.assignment(120, ["a", "b", "c", "d"])
    after = leases.assignment(120, ["a", "b", "c"])
    moved = [p for p in range(120) if before[p] != after[p]]
    assert len([p for p in range(120) if before[p] == "d"]) <= len(moved) <= 60


def test_partition_of_is_stable_across_processes() -> None:
    assert partition_of("apps/v1/Deployment/default/web", 16) == partition_of(
        "apps/v1/Deployment/default/web", 16
    )
    assert {partition_of(f"k{i}", 8) for i in range(200)} == set(range(8))


@pytest.mark.parametrize(
    ("error", "delivered", "expected"),
    [
        (None, 1, dispatch.Ack()),
        (TemporaryError("x", delay=2.5), 1, dispatch.Nak(delay=2.5)),
        (RuntimeError("bug"), 1, dispatch.Nak(delay=dispatch.DEFAULT_RETRY_DELAY)),
        (PermanentError("bad spec"), 1, dispatch.Term("PermanentError", "bad spec")),
    ],
    ids=["ok", "temporary", "unexpected", "permanent"],
)
def test_disposition(error: Exception | None, delivered: int, expected: dispatch.Outcome) -> None:
    assert dispatch.disposition(error, delivered=delivered, max_deliver=5) == expected


def test_disposition_gives_up_after_max_deliver() -> None:
    outcome = dispatch.disposition(TemporaryError("down"), delivered=5, max_deliver=5)
    assert isinstance(outcome, dispatch.Term)
    assert outcome.reason == "RetriesExhausted"
    assert "gave up after 5 deliveries" in outcome.error


def test_consumer_spec_rejects_unknown_event_types() -> None:
    with pytest.raises(ValueError, match="unknown event types"):
        ConsumerSpec(service="x", event_types=("ResourceObserved", "Nope"))


def test_topology_names() -> None:
    topology = Topology(prefix="fl", partitions=4)
    assert topology.events_stream.name == "FL_EVENTS"
    subject = topology.event_subject("PlacementDecided", "k")
    assert subject.startswith("fl.events.PlacementDecided.")
    spec = ConsumerSpec(service="scheduler", event_types=("ResourceAnalyzed", "ClusterObserved"))
    assert topology.partition_subjects(spec, 2) == [
        "fl.events.ResourceAnalyzed.2",
        "fl.events.ClusterObserved.2",
    ]


def test_every_service_declares_its_buckets_in_the_topology() -> None:
    topology = Topology(prefix="fl", replicas=3)
    assert [b.name for b in topology.service_buckets("scheduler")] == [
        "fl-placements",
        "fl-scheduler-clusters",
    ]
    assert [b.name for b in topology.service_buckets("watcher")] == [
        "fl-positions",
        "fl-watcher-records",
    ]
    assert topology.bucket("placements").history == 5
    assert all(b.replicas == 3 for b in topology.buckets)
    names = [b.name for b in topology.buckets]
    assert len(names) == len(set(names))
    assert {"fl-leases", "fl-scheduler-clusters", "fl-watcher-records"} <= set(names)
    with pytest.raises(KeyError, match="no bucket"):
        topology.bucket("nope")
