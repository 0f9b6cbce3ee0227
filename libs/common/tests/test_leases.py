import asyncio
from collections import Counter

import pytest
from nats.js.errors import KeyWrongLastSequenceError

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


class _Entry:
    def __init__(self, key: str) -> None:
        self.key = key


class _Watcher:
    def __init__(self, entries: list[_Entry]) -> None:
        self._entries: list[_Entry | None] = [*entries, None]

    def __aiter__(self) -> "_Watcher":
        return self

    async def __anext__(self) -> _Entry | None:
        if not self._entries:
            raise StopAsyncIteration
        return self._entries.pop(0)

    async def stop(self) -> None:
        self._entries = []


class _FakeKV:
    """The part of nats-py's KeyValue the leases use, counting what a round does."""

    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.revision = 0
        self.calls: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.entries_read = 0

    def _write(self, key: str) -> int:
        self.revision += 1
        self.data[key] = self.revision
        return self.revision

    async def put(self, key: str, value: bytes) -> int:
        self.calls.append("put")
        return self._write(key)

    async def create(self, key: str, value: bytes) -> int:
        self.calls.append("create")
        if key in self.data:
            raise KeyWrongLastSequenceError()
        return self._write(key)

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.calls.append("update")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            for _ in range(3):  # a round trip: other coroutines run meanwhile
                await asyncio.sleep(0)
            if self.data.get(key) != last:
                raise KeyWrongLastSequenceError()
            return self._write(key)
        finally:
            self.in_flight -= 1

    async def delete(self, key: str, last: int | None = None) -> None:
        self.data.pop(key, None)

    async def watch(self, keys: str, **_: object) -> _Watcher:
        self.calls.append("watch")
        assert keys.endswith(">")
        matching = sorted(k for k in self.data if k.startswith(keys[:-1]))
        self.entries_read += len(matching)
        return _Watcher([_Entry(k) for k in matching])

    async def keys(self) -> list[str]:
        self.calls.append("keys")
        self.entries_read += len(self.data)
        return sorted(self.data)


async def _noop(partition: int) -> None:
    return None


async def test_a_round_renews_every_lease_at_once_before_anything_else() -> None:
    """On a busy replica every round trip waits its turn: sixteen renewals one after
    another (after the membership listing) let leases lapse under load."""
    kv = _FakeKV()
    held = leases.PartitionLeases(
        kv, group="svc", instance="a", partitions=16, on_acquire=_noop, on_release=_noop
    )
    assert await held.tick() == set(range(16))
    kv.calls.clear()
    assert await held.tick() == set(range(16))
    assert kv.calls[:16] == ["update"] * 16  # renewing comes first …
    assert kv.most_in_flight == 16  # … all of it at once
    assert held.lost == 0


async def test_a_lease_found_taken_at_renewal_is_given_up() -> None:
    kv = _FakeKV()
    released: list[int] = []

    async def release(partition: int) -> None:
        released.append(partition)

    held = leases.PartitionLeases(
        kv, group="svc", instance="a", partitions=4, on_acquire=_noop, on_release=release
    )
    await held.tick()
    kv.data["svc.p2"] += 100  # another replica holds it now
    await held.renew()
    await asyncio.gather(*held.releasing.values())
    assert (held.lost, released, sorted(held.owned)) == (1, [2], [0, 1, 3])


async def test_the_membership_listing_reads_this_groups_members_only() -> None:
    kv = _FakeKV()
    for group in ("other", "third"):
        for n in range(16):
            kv.data[f"{group}.p{n}"] = 1
        kv.data[f"{group}.members.x"] = 1
    kv.data["svc.members.b"] = 1
    held = leases.PartitionLeases(
        kv, group="svc", instance="a", partitions=4, on_acquire=_noop, on_release=_noop
    )
    kv.entries_read = 0
    assert await held.members() == ["b"]
    assert kv.entries_read == 1
