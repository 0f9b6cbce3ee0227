"""The bus against a real nats-server with JetStream (file storage)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import nats.aio.subscription
import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from flotilla.common import bus as busmod
from flotilla.common import events, middleware
from flotilla.common.dispatch import DeadLetter, DeadLetterHook, Received
from flotilla.common.errors import PermanentError, TemporaryError
from flotilla.common.health import EventMetrics
from flotilla.common.infra import NatsServer
from flotilla.common.leases import PartitionLeases, assignment
from flotilla.common.router import Router
from flotilla.common.service import guarded
from flotilla.common.testing import eventually
from flotilla.common.topology import Topology, partition_of

pytestmark = pytest.mark.integration

ObservedHandler = Callable[[events.Envelope], Awaitable[None]]


def observed(name: str, seq: int, namespace: str = "default") -> events.Envelope:
    ref = events.ObjectRef(api_version="v1", kind="ConfigMap", name=name, namespace=namespace)
    payload = events.ResourceObserved(
        ref=ref, object={"apiVersion": "v1", "kind": "ConfigMap", "data": {"seq": str(seq)}}
    )
    return events.envelope(payload, key=ref.key, producer="test", uid=name, revision=seq)


def seq_of(event: events.Envelope) -> int:
    assert isinstance(event.payload, events.ResourceObserved)
    return int(event.payload.object["data"]["seq"])


@asynccontextmanager
async def connected(
    server: NatsServer, prefix: str, tracer: trace.Tracer | None = None
) -> AsyncIterator[busmod.Bus]:
    topology = Topology(prefix=prefix, partitions=4, lease_ttl=1.5)
    bus = await busmod.Bus.connect(server.url, topology=topology, producer="test", tracer=tracer)
    try:
        yield bus
    finally:
        await bus.close()


@asynccontextmanager
async def consuming(
    bus: busmod.Bus,
    handler: ObservedHandler,
    *,
    instance: str = "i1",
    ack_wait: float = 5.0,
    max_deliver: int = 5,
    on_dead_letter: DeadLetterHook | None = None,
    metrics: EventMetrics | None = None,
) -> AsyncIterator[busmod.Consumer]:
    router = Router("svc", ack_wait=ack_wait, max_deliver=max_deliver)

    @router.on(events.ResourceObserved)
    async def route(received: Received[events.ResourceObserved]) -> None:
        await handler(received.envelope)

    chain = [middleware.tracing("svc", bus.tracer)]
    if metrics is not None:
        chain.append(middleware.metrics(metrics))
    consumer = bus.consumer(
        router.spec,
        router.dispatch(chain),
        instance=instance,
        concurrency=16,
        on_dead_letter=on_dead_letter,
    )
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        await consumer.stop()
        await task


async def test_publishing_the_same_event_twice_stores_it_once(
    nats_server: NatsServer, unique: str
) -> None:
    async with connected(nats_server, f"dup{unique}") as bus:
        event = observed("a", 1)
        first = await bus.publish(event)
        second = await bus.publish(event)
        assert second.duplicate
        assert first.seq == second.seq
        await bus.publish_batch([event, observed("a", 2), observed("a", 2)])
        info = await bus.js.stream_info(bus.topology.events_stream.name)
        assert info.state.messages == 2


async def test_ensure_is_idempotent(nats_server: NatsServer, unique: str) -> None:
    async with connected(nats_server, f"idem{unique}") as bus:
        await bus.ensure()
        await bus.ensure()
        names = [s.config.name for s in await bus.js.streams_info()]
        assert names.count(bus.topology.events_stream.name) == 1
        for bucket in bus.topology.buckets:  # every service's buckets, created up front
            assert f"KV_{bucket.name}" in names


async def test_temporary_error_is_redelivered_after_its_delay(
    nats_server: NatsServer, unique: str
) -> None:
    calls: list[float] = []

    async def handler(event: events.Envelope) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise TemporaryError("member busy", delay=0.8)

    registry = CollectorRegistry()
    metrics = EventMetrics(registry)
    async with (
        connected(nats_server, f"tmp{unique}") as bus,
        consuming(bus, handler, metrics=metrics),
    ):
        await bus.publish(observed("a", 1))
        await eventually(lambda: len(calls) == 2)
    assert calls[1] - calls[0] >= 0.75
    sample = registry.get_sample_value
    assert sample("flotilla_events_handled_total", {"type": "ResourceObserved"}) == 1
    labels = {"type": "ResourceObserved", "error": "TemporaryError"}
    assert sample("flotilla_events_failed_total", labels) == 1


async def test_retry_never_lets_a_newer_event_of_the_key_overtake(
    nats_server: NatsServer, unique: str
) -> None:
    seen: list[int] = []

    async def handler(event: events.Envelope) -> None:
        seen.append(seq_of(event))
        if seen == [1]:
            raise TemporaryError("not yet", delay=0.3)

    async with connected(nats_server, f"ord{unique}") as bus, consuming(bus, handler):
        await bus.publish_batch([observed("a", i) for i in (1, 2, 3)])
        await eventually(lambda: len(seen) == 4)
    assert seen == [1, 1, 2, 3]


async def test_permanent_error_dead_letters_and_the_key_carries_on(
    nats_server: NatsServer, unique: str
) -> None:
    handled: list[int] = []
    hooked: list[DeadLetter] = []

    async def handler(event: events.Envelope) -> None:
        if seq_of(event) == 1:
            raise PermanentError("spec.replicas must be a number")
        handled.append(seq_of(event))

    async def hook(letter: DeadLetter) -> None:
        hooked.append(letter)

    async with (
        connected(nats_server, f"perm{unique}") as bus,
        consuming(bus, handler, on_dead_letter=hook),
    ):
        await bus.publish_batch([observed("a", 1), observed("a", 2)])
        await eventually(lambda: handled == [2] and len(hooked) == 1)
        letters = await bus.dead_letters()
    assert len(letters) == 1
    assert letters[0].reason == "PermanentError"
    assert "spec.replicas must be a number" in letters[0].error
    assert letters[0].envelope is not None and seq_of(letters[0].envelope) == 1
    assert hooked[0].envelope == letters[0].envelope


async def test_poison_bytes_are_dead_lettered_and_others_flow(
    nats_server: NatsServer, unique: str
) -> None:
    handled: list[int] = []

    async def handler(event: events.Envelope) -> None:
        handled.append(seq_of(event))

    async with connected(nats_server, f"poison{unique}") as bus, consuming(bus, handler):
        subject = bus.topology.event_subject("ResourceObserved", "junk")
        await bus.js.publish(subject, b"{not json", headers={busmod.KEY_HEADER: "junk"})
        await bus.publish(observed("b", 7))
        await eventually(lambda: handled == [7])
        letters: list[DeadLetter] = await eventually(bus.dead_letters, what="a dead letter")
    assert letters[0].reason == "InvalidEvent"
    assert "not a valid Flotilla event" in letters[0].error
    assert letters[0].data == b"{not json"


async def test_an_incompatible_version_is_dead_lettered_naming_both_and_newer_fields_flow(
    nats_server: NatsServer, unique: str
) -> None:
    """A rolling upgrade: an upgraded producer's event that only added a field is
    handled; one of a version this consumer cannot read is dead-lettered, saying so."""
    handled: list[int] = []

    async def handler(event: events.Envelope) -> None:
        handled.append(seq_of(event))

    def from_newer_producer(seq: int, **payload: object) -> bytes:
        wire = json.loads(events.encode(observed("c", seq)))
        wire["payload"].update(payload)
        return json.dumps(wire).encode()

    async with connected(nats_server, f"versions{unique}") as bus, consuming(bus, handler):
        subject = bus.topology.event_subject("ResourceObserved", "c")
        headers = {busmod.KEY_HEADER: "c"}
        await bus.js.publish(subject, from_newer_producer(1, version=2), headers=headers)
        await bus.js.publish(subject, from_newer_producer(2, shard="eu-1"), headers=headers)
        await eventually(lambda: handled == [2])
        letters: list[busmod.DeadLetter] = await eventually(bus.dead_letters, what="a dead letter")
    assert [letter.reason for letter in letters] == ["InvalidEvent"]
    assert letters[0].error == (
        "ResourceObserved version 2 is not supported: "
        "this consumer reads ResourceObserved version 1"
    )
    assert json.loads(letters[0].data)["payload"]["version"] == 2


async def test_retries_exhausted_go_to_the_dead_letter_stream(
    nats_server: NatsServer, unique: str
) -> None:
    attempts = 0

    async def handler(event: events.Envelope) -> None:
        nonlocal attempts
        attempts += 1
        raise TemporaryError("still down", delay=0.05)

    async with (
        connected(nats_server, f"exh{unique}") as bus,
        consuming(bus, handler, max_deliver=3),
    ):
        await bus.publish(observed("a", 1))
        await eventually(lambda: attempts == 3)
        letters: list[DeadLetter] = await eventually(bus.dead_letters, what="a dead letter")
    assert letters[0].reason == "RetriesExhausted"
    assert letters[0].delivered == 3


@pytest.mark.slow
async def test_two_instances_keep_per_key_order_and_handle_each_event_once(
    nats_server: NatsServer, unique: str
) -> None:
    keys, per_key = 50, 20
    handled: dict[str, list[int]] = defaultdict(list)
    by_instance: dict[str, set[str]] = defaultdict(set)
    effects: set[str] = set()

    def handler_for(instance: str) -> ObservedHandler:
        async def handler(event: events.Envelope) -> None:
            await asyncio.sleep(0.001)  # let keys interleave
            if event.id not in effects:  # the effect is idempotent by event id
                effects.add(event.id)
                handled[event.key].append(seq_of(event))
            by_instance[instance].add(event.key)

        return handler

    async with (
        connected(nats_server, f"two{unique}") as bus,
        consuming(bus, handler_for("i1"), instance="i1") as first,
        consuming(bus, handler_for("i2"), instance="i2") as second,
    ):
        await eventually(
            lambda: (
                first.partitions
                and second.partitions
                and len(first.partitions | second.partitions) == 4
            )
        )
        assert not first.partitions & second.partitions
        batch = [observed(f"k{k}", s) for s in range(per_key) for k in range(keys)]
        for start in range(0, len(batch), 200):
            await bus.publish_batch(batch[start : start + 200])
        await eventually(lambda: sum(map(len, handled.values())) == keys * per_key, timeout=60)
    assert len(handled) == keys
    for key, seqs in handled.items():
        assert seqs == list(range(per_key)), key
    assert by_instance["i1"] and by_instance["i2"], "both instances must take part"
    assert not by_instance["i1"] & by_instance["i2"], "a key must stay on one instance"


@pytest.mark.slow
async def test_nats_killed_mid_stream_resumes_without_loss(
    fresh_nats: NatsServer, unique: str
) -> None:
    total = 300
    handled: set[int] = set()

    async def handler(event: events.Envelope) -> None:
        await asyncio.sleep(0.01)
        handled.add(seq_of(event))

    async with connected(fresh_nats, f"kill{unique}") as bus:
        await bus.publish_batch([observed(f"k{i % 10}", i) for i in range(total)])
        async with consuming(bus, handler):
            await eventually(lambda: len(handled) > 20)
            fresh_nats.kill()
            assert len(handled) < total, "the kill must land mid-stream"
            await asyncio.sleep(0.5)
            fresh_nats.start()
            await eventually(lambda: len(handled) == total, timeout=60)
    assert handled == set(range(total))


async def test_trace_continues_from_publisher_to_consumer(
    nats_server: NatsServer, unique: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    got = asyncio.Event()

    async def handler(event: events.Envelope) -> None:
        got.set()

    async with connected(nats_server, f"trace{unique}", tracer) as bus, consuming(bus, handler):
        with tracer.start_as_current_span("hub change") as root:
            await bus.publish(observed("a", 1))
        await asyncio.wait_for(got.wait(), 20)
    spans = exporter.get_finished_spans()
    (publish,) = [s for s in spans if s.kind == SpanKind.PRODUCER]
    (process,) = [s for s in spans if s.kind == SpanKind.CONSUMER]
    trace_id = root.get_span_context().trace_id
    assert publish.context is not None and process.context is not None
    assert publish.context.trace_id == process.context.trace_id == trace_id
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "nats"


async def test_replay_reads_a_window_by_sequence_and_type(
    nats_server: NatsServer, unique: str
) -> None:
    async with connected(nats_server, f"replay{unique}") as bus:
        acks = await bus.publish_batch([observed("a", i) for i in range(10)])
        window = [
            r
            async for r in bus.replay(
                start_sequence=acks[3].seq,
                end_sequence=acks[6].seq,
                event_types=["ResourceObserved"],
            )
        ]
        assert [seq_of(r.envelope) for r in window] == [3, 4, 5, 6]
        assert [r async for r in bus.replay(event_types=["PlacementDecided"])] == []
        assert len([r async for r in bus.replay()]) == 10


async def test_a_handler_longer_than_ack_wait_is_kept_alive_not_redelivered(
    nats_server: NatsServer, unique: str
) -> None:
    calls = 0
    done = asyncio.Event()

    async def handler(event: events.Envelope) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(2.5)  # well past ack_wait: only in_progress keeps it ours
        done.set()

    async with connected(nats_server, f"long{unique}") as bus:
        async with consuming(bus, handler, ack_wait=1.0):
            await bus.publish(observed("a", 1))
            await asyncio.wait_for(done.wait(), 20)
            await asyncio.sleep(1.5)  # a redelivery would have arrived by now
        info = await bus.js.consumer_info(
            bus.topology.events_stream.name,
            f"svc-p{partition_of(observed('a', 1).key, bus.topology.partitions)}",
        )
    assert calls == 1
    assert info.num_redelivered == 0


async def test_replay_reads_a_window_by_time(nats_server: NatsServer, unique: str) -> None:
    async with connected(nats_server, f"replayt{unique}") as bus:
        await bus.publish_batch([observed("a", i) for i in range(5)])
        await asyncio.sleep(0.05)  # a gap in stream time to cut the window at
        middle = datetime.now(UTC)
        await asyncio.sleep(0.05)
        await bus.publish_batch([observed("a", i) for i in range(5, 10)])
        after = [seq_of(r.envelope) async for r in bus.replay(start_time=middle)]
        before = [seq_of(r.envelope) async for r in bus.replay(end_time=middle)]
    assert after == [5, 6, 7, 8, 9]
    assert before == [0, 1, 2, 3, 4]


async def test_replay_of_a_window_with_nothing_in_it_is_empty_not_an_error(
    nats_server: NatsServer, unique: str
) -> None:
    async with connected(nats_server, f"replaye{unique}") as bus:
        await bus.publish_batch([observed("a", i) for i in range(3)])
        later = datetime.now(UTC)
        by_type = [r async for r in bus.replay(start_sequence=2, event_types=["ClusterObserved"])]
        by_time = [r async for r in bus.replay(start_time=later)]
    assert by_type == [] and by_time == []


@pytest.mark.parametrize(
    "timeout",
    [nats.errors.TimeoutError(), TimeoutError()],
    ids=["nats-timeout", "bare-asyncio-timeout"],
)
async def test_replay_reads_past_a_fetch_timeout_to_the_end_of_a_long_window(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch, timeout: Exception
) -> None:
    total = busmod.REPLAY_BATCH * 2 + 10
    fetch = JetStreamContext.PullSubscription.fetch
    calls = 0

    async def slow_second_fetch(
        self: JetStreamContext.PullSubscription, *args: Any, **kwargs: Any
    ) -> list[Msg]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise timeout  # the server did not answer in time, mid-window
        return await fetch(self, *args, **kwargs)

    async with connected(nats_server, f"replayto{unique}") as bus:
        for start in range(0, total, 200):
            await bus.publish_batch(
                [observed("a", i) for i in range(start, min(start + 200, total))]
            )
        monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", slow_second_fetch)
        replayed = [seq_of(r.envelope) async for r in bus.replay()]
    assert calls > 2
    assert replayed == list(range(total))


async def test_a_consumer_restarted_after_a_crash_consumes_again(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    handled: list[int] = []
    crash = asyncio.Event()
    tick = PartitionLeases.tick

    async def crashing_tick(self: PartitionLeases) -> set[int]:
        if crash.is_set():
            crash.clear()
            raise RuntimeError("lease round blew up")
        return await tick(self)

    router = Router("svc", ack_wait=5.0)

    @router.on(events.ResourceObserved)
    async def handler(received: Received[events.ResourceObserved]) -> None:
        handled.append(seq_of(received.envelope))

    monkeypatch.setattr(PartitionLeases, "tick", crashing_tick)
    async with connected(nats_server, f"restart{unique}") as bus:
        consumer = bus.consumer(router.spec, router.dispatch(), instance="i1")
        stopped = False
        task = asyncio.create_task(guarded("consumer", consumer.run, finished=lambda: stopped))
        try:
            await bus.publish(observed("a", 1))
            await eventually(lambda: handled == [1])
            crash.set()  # the next lease round raises: run() ends and is restarted
            await eventually(lambda: not crash.is_set() and len(consumer.partitions) == 4)
            await bus.publish(observed("a", 2))
            await eventually(lambda: handled == [1, 2], what="the restarted consumer handling")
        finally:
            stopped = True
            await consumer.stop()
            await task


@pytest.mark.slow
async def test_handing_partitions_over_while_a_key_is_slow_keeps_order_and_leases(
    nats_server: NatsServer, unique: str
) -> None:
    """The slow key's partition moves to the new replica; draining it takes longer
    than the lease TTL, and the old replica's other leases must not lapse meanwhile."""
    order: dict[str, list[int]] = defaultdict(list)
    slow_per_event = 0.8

    def handler_for(instance: str) -> ObservedHandler:
        async def handler(event: events.Envelope) -> None:
            if event.key.endswith("/slow") and instance == "i1":
                await asyncio.sleep(slow_per_event)
            order[event.key].append(seq_of(event))

        return handler

    async with connected(nats_server, f"hand{unique}") as bus:
        partitions = bus.topology.partitions
        moving = {p for p, owner in assignment(partitions, ["i1", "i2"]).items() if owner == "i2"}
        slow_key = observed("slow", 0).key
        assert partition_of(slow_key, partitions) in moving
        keys = [f"k{i}" for i in range(20)]
        rounds = 15
        async with consuming(bus, handler_for("i1"), instance="i1") as first:
            await eventually(lambda: len(first.partitions) == partitions)
            await bus.publish_batch([observed("slow", s) for s in range(3)])
            await eventually(lambda: not order[slow_key] and first.queue.pending >= 3)

            async def flow() -> None:
                for s in range(rounds):
                    await bus.publish_batch([observed(k, s) for k in keys])
                    await asyncio.sleep(0.2)

            flowing = asyncio.create_task(flow())
            async with consuming(bus, handler_for("i2"), instance="i2") as second:
                await eventually(
                    lambda: second.partitions == moving and first.partitions.isdisjoint(moving),
                    timeout=30,
                    what="the hand-over",
                )
                await flowing
                await bus.publish(observed("slow", 3))
                await eventually(
                    lambda: (
                        len(order[slow_key]) >= 4
                        and all(len(order[observed(k, 0).key]) >= rounds for k in keys)
                    ),
                    timeout=30,
                )
                assert first.leases_lost == 0, "the slow replica let a lease lapse"
                assert second.leases_lost == 0
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"{key} handled out of order: {seqs}"
    assert sorted(set(order[slow_key])) == [0, 1, 2, 3]


# --- fetching (`bus._fetch_batch`, nats-py's fetch without a task per message) ------


@asynccontextmanager
async def pull(server: NatsServer, name: str) -> AsyncIterator[tuple[Any, JetStreamContext]]:
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    sub = await js.pull_subscribe(f"{name}.>", durable=name)
    try:
        yield sub, js
    finally:
        await nc.close()


async def test_a_fetch_takes_what_is_there_in_order_and_no_more_than_asked(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = 0
    library_next_msg = nats.aio.subscription.Subscription.next_msg

    async def counted(self: Any, timeout: float | None = 1.0) -> Msg:
        nonlocal waits
        waits += 1
        return await library_next_msg(self, timeout)

    monkeypatch.setattr(nats.aio.subscription.Subscription, "next_msg", counted)
    async with pull(nats_server, f"fetch{unique}") as (sub, js):
        for i in range(10):
            await js.publish(f"fetch{unique}.x", str(i).encode())
        started = time.monotonic()
        first = await busmod._fetch_batch(sub, 4, 2.0)
        rest = await busmod._fetch_batch(sub, 64, 2.0)
        assert time.monotonic() - started < 1.0, "the no-wait answer ends a fetch"
        assert [m.data for m in first + rest] == [str(i).encode() for i in range(10)]
        assert waits <= 2, "messages already received are taken without waiting"
        for msg in first + rest:
            await msg.ack()


async def test_a_fetch_waits_for_the_next_message_or_times_out(
    nats_server: NatsServer, unique: str
) -> None:
    async with pull(nats_server, f"wait{unique}") as (sub, js):
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await busmod._fetch_batch(sub, 8, 0.3)
        assert 0.25 <= time.monotonic() - started < 1.5

        async def later() -> None:
            await asyncio.sleep(0.2)
            await js.publish(f"wait{unique}.x", b"late")

        publisher = asyncio.create_task(later())
        msgs = await busmod._fetch_batch(sub, 8, 3.0)
        await publisher
        assert [m.data for m in msgs] == [b"late"]


def test_a_fetch_hands_on_an_error_status_and_skips_temporary_ones() -> None:
    def status(code: str) -> Msg:
        return Msg(None, headers={"Status": code, "Description": "x"})  # type: ignore[arg-type]

    for temporary in ("404", "408", "409"):
        assert not busmod._processable(temporary, status(temporary))
    assert busmod._processable(None, Msg(None, data=b"event"))  # type: ignore[arg-type]
    with pytest.raises(nats.js.errors.APIError):
        busmod._processable("503", status("503"))
