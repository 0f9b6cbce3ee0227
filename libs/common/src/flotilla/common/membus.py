"""An in-memory bus that behaves like the JetStream one, for handler tests.

`MemoryBus` keeps one event stream and one dead-letter list in memory and gives
the guarantees services rely on, with the same code paths where they matter:

* **dedup by id** — a second publish of an event id inside the duplicate window
  is stored once (JetStream's ``Nats-Msg-Id``);
* **per-key order, cross-key concurrency** — consumers dispatch through the same
  `flotilla.common.queueing.KeyedQueue` as the JetStream consumer, over the same
  partitioning of keys (`flotilla.common.topology.partition_of`);
* **durable consumer groups** — one cursor per (service, partition) that outlives
  a consumer, so a restarted consumer carries on where the last one stopped;
  several consumers of one service share the partitions;
* **redelivery** — a nak'd message comes back after its delay with its delivery
  count raised; a message in flight when its consumer stops comes back to the
  next consumer (what ack-wait expiry does on JetStream);
* **dead letters** — the outcome of every delivery comes from the same
  `flotilla.common.dispatch.disposition`, so poison and exhausted messages land
  in `dead_letters` with the same reasons, and the dead-letter hook is called;
* **replay** — a window of the stream by sequence or time.

`libs/common/tests/test_bus_behaviour.py` runs one behaviour suite against this
bus and the JetStream one. What it does not model: leases and partition
hand-over timing, server restarts, byte limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flotilla.common import events, telemetry
from flotilla.common.dispatch import (
    Ack,
    DeadLetter,
    DeadLetterHook,
    Dispatch,
    Nak,
    Outcome,
    Received,
    ReplayedEvent,
    disposition,
    stamped,
    user_reason,
)
from flotilla.common.errors import InvalidEvent
from flotilla.common.queueing import KeyedQueue, Retry
from flotilla.common.topology import ConsumerSpec, Topology, partition_of

log = logging.getLogger(__name__)

HEARTBEAT = 1.0


@dataclass(frozen=True, slots=True)
class PubAck:
    """What a publish answers (the fields of JetStream's ``PubAck`` tests read)."""

    stream: str
    seq: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class _Stored:
    sequence: int
    subject: str
    event_type: str
    key: str
    data: bytes
    published_at: datetime
    headers: dict[str, str]


@dataclass(slots=True)
class _Delivery:
    """One delivery of a stored message to a consumer (`queueing.Delivery`)."""

    stored: _Stored
    delivered: int

    @property
    def key(self) -> str:
        return self.stored.key

    @property
    def sequence(self) -> int:
        return self.stored.sequence

    async def heartbeat(self) -> None:
        return None


@dataclass
class _Partition:
    cursor: int = 0
    """Index into the stream of the next message this partition has not delivered."""
    in_flight: dict[int, int] = field(default_factory=dict)
    """Sequence → deliveries so far, for delivered and unsettled messages."""
    due: list[tuple[float, int]] = field(default_factory=list)
    """Heap of (monotonic due time, sequence) of messages to deliver again."""


class _Group:
    """A durable consumer group: one service's position in the stream."""

    def __init__(self, spec: ConsumerSpec, partitions: int) -> None:
        self.spec = spec
        self.types = frozenset(spec.event_types)
        self.parts = [_Partition() for _ in range(partitions)]
        self.members: list[MemoryConsumer] = []
        self.changed = asyncio.Event()

    def owned(self, member: MemoryConsumer) -> list[int]:
        ranked = sorted(self.members, key=lambda m: m.instance)
        if member not in ranked:
            return []
        index, count = ranked.index(member), len(ranked)
        return [p for p in range(len(self.parts)) if p % count == index]

    def notify(self) -> None:
        self.changed.set()


class MemoryBus:
    """The in-memory `flotilla.common.dispatch.EventBus` (see the module docstring)."""

    def __init__(
        self,
        topology: Topology | None = None,
        *,
        producer: str = "memory",
        duplicate_window: float = 120.0,
    ) -> None:
        self.topology = topology or Topology(prefix="memory", partitions=4)
        self.producer = producer
        self.duplicate_window = duplicate_window
        self._stream: list[_Stored] = []
        self._ids: dict[str, tuple[int, float]] = {}
        self._dead: list[DeadLetter] = []
        self._groups: dict[str, _Group] = {}
        self._closed = False

    # --- the EventBus protocol --------------------------------------------------------

    @property
    def connected(self) -> bool:
        return not self._closed

    async def publish(self, event: events.Envelope) -> PubAck:
        subject = self.topology.event_subject(event.type, event.key)
        with telemetry.publish_span(subject, None, message_id=event.id):
            event, headers = stamped(event)
            return self._append(event.id, event.type, event.key, events.encode(event), headers)

    async def publish_batch(self, batch: Sequence[events.Envelope]) -> list[PubAck]:
        return [await self.publish(event) for event in batch]

    async def publish_raw(self, event_type: str, key: str, data: bytes) -> PubAck:
        """Store bytes that may not be a valid event (how tests make poison)."""
        return self._append(f"raw-{len(self._stream)}", event_type, key, data)

    def consumer(
        self,
        spec: ConsumerSpec,
        dispatch: Dispatch,
        *,
        instance: str,
        concurrency: int = 64,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> MemoryConsumer:
        group = self._groups.get(spec.service)
        if group is None:
            group = self._groups[spec.service] = _Group(spec, self.topology.partitions)
        return MemoryConsumer(
            self,
            group,
            dispatch,
            instance=instance,
            concurrency=concurrency,
            on_dead_letter=on_dead_letter,
        )

    async def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        return self._dead[:limit]

    async def replay(
        self,
        *,
        start_sequence: int | None = None,
        start_time: datetime | None = None,
        end_sequence: int | None = None,
        end_time: datetime | None = None,
        event_types: Sequence[str] = (),
    ) -> AsyncIterator[ReplayedEvent]:
        wanted = frozenset(event_types)
        for stored in list(self._stream):
            if start_sequence is not None and stored.sequence < start_sequence:
                continue
            if start_time is not None and stored.published_at < start_time:
                continue
            if end_sequence is not None and stored.sequence > end_sequence:
                return
            if end_time is not None and stored.published_at > end_time:
                return
            if wanted and stored.event_type not in wanted:
                continue
            try:
                envelope = events.decode(stored.data)
            except InvalidEvent:
                continue
            yield ReplayedEvent(stored.sequence, stored.published_at, stored.subject, envelope)

    async def close(self) -> None:
        self._closed = True
        for group in self._groups.values():
            group.notify()

    # --- inside -----------------------------------------------------------------------

    def _append(
        self,
        message_id: str,
        event_type: str,
        key: str,
        data: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> PubAck:
        now = time.monotonic()
        seen = self._ids.get(message_id)
        if seen is not None and now - seen[1] < self.duplicate_window:
            return PubAck(stream=self.topology.events_stream.name, seq=seen[0], duplicate=True)
        stored = _Stored(
            sequence=len(self._stream) + 1,
            subject=self.topology.event_subject(event_type, key),
            event_type=event_type,
            key=key,
            data=data,
            published_at=datetime.now(UTC),
            headers=dict(headers or {}),
        )
        self._stream.append(stored)
        self._ids[message_id] = (stored.sequence, now)
        for group in self._groups.values():
            if event_type in group.types:
                group.notify()
        return PubAck(stream=self.topology.events_stream.name, seq=stored.sequence)

    def _take(self, group: _Group, partitions: Sequence[int], limit: int) -> list[_Delivery]:
        """Due redeliveries first, then new messages, of the given partitions."""
        taken: list[_Delivery] = []
        now = time.monotonic()
        count = self.topology.partitions
        for number in partitions:
            part = group.parts[number]
            while part.due and part.due[0][0] <= now and len(taken) < limit:
                _, sequence = heapq.heappop(part.due)
                part.in_flight[sequence] = part.in_flight.get(sequence, 0) + 1
                taken.append(_Delivery(self._stream[sequence - 1], part.in_flight[sequence]))
            while part.cursor < len(self._stream) and len(taken) < limit:
                stored = self._stream[part.cursor]
                part.cursor += 1
                if stored.event_type not in group.types:
                    continue
                if partition_of(stored.key, count) != number:
                    continue
                part.in_flight[stored.sequence] = 1
                taken.append(_Delivery(stored, 1))
        return taken

    def _next_due(self, group: _Group, partitions: Sequence[int]) -> float | None:
        times = [group.parts[p].due[0][0] for p in partitions if group.parts[p].due]
        return min(times) - time.monotonic() if times else None

    def _settle(self, group: _Group, delivery: _Delivery, outcome: Outcome) -> None:
        part = group.parts[partition_of(delivery.key, self.topology.partitions)]
        if isinstance(outcome, Nak):
            heapq.heappush(part.due, (time.monotonic() + outcome.delay, delivery.sequence))
            group.notify()
        else:
            part.in_flight.pop(delivery.sequence, None)

    def _hand_back(self, group: _Group, delivery: _Delivery) -> None:
        """Undelivered or unsettled work goes back to the group at once."""
        part = group.parts[partition_of(delivery.key, self.topology.partitions)]
        if delivery.sequence in part.in_flight:
            heapq.heappush(part.due, (time.monotonic(), delivery.sequence))
            group.notify()

    def _dead_letter(
        self,
        delivery: _Delivery,
        outcome: Any,
        envelope: events.Envelope | None,
        error: BaseException | None,
    ) -> DeadLetter:
        letter = DeadLetter(
            subject=delivery.stored.subject,
            sequence=delivery.sequence,
            reason=outcome.reason,
            error=outcome.error,
            delivered=delivery.delivered,
            data=delivery.stored.data,
            envelope=envelope,
            user_reason=user_reason(error),
        )
        self._dead.append(letter)
        return letter


class MemoryConsumer:
    """One replica's consumer on a `MemoryBus` (see the module docstring)."""

    def __init__(
        self,
        bus: MemoryBus,
        group: _Group,
        dispatch: Dispatch,
        *,
        instance: str,
        concurrency: int = 64,
        batch: int = 64,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> None:
        self.bus = bus
        self.group = group
        self.spec = group.spec
        self.dispatch = dispatch
        self.instance = instance
        self.concurrency = concurrency
        self.batch = batch
        self.on_dead_letter = on_dead_letter
        self._stopping = asyncio.Event()
        self._queue: KeyedQueue[_Delivery] | None = None
        self._unsettled: dict[int, _Delivery] = {}

    @property
    def partitions(self) -> set[int]:
        return set(self.group.owned(self)) if self._queue is not None else set()

    async def run(self) -> None:
        self._stopping.clear()
        queue: KeyedQueue[_Delivery] = KeyedQueue(
            self._process,
            concurrency=self.concurrency,
            heartbeat_interval=HEARTBEAT,
            park_grace=self.spec.ack_wait,
            release=self._release,
            duplicate=self._duplicate,
        )
        self._queue = queue
        self.group.members.append(self)
        self.group.notify()
        try:
            while not self._stopping.is_set() and self.bus.connected:
                await queue.wait_for_room(self.batch * 4)
                owned = self.group.owned(self)
                taken = self.bus._take(self.group, owned, self.batch)
                for delivery in taken:
                    self._unsettled[delivery.sequence] = delivery
                    queue.submit(delivery)
                if taken:
                    continue
                self.group.changed.clear()
                wait = self.bus._next_due(self.group, owned)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if wait is None else max(wait, 0.0)):
                        await self._wake()
        finally:
            self.group.members.remove(self)
            await queue.drain(10.0)
            for delivery in self._unsettled.values():  # back to the group (ack-wait expiry)
                self.bus._hand_back(self.group, delivery)
            self._unsettled.clear()
            self._queue = None
            self.group.notify()

    async def stop(self) -> None:
        self._stopping.set()
        self.group.notify()

    async def _wake(self) -> None:
        waiter = asyncio.ensure_future(self.group.changed.wait())
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, stopper):
                task.cancel()
            await asyncio.gather(waiter, stopper, return_exceptions=True)

    async def _process(self, delivery: _Delivery) -> Retry | None:
        envelope: events.Envelope | None = None
        error: BaseException | None = None
        try:
            envelope = events.decode(delivery.stored.data)
            await self.dispatch(
                Received.of(envelope, subject=delivery.stored.subject, delivered=delivery.delivered)
            )
        except Exception as exc:
            error = exc
        delivered = delivery.delivered
        outcome = disposition(error, delivered=delivered, max_deliver=self.spec.max_deliver)
        self._unsettled.pop(delivery.sequence, None)
        self.bus._settle(self.group, delivery, outcome)
        if isinstance(outcome, Ack):
            return None
        if isinstance(outcome, Nak):
            return Retry(outcome.delay)
        letter = self.bus._dead_letter(delivery, outcome, envelope, error)
        log.error("dead-lettering #%d: %s: %s", delivery.sequence, outcome.reason, error)
        if self.on_dead_letter is not None:
            try:
                await self.on_dead_letter(letter)
            except Exception:
                log.exception("dead-letter hook failed")
        return None

    async def _release(self, delivery: _Delivery) -> None:
        self._unsettled.pop(delivery.sequence, None)
        self.bus._hand_back(self.group, delivery)

    async def _duplicate(self, delivery: _Delivery) -> None:
        self._unsettled.pop(delivery.sequence, None)
        self.bus._settle(self.group, delivery, Ack())
