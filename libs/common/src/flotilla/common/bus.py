"""The event bus: typed events over NATS JetStream, with at-least-once delivery in
and deduplication out.

- `Bus.connect` / `Bus.ensure`: connect and create (idempotently) what
  `flotilla.common.topology` declares.
- `Bus.publish` / `Bus.publish_batch`: deterministic `Nats-Msg-Id` from the event
  id (JetStream drops a duplicate inside the window), W3C trace context in the
  headers, acknowledgements through one reply subscription (`flotilla.common.acks`),
  pipelined publishing for batches.
- `Consumer`: one per service replica. Holds partition leases
  (`flotilla.common.leases`), fetches each owned partition in batches, and
  dispatches per key in order with bounded concurrency across keys
  (`flotilla.common.queueing`). Long handlers are kept alive with `in_progress`.
- Outcomes: `flotilla.common.dispatch.disposition` is the ONE place where the
  error vocabulary becomes ack / nak(delay) / term + dead-letter; this module
  carries the outcome out on JetStream.
- `Bus.replay`: read a window of the event stream by sequence or time, the basis
  of event replay.
- `Bus.store`: a typed compare-and-set store over one of the topology's buckets
  (`flotilla.common.store`).

Only this module, `acks`, `leases` and `store` import `nats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from opentelemetry import trace
from pydantic import BaseModel

from flotilla.common import events, store, telemetry
from flotilla.common.acks import Acks
from flotilla.common.dispatch import (
    KEY_HEADER,
    TYPE_HEADER,
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
from flotilla.common.errors import InvalidEvent, InvalidObject, Unavailable
from flotilla.common.leases import PartitionLeases
from flotilla.common.queueing import KeyedQueue, Retry
from flotilla.common.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology, partition_of

log = logging.getLogger(__name__)

DEAD_REASON_HEADER = "Flotilla-Dead-Reason"
DEAD_ERROR_HEADER = "Flotilla-Dead-Error"
ORIGINAL_SUBJECT_HEADER = "Flotilla-Original-Subject"
ORIGINAL_SEQUENCE_HEADER = "Flotilla-Original-Sequence"
DELIVERED_HEADER = "Flotilla-Delivered"


FETCH_WAIT = 1.0
REPLAY_BATCH = 256
REPLAY_ATTEMPTS = 5
"""Fetches in a row that may time out before a replay that has not reached the
window's end (and knows messages are pending) gives up with `Unavailable`."""

M = TypeVar("M", bound=BaseModel)


# --- connection, topology, publishing ---------------------------------------------


def _stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy(spec.retention),
        storage=api.StorageType.FILE,
        max_age=spec.max_age,
        max_bytes=spec.max_bytes,
        max_msg_size=spec.max_msg_size,
        duplicate_window=spec.duplicate_window,
        num_replicas=spec.replicas,
        discard=api.DiscardPolicy.OLD,
    )


class Bus:
    """A connection to NATS with Flotilla's topology on it."""

    def __init__(
        self,
        nc: NatsClient,
        topology: Topology,
        producer: str,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.nc = nc
        self.tracer = tracer or trace.get_tracer("flotilla.bus")
        self.js: JetStreamContext = nc.jetstream()
        self.acks = Acks(nc)
        self.topology = topology
        self.producer = producer
        self._buckets: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        topology: Topology,
        producer: str,
        credentials: str | None = None,
        user: str | None = None,
        password: str | None = None,
        ensure: bool = True,
        tracer: trace.Tracer | None = None,
    ) -> Bus:
        async def on_error(exc: Exception) -> None:
            log.warning("nats: %s", exc)

        try:
            nc = await nats.connect(
                url,
                name=producer,
                user_credentials=credentials,
                user=user,
                password=password,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                connect_timeout=5,
                error_cb=on_error,
            )
        except (OSError, nats.errors.Error) as exc:
            raise Unavailable(f"cannot connect to NATS at {url}: {exc}") from exc
        bus = cls(nc, topology, producer, tracer)
        if ensure:
            await bus.ensure()
        return bus

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if not self.nc.is_closed:
            await self.nc.close()

    async def ensure(self) -> None:
        """Create or update every stream and bucket of the topology (idempotent)."""
        for stream in self.topology.streams:
            config = _stream_config(stream)
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(config)  # exists with other limits: converge
        for bucket in self.topology.buckets:
            await self.bucket(bucket)

    async def bucket(self, spec: BucketSpec) -> Any:
        """The KV bucket, created if absent (nats-py returns the same on re-create)."""
        if spec.name not in self._buckets:
            self._buckets[spec.name] = await self.js.create_key_value(
                bucket=spec.name,
                history=spec.history,
                ttl=spec.ttl,
                replicas=spec.replicas,
                storage=api.StorageType.FILE,
            )
        return self._buckets[spec.name]

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    def consumer(
        self,
        spec: ConsumerSpec,
        dispatch: Dispatch,
        *,
        instance: str,
        concurrency: int = 64,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> Consumer:
        """A consumer of `spec`'s events on this bus (see `Consumer`)."""
        return Consumer(
            self,
            spec,
            dispatch,
            instance=instance,
            concurrency=concurrency,
            on_dead_letter=on_dead_letter,
        )

    @staticmethod
    def _prepare(event: events.Envelope) -> tuple[dict[str, str], bytes]:
        """Headers and body of `event`, inside its publish span (`stamped`)."""
        event, headers = stamped(event)
        return headers, events.encode(event)

    async def store(self, spec: BucketSpec, model: type[M], *, memo: int = 0) -> store.Store[M]:
        """The typed compare-and-set store over bucket `spec` (created if absent); `memo`
        keys read or written last are not parsed again while unchanged (`store.Store`)."""
        kv = await self.bucket(spec)
        bucket = store.JetStreamBucket(self.js, kv, spec.name, acks=self.acks)
        return store.Store(bucket, model, memo=memo)

    async def publish(self, event: events.Envelope) -> api.PubAck:
        """Publish one event; `InvalidObject` (``ObjectTooLarge``, ``ObjectTooDeep``) when
        it can never be carried, `Unavailable` when NATS does not answer."""
        subject = self.topology.event_subject(event.type, event.key)
        with telemetry.publish_span(subject, None, message_id=event.id, tracer=self.tracer):
            headers, data = self._prepare(event)
            try:
                return await self.acks.publish(subject, data, headers)
            except (nats.errors.Error, OSError) as exc:
                if _too_large(exc):
                    raise InvalidObject(
                        f"{event.key}: a {len(data)}-byte {event.type} is larger than the bus "
                        "carries (NATS max_payload / the stream's max_msg_size)",
                        reason="ObjectTooLarge",
                    ) from exc
                raise Unavailable(f"publish to {subject} failed: {exc}") from exc

    async def publish_batch(self, batch: Sequence[events.Envelope]) -> list[api.PubAck]:
        """Pipelined: send everything, then wait for all acknowledgements."""
        prepared = []
        for event in batch:
            subject = self.topology.event_subject(event.type, event.key)
            with telemetry.publish_span(subject, None, message_id=event.id, tracer=self.tracer):
                prepared.append((subject, *self._prepare(event)))
        try:
            acks = await asyncio.gather(
                *(self.acks.publish(subject, body, headers) for subject, headers, body in prepared)
            )
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"batch publish failed: {exc}") from exc
        return list(acks)

    async def dead_letter_event(self, event: events.Envelope, reason: str, error: str) -> None:
        """Put an event that was never published (it cannot be) on the dead-letter
        stream with why (idempotent: the event's id)."""
        headers = {
            "Nats-Msg-Id": f"dlq-unpublished-{event.id}",
            DEAD_REASON_HEADER: reason,
            DEAD_ERROR_HEADER: error[:4000],
            ORIGINAL_SUBJECT_HEADER: self.topology.event_subject(event.type, event.key),
            KEY_HEADER: event.key,
            TYPE_HEADER: event.type,
        }
        subject = self.topology.dead_letter_subject(_subject_token(event.type))
        try:
            await self.js.publish(subject, events.encode(event), headers=headers)
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"dead-lettering {event.key} failed: {exc}") from exc

    async def dead_letter(self, msg: Msg, reason: str, error: str) -> None:
        """Copy a message to the dead-letter stream with why it died (idempotent)."""
        meta = msg.metadata
        event_type = (msg.headers or {}).get(TYPE_HEADER) or msg.subject.split(".")[-2]
        headers = {
            "Nats-Msg-Id": f"dlq-{meta.stream}-{meta.sequence.stream}",
            DEAD_REASON_HEADER: reason,
            DEAD_ERROR_HEADER: error[:4000],
            ORIGINAL_SUBJECT_HEADER: msg.subject,
            ORIGINAL_SEQUENCE_HEADER: str(meta.sequence.stream),
            DELIVERED_HEADER: str(meta.num_delivered),
        }
        for name in (KEY_HEADER, "traceparent", "tracestate"):
            if msg.headers and name in msg.headers:
                headers[name] = msg.headers[name]
        subject = self.topology.dead_letter_subject(_subject_token(event_type))
        await self.js.publish(subject, msg.data, headers=headers)

    async def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Read the dead-letter stream (for operators and tests)."""
        found = []
        async for msg in self._read(self.topology.dead_letter_stream.name, limit=limit):
            headers = msg.headers or {}
            try:
                envelope: events.Envelope | None = events.decode(msg.data)
            except InvalidEvent:
                envelope = None
            found.append(
                DeadLetter(
                    subject=headers.get(ORIGINAL_SUBJECT_HEADER, ""),
                    sequence=int(headers.get(ORIGINAL_SEQUENCE_HEADER, "0")),
                    reason=headers.get(DEAD_REASON_HEADER, ""),
                    error=headers.get(DEAD_ERROR_HEADER, ""),
                    delivered=int(headers.get(DELIVERED_HEADER, "0")),
                    data=msg.data,
                    envelope=envelope,
                )
            )
        return found

    async def replay(
        self,
        *,
        start_sequence: int | None = None,
        start_time: datetime | None = None,
        end_sequence: int | None = None,
        end_time: datetime | None = None,
        event_types: Sequence[str] = (),
    ) -> AsyncIterator[ReplayedEvent]:
        """Events of the stream window, in stream order; undecodable ones are skipped."""
        subjects = [f"{self.topology.prefix}.events.{t}.*" for t in event_types]
        async for msg in self._read(
            self.topology.events_stream.name,
            start_sequence=start_sequence,
            start_time=start_time,
            subjects=subjects,
        ):
            meta = msg.metadata
            if end_sequence is not None and meta.sequence.stream > end_sequence:
                return
            if end_time is not None and meta.timestamp > end_time:
                return
            try:
                envelope = events.decode(msg.data)
            except InvalidEvent:
                log.warning("replay: skipping undecodable message #%d", meta.sequence.stream)
                continue
            yield ReplayedEvent(meta.sequence.stream, meta.timestamp, msg.subject, envelope)

    async def _read(
        self,
        stream: str,
        *,
        start_sequence: int | None = None,
        start_time: datetime | None = None,
        subjects: Sequence[str] = (),
        limit: int | None = None,
    ) -> AsyncIterator[Msg]:
        """Read a stream once, from a start point to what it held when we began."""
        info = await self.js.stream_info(stream)
        last = info.state.last_seq
        if last == 0 or (start_sequence is not None and start_sequence > last):
            return
        if start_sequence is not None:
            policy = {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE}
            policy["opt_start_seq"] = start_sequence  # type: ignore[assignment]
        elif start_time is not None:
            policy = {"deliver_policy": api.DeliverPolicy.BY_START_TIME}
            policy["opt_start_time"] = start_time.isoformat()  # type: ignore[assignment]
        else:
            policy = {"deliver_policy": api.DeliverPolicy.ALL}
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            filter_subjects=list(subjects) or None,
            **policy,  # type: ignore[arg-type]
        )
        sub = await self.js.pull_subscribe("", stream=stream, config=config)
        count = 0
        timeouts = 0
        try:
            while True:
                try:
                    batch = await sub.fetch(REPLAY_BATCH, timeout=FETCH_WAIT)
                except TimeoutError:  # nats-py raises its own and asyncio's bare one
                    # Nothing within the wait: either nothing more matches (done) or
                    # the server or the network was slow; only the consumer knows.
                    if await _exhausted(sub, count):
                        return
                    timeouts += 1
                    if timeouts >= REPLAY_ATTEMPTS:
                        raise Unavailable(
                            f"reading {stream} timed out {timeouts} times before its end"
                        ) from None
                    continue
                timeouts = 0
                for msg in batch:
                    yield msg
                    count += 1
                    if msg.metadata.sequence.stream >= last or (limit and count >= limit):
                        return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def _exhausted(sub: JetStreamContext.PullSubscription, received: int) -> bool:
    """Whether a reading consumer has nothing left: nothing pending on the server,
    and nothing delivered that has not been received (a late answer to a fetch that
    timed out waits in the subscription for the next fetch). Counted in the
    consumer's own sequence: its stream position starts before the window, so a
    window with nothing in it has delivered nothing."""
    try:
        info = await sub.consumer_info()
    except (nats.errors.Error, OSError) as exc:
        raise Unavailable(f"replay consumer lost: {exc}") from exc
    delivered = info.delivered.consumer_seq if info.delivered is not None else 0
    return not info.num_pending and (delivered or 0) <= received


def _too_large(exc: BaseException) -> bool:
    """NATS refused the message for its size: the client (over the server's
    max_payload) or JetStream (over the stream's max_msg_size, error 10054)."""
    if isinstance(exc, nats.errors.MaxPayloadError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == 10054


def _subject_token(value: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_" else "_" for c in value)
    return cleaned or "unknown"


# --- consuming ---------------------------------------------------------------------


def _take(sub: JetStreamContext.PullSubscription) -> Msg | None:
    """The message waiting first in `sub`'s pending queue, taken as `next_msg` takes
    one (size and task accounting); None when none waits or the connection closed."""
    inner = sub._sub
    if inner is None:
        raise nats.errors.BadSubscriptionError
    queue = inner._pending_queue
    if queue.empty() or sub._nc.is_closed:
        return None
    msg = queue.get_nowait()
    inner._pending_size -= len(msg.data)
    queue.task_done()
    return msg


async def _next_msg(sub: JetStreamContext.PullSubscription, timeout: float | None) -> Msg:
    """`Subscription.next_msg`, without its task and `wait_for` for a message that
    is already there: a fetched batch arrives in one read, so all but the first
    message usually are, and a task per message costs more than the rest of the
    fetch (and hands the loop over between messages)."""
    msg = _take(sub)
    if msg is not None:
        return msg
    assert sub._sub is not None  # `_take` raised otherwise
    return await sub._sub.next_msg(timeout=timeout)


def _status(msg: Msg) -> str | None:
    return msg.headers.get(api.Header.STATUS) if msg.headers else None


def _time_left(timeout: float, started: float) -> float:
    return timeout - (time.monotonic() - started)


async def _fetch_batch(
    sub: JetStreamContext.PullSubscription, batch: int, timeout: float
) -> list[Msg]:
    """`sub.fetch(batch, timeout=timeout)` of nats-py 2.16 (`PullSubscription._fetch_n`,
    pinned in pyproject), step for step, taking messages already received with
    `_next_msg` instead of a `wait_for` task each.

    As there: take what is pending; ask with ``no_wait`` for what is available now
    (with ``expires`` only when nothing was pending) and read up to the end of that
    answer (404 / 408); only when that brought nothing, make one lingering request
    for the time left and wait for its first message, then read what follows of it.
    Status 409 (and 404 / 408) ends a read as a temporary condition; any other
    status is an `APIError`; a heartbeat (100) only shows the server answers.
    """
    if batch < 1 or timeout <= 0:
        raise ValueError("a fetch needs a batch of at least 1 and a positive timeout")
    expires = int(timeout * 1_000_000_000) - 100_000
    msgs: list[Msg] = []
    started = time.monotonic()
    got_any_response = False
    needed = batch
    while (pending := _take(sub)) is not None:  # meant for this fetch or an earlier one
        if _status(pending) is None:
            needed -= 1
            msgs.append(pending)

    # First request: what is available now. Without `expires` when something was
    # pending: the server ignores `no_wait` with `expires` and lingers.
    request: dict[str, Any] = {"batch": needed, "no_wait": True}
    if not msgs:
        request["expires"] = expires
    await sub._nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
    await asyncio.sleep(0)
    try:
        msg = await _next_msg(sub, timeout)
    except TimeoutError:
        if msgs:
            return msgs
        raise
    status = _status(msg)
    if status == api.StatusCode.CONTROL_MESSAGE:
        got_any_response = True
    elif _processable(status, msg):
        msgs.append(msg)
        needed -= 1
        with contextlib.suppress(TimeoutError):  # at least one message came
            for _ in range(needed):
                msg = await _next_msg(sub, _time_left(timeout, started))
                status = _status(msg)
                if status in (api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT):
                    break
                if status == api.StatusCode.CONTROL_MESSAGE:
                    got_any_response = True
                    continue
                if _processable(status, msg):
                    needed -= 1
                    msgs.append(msg)
    if msgs:
        return msgs

    # Second request: lingering, for the time left (not the whole timeout: a request
    # outliving this fetch would take the next message and stall the next fetch).
    left = _time_left(timeout, started)
    remaining_expires = int(left * 1_000_000_000) - 100_000
    if left <= 0 or remaining_expires <= 0:
        raise TimeoutError
    request = {"batch": needed, "expires": remaining_expires}
    await sub._nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
    await asyncio.sleep(0)
    while True:  # its first answer: a message, or a status that ends it
        try:
            msg = await _next_msg(sub, _time_left(timeout, started))
        except TimeoutError:
            if got_any_response:
                raise nats.js.errors.FetchTimeoutError from None
            raise
        status = _status(msg)
        if status != api.StatusCode.CONTROL_MESSAGE:
            break
        got_any_response = True
    if status is None:
        needed -= 1
        msgs.append(msg)

    with contextlib.suppress(TimeoutError):  # the rest of the answer, while there is time
        for _ in range(needed):
            left = _time_left(timeout, started)
            if left < 0:
                return msgs
            msg = await _next_msg(sub, left)
            status = _status(msg)
            if status == api.StatusCode.CONTROL_MESSAGE:
                got_any_response = True
                continue
            if status in (api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT):
                break
            if _processable(status, msg):
                needed -= 1
                msgs.append(msg)
    if not msgs and got_any_response:
        raise nats.js.errors.FetchTimeoutError
    return msgs


def _processable(status: str | None, msg: Msg) -> bool:
    """A message to hand on (no status); False for a temporary condition (404, 408,
    409); `APIError` for any other status."""
    if not status:
        return True
    if status in (
        api.StatusCode.NO_MESSAGES,
        api.StatusCode.CONFLICT,
        api.StatusCode.REQUEST_TIMEOUT,
    ):
        return False
    raise nats.js.errors.APIError.from_msg(msg)


class _Delivery:
    """A fetched JetStream message as `queueing.Delivery`."""

    __slots__ = ("key", "msg", "sequence")

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        self.sequence = msg.metadata.sequence.stream
        headers = msg.headers or {}
        self.key = headers.get(KEY_HEADER) or f"<no-key>/{self.sequence}"

    async def heartbeat(self) -> None:
        await self.msg.in_progress()


class Consumer:
    """Runs a service's handlers over its share of the event stream."""

    def __init__(
        self,
        bus: Bus,
        spec: ConsumerSpec,
        dispatch: Dispatch,
        *,
        instance: str,
        concurrency: int = 64,
        batch: int = 64,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> None:
        self.bus = bus
        self.spec = spec
        self.dispatch = dispatch
        self.instance = instance
        self.batch = batch
        self.on_dead_letter = on_dead_letter
        self.queue: KeyedQueue[_Delivery] = KeyedQueue(
            self._process,
            concurrency=concurrency,
            heartbeat_interval=max(spec.ack_wait / 3, 0.05),
            park_grace=spec.ack_wait,
            release=self._hand_back,
            duplicate=self._ack_duplicate,
        )
        self._fetchers: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._stopping = asyncio.Event()
        self._leases: PartitionLeases | None = None
        self._capacity = max(batch * 4, concurrency * 2)

    @property
    def partitions(self) -> set[int]:
        return set(self._fetchers)

    @property
    def leases_lost(self) -> int:
        """Leases found taken or expired at renewal since the last (re)start."""
        return self._leases.lost if self._leases is not None else 0

    async def run(self) -> None:
        """Until `stop()`: keep leases, fetch owned partitions, dispatch.

        May be called again after it ended (a crash restarted by
        `flotilla.common.service.guarded`): it starts from scratch."""
        self.queue.reopen()
        kv = await self.bus.bucket(self.bus.topology.leases_bucket)
        self._leases = PartitionLeases(
            kv,
            group=self.spec.service,
            instance=self.instance,
            partitions=self.bus.topology.partitions,
            on_acquire=self._start_partition,
            on_release=self._stop_partition,
        )
        interval = self.bus.topology.lease_ttl / 3
        try:
            while not self._stopping.is_set():
                try:
                    await self._leases.tick()
                except (nats.errors.Error, OSError) as exc:
                    log.warning("%s: lease round failed (%s); retrying", self.spec.service, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=interval)
        finally:
            await self._shutdown()

    async def stop(self) -> None:
        self._stopping.set()

    async def _shutdown(self, drain_timeout: float = 10.0) -> None:
        await asyncio.gather(*(self._stop_fetcher(p) for p in list(self._fetchers)))
        await self.queue.drain(drain_timeout)
        if self._leases is not None:
            with contextlib.suppress(Exception):
                await self._leases.release_all()

    async def _start_partition(self, partition: int) -> None:
        durable = self.spec.durable(partition)
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.spec.ack_wait,
            max_deliver=self.spec.max_deliver + 1,  # we dead-letter before the server gives up
            max_ack_pending=self.spec.max_ack_pending,
            filter_subjects=self.bus.topology.partition_subjects(self.spec, partition),
            deliver_policy=api.DeliverPolicy.ALL,
        )
        stream = self.bus.topology.events_stream.name
        await self.bus.js.add_consumer(stream, config)
        stop = asyncio.Event()
        task = asyncio.create_task(self._fetch(stream, durable, stop), name=f"fetch-{durable}")
        self._fetchers[partition] = (task, stop)
        log.info("%s: consuming partition %d", self.instance, partition)

    async def _stop_partition(self, partition: int) -> None:
        """Stop fetching, then let this partition's in-flight work finish (bounded),
        so the next owner starts where this one stopped."""
        await self._stop_fetcher(partition)
        partitions = self.bus.topology.partitions

        def belongs(key: str) -> bool:
            return partition_of(key, partitions) == partition

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.wait_keys_idle(belongs), self.spec.ack_wait)
        log.info("%s: released partition %d", self.instance, partition)

    async def _stop_fetcher(self, partition: int) -> None:
        fetcher = self._fetchers.pop(partition, None)
        if fetcher is None:
            return
        task, stop = fetcher
        stop.set()
        done, _ = await asyncio.wait([task], timeout=FETCH_WAIT * 3)
        if not done:  # blocked somewhere cancellable (waiting for room in the queue)
            task.cancel()
            await asyncio.wait([task], timeout=FETCH_WAIT)

    async def _fetch(self, stream: str, durable: str, stop: asyncio.Event) -> None:
        """Long-poll one partition until `stop` is set.

        Stopping is cooperative: nats-py's fetch can swallow a task cancellation
        (a wait_for race), so the loop checks `stop` between polls instead of
        relying on `Task.cancel`.
        """
        backoff = 0.1
        sub = None
        try:
            while not stop.is_set():
                try:
                    if sub is None:
                        sub = await self.bus.js.pull_subscribe_bind(durable, stream=stream)
                    await self.queue.wait_for_room(self._capacity)
                    started = time.monotonic()
                    try:
                        msgs = await _fetch_batch(sub, self.batch, FETCH_WAIT)
                    except (nats.errors.TimeoutError, TimeoutError):
                        if time.monotonic() - started >= FETCH_WAIT / 2:
                            continue  # nothing new within the long-poll window
                        # An instant timeout means a broken pull (seen right after a
                        # reconnect); spinning on it would starve the event loop.
                        raise nats.errors.Error("pull request failed at once") from None
                    for msg in msgs:
                        self.queue.submit(_Delivery(msg))
                    backoff = 0.1
                except (nats.errors.Error, OSError) as exc:
                    if stop.is_set() or self.bus.nc.is_closed:
                        return
                    log.warning("fetch %s failed (%r); retrying in %.1fs", durable, exc, backoff)
                    if sub is not None:
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()
                        sub = None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _process(self, delivery: _Delivery) -> Retry | None:
        msg = delivery.msg
        meta = msg.metadata
        envelope: events.Envelope | None = None
        error: BaseException | None = None
        try:
            envelope = events.decode(msg.data)
            await self.dispatch(
                Received.of(
                    envelope,
                    subject=msg.subject,
                    headers=msg.headers or {},
                    delivered=meta.num_delivered,
                )
            )
        except Exception as exc:
            error = exc
        outcome = disposition(
            error, delivered=meta.num_delivered, max_deliver=self.spec.max_deliver
        )
        try:
            return await self._settle(msg, outcome, envelope, error)
        except (nats.errors.Error, OSError) as exc:
            # The ack did not reach the server: it will redeliver; handlers are idempotent.
            log.warning("could not settle #%d: %s", delivery.sequence, exc)
            return None

    async def _settle(
        self,
        msg: Msg,
        outcome: Outcome,
        envelope: events.Envelope | None,
        error: BaseException | None,
    ) -> Retry | None:
        if isinstance(outcome, Ack):
            await msg.ack()
            return None
        if isinstance(outcome, Nak):
            log.info(
                "retrying #%d in %.2fs: %s", msg.metadata.sequence.stream, outcome.delay, error
            )
            await msg.nak(delay=outcome.delay)
            return Retry(outcome.delay)
        log.error("dead-lettering #%d: %s: %s", msg.metadata.sequence.stream, outcome.reason, error)
        await self.bus.dead_letter(msg, outcome.reason, outcome.error)
        await msg.term()
        if self.on_dead_letter is not None:
            letter = DeadLetter(
                subject=msg.subject,
                sequence=msg.metadata.sequence.stream,
                reason=outcome.reason,
                error=outcome.error,
                delivered=msg.metadata.num_delivered,
                data=msg.data,
                envelope=envelope,
                user_reason=user_reason(error),
            )
            try:
                await self.on_dead_letter(letter)
            except Exception:
                log.exception("dead-letter hook failed")
        return None

    async def _hand_back(self, delivery: _Delivery) -> None:
        with contextlib.suppress(Exception):
            await delivery.msg.nak()

    async def _ack_duplicate(self, delivery: _Delivery) -> None:
        with contextlib.suppress(Exception):
            await delivery.msg.ack()
