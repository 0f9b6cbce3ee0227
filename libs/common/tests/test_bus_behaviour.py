"""One behaviour suite, run against the in-memory bus and the real JetStream bus.

What services rely on — dedup by id, per-key order, redelivery with backoff,
dead letters with reasons and the hook, durable positions across a restart,
replay windows — must hold on both, or a handler test on the memory bus would
prove nothing about production.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from flotilla.common import bus as busmod
from flotilla.common import dispatch, events, membus, middleware
from flotilla.common.dispatch import DeadLetter, DeadLetterHook, EventBus, EventConsumer, Received
from flotilla.common.errors import InvalidObject, TemporaryError
from flotilla.common.infra import NatsServer
from flotilla.common.router import Router
from flotilla.common.testing import eventually
from flotilla.common.topology import Topology

pytestmark = pytest.mark.integration  # the JetStream half crosses a process boundary

Handler = Callable[[Received[events.ResourceObserved]], Awaitable[None]]


@dataclass
class Harness:
    bus: EventBus
    poison: Callable[[str, bytes], Awaitable[None]]


@pytest.fixture(params=["memory", "jetstream"])
async def harness(
    request: pytest.FixtureRequest, nats_server: NatsServer, unique: str
) -> AsyncIterator[Harness]:
    topology = Topology(prefix=f"beh{unique}", partitions=4, lease_ttl=1.5)
    if request.param == "memory":
        memory = membus.MemoryBus(topology)

        async def poison_memory(key: str, data: bytes) -> None:
            await memory.publish_raw("ResourceObserved", key, data)

        yield Harness(memory, poison_memory)
        await memory.close()
        return
    real = await busmod.Bus.connect(nats_server.url, topology=topology, producer="test")

    async def poison_jetstream(key: str, data: bytes) -> None:
        subject = topology.event_subject("ResourceObserved", key)
        await real.js.publish(subject, data, headers={dispatch.KEY_HEADER: key})

    try:
        yield Harness(real, poison_jetstream)
    finally:
        await real.close()


def observed(name: str, seq: int) -> events.Envelope:
    ref = events.ObjectRef(api_version="v1", kind="ConfigMap", name=name, namespace="default")
    payload = events.ResourceObserved(
        ref=ref, object={"apiVersion": "v1", "kind": "ConfigMap", "data": {"seq": str(seq)}}
    )
    return events.envelope(payload, key=ref.key, producer="test", uid=name, revision=seq)


def seq_of(received: Received[events.ResourceObserved]) -> int:
    return int(received.payload.object["data"]["seq"])


@asynccontextmanager
async def consuming(
    bus: EventBus,
    handler: Handler,
    *,
    instance: str = "i1",
    max_deliver: int = 5,
    on_dead_letter: DeadLetterHook | None = None,
    deadline: float = 30.0,
) -> AsyncIterator[EventConsumer]:
    router = Router("svc", ack_wait=5.0, max_deliver=max_deliver)
    router.on(events.ResourceObserved)(handler)
    dispatch = router.dispatch(middleware.standard("svc", handler_deadline=deadline))
    consumer = bus.consumer(
        router.spec, dispatch, instance=instance, concurrency=16, on_dead_letter=on_dead_letter
    )
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        await consumer.stop()
        await task


async def test_the_same_event_published_twice_is_delivered_once(harness: Harness) -> None:
    seen: list[int] = []

    async def handler(received: Received[events.ResourceObserved]) -> None:
        seen.append(seq_of(received))

    first = await harness.bus.publish(observed("a", 1))
    again = await harness.bus.publish(observed("a", 1))
    assert again.duplicate and again.seq == first.seq
    await harness.bus.publish_batch([observed("a", 2), observed("a", 2)])
    async with consuming(harness.bus, handler):
        await eventually(lambda: seen == [1, 2], what="both distinct events")
    replayed = [r.envelope.id async for r in harness.bus.replay()]
    assert replayed == [observed("a", 1).id, observed("a", 2).id]


async def test_each_key_is_handled_in_order_while_keys_run_in_parallel(harness: Harness) -> None:
    order: dict[str, list[int]] = defaultdict(list)
    running = 0
    most = 0
    rng = random.Random(7)

    async def handler(received: Received[events.ResourceObserved]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(rng.random() / 100)
        order[received.key].append(seq_of(received))
        running -= 1

    names = [f"k{i}" for i in range(6)]
    await harness.bus.publish_batch([observed(n, s) for s in range(1, 16) for n in names])
    async with consuming(harness.bus, handler):
        await eventually(
            lambda: sum(len(v) for v in order.values()) == 90, what="all 90 events", timeout=30
        )
    assert all(seqs == list(range(1, 16)) for seqs in order.values()), dict(order)
    assert most > 1, "different keys never ran at the same time"


async def test_a_temporary_failure_is_redelivered_and_later_events_wait(harness: Harness) -> None:
    calls: list[tuple[int, int]] = []

    async def handler(received: Received[events.ResourceObserved]) -> None:
        calls.append((seq_of(received), received.delivered))
        if seq_of(received) == 1 and received.delivered == 1:
            raise TemporaryError("member busy", delay=0.3)

    await harness.bus.publish_batch([observed("a", 1), observed("a", 2)])
    async with consuming(harness.bus, handler):
        await eventually(lambda: (2, 1) in calls, what="the second event", timeout=20)
    assert calls == [(1, 1), (1, 2), (2, 1)]


async def test_unusable_events_are_dead_lettered_with_reasons_and_reported(
    harness: Harness,
) -> None:
    hooked: list[DeadLetter] = []
    handled: list[int] = []

    async def hook(letter: DeadLetter) -> None:
        hooked.append(letter)

    async def handler(received: Received[events.ResourceObserved]) -> None:
        if received.payload.ref.name == "bad":
            raise InvalidObject("spec.strategy: unknown", reason="InvalidPolicy")
        if received.payload.ref.name == "flaky":
            raise TemporaryError("never works", delay=0.05)
        handled.append(seq_of(received))

    await harness.poison("v1/ConfigMap/default/junk", b"{not json")
    await harness.bus.publish_batch([observed("bad", 1), observed("flaky", 1), observed("ok", 1)])
    async with consuming(harness.bus, handler, max_deliver=3, on_dead_letter=hook):
        await eventually(lambda: len(hooked) == 3, what="three dead letters", timeout=30)
        assert handled == [1]
    by_reason = {letter.reason: letter for letter in await harness.bus.dead_letters()}
    assert set(by_reason) == {"InvalidEvent", "InvalidObject", "RetriesExhausted"}
    assert by_reason["InvalidObject"].envelope is not None
    assert sorted(h.user_reason for h in hooked) == ["", "", "InvalidPolicy"]
    assert by_reason["RetriesExhausted"].delivered == 3


async def test_a_hung_handler_is_cancelled_at_its_deadline_and_retried(harness: Harness) -> None:
    attempts: list[int] = []

    async def handler(received: Received[events.ResourceObserved]) -> None:
        attempts.append(received.delivered)
        if received.delivered == 1:
            await asyncio.Event().wait()  # a hub connection that never answers

    await harness.bus.publish(observed("a", 1))
    async with consuming(harness.bus, handler, deadline=0.3):
        await eventually(lambda: attempts == [1, 2], what="a retry after the deadline", timeout=20)


async def test_a_restarted_consumer_carries_on_where_the_last_one_stopped(
    harness: Harness,
) -> None:
    seen: list[int] = []

    async def handler(received: Received[events.ResourceObserved]) -> None:
        seen.append(seq_of(received))

    await harness.bus.publish_batch([observed("a", s) for s in (1, 2, 3)])
    async with consuming(harness.bus, handler):
        await eventually(lambda: seen == [1, 2, 3], what="the first three")
    await harness.bus.publish_batch([observed("a", s) for s in (4, 5)])
    async with consuming(harness.bus, handler, instance="i2"):
        await eventually(lambda: seen == [1, 2, 3, 4, 5], what="only the new two", timeout=20)


async def test_replay_reads_a_window_by_sequence(harness: Harness) -> None:
    acks = [await harness.bus.publish(observed("a", s)) for s in range(1, 6)]
    window = [
        r.sequence
        async for r in harness.bus.replay(start_sequence=acks[1].seq, end_sequence=acks[3].seq)
    ]
    assert window == [a.seq for a in acks[1:4]]
