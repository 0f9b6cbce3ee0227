"""The middleware chain every service's handlers run in, one small unit each.

`standard` builds the chain in its fixed order, outermost first::

    tracing → metrics → stale-event drop → deadline → the handler

* `tracing` — a CONSUMER span that continues the W3C trace the event carries
  (NATS headers, else the envelope's ``traceparent``), so whatever the handler
  publishes joins the same trace: one trace per hub change.
* `metrics` — handled/failed counters and a duration histogram per event type.
* `StaleDrop` — an event older (same object uid, lower hub revision) than one
  this replica already handled for the same key and type is acknowledged and
  dropped, not applied (level-triggered handlers converge anyway; this keeps a
  late event from undoing newer work).
* `deadline` — a handler that runs longer than its deadline is cancelled and its
  message retried later with exponential backoff, so a hung hub connection can
  never hold a key forever.

Dead letters are reported to users in one place too: `DeadLetterReport` is the
dead-letter hook that writes a Warning Event on the hub object an unusable event
was about, with the reason and message the handler gave for input the user must fix
(``InvalidPolicy``, ``InvalidObject`` …), else the bus's own reason
(``RetriesExhausted``, ``InvalidEvent``). A failure to report is logged and never stops anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from flotilla.common import events, telemetry
from flotilla.common.dispatch import DeadLetter, Received
from flotilla.common.errors import TemporaryError
from flotilla.common.health import EventMetrics
from flotilla.common.router import Middleware, Next

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

DEFAULT_DEADLINE = 60.0
MAX_BACKOFF = 60.0
STALE_REMEMBERED = 100_000
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


def tracing(service: str, tracer: trace.Tracer | None = None) -> Middleware:
    async def layer(received: Received[Any], following: Next) -> None:
        headers = received.headers
        carried = received.envelope.traceparent
        if (
            carried
            and "traceparent" not in headers
            and not any(name.lower() == "traceparent" for name in headers)
        ):
            headers = {**headers, "traceparent": carried}
        if not telemetry.records(tracer):
            # Nothing is recorded: only the context is handed on, as `process_span`
            # would, without a context manager and a span object per message.
            token = otel_context.attach(telemetry.incoming(headers))
            try:
                await following(received)
            finally:
                otel_context.detach(token)
            return
        with telemetry.process_span(
            received.subject or received.type,
            headers,
            message_id=received.envelope.id,
            consumer_group=service,
            tracer=tracer,
        ) as span:
            try:
                await following(received)
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise

    return layer


def metrics(recorder: EventMetrics) -> Middleware:
    async def layer(received: Received[Any], following: Next) -> None:
        with recorder.observe(received.type):
            await following(received)

    return layer


def backoff(delivered: int, *, base: float = 1.0, ceiling: float = MAX_BACKOFF) -> float:
    """Seconds before the next attempt after `delivered` deliveries: 1, 2, 4 … ≤ ceiling."""
    return min(base * 2.0 ** max(delivered - 1, 0), ceiling)


def deadline(seconds: float) -> Middleware:
    if seconds <= 0:
        raise ValueError("a handler deadline must be positive")
    deadlines = _Deadlines(seconds)

    async def layer(received: Received[Any], following: Next) -> None:
        watch = deadlines.start()
        try:
            await following(received)
        except BaseException as exc:
            if deadlines.end(watch, exc):
                raise TemporaryError(
                    f"handling {received.type} for {received.key} exceeded its "
                    f"{seconds:g}s deadline",
                    delay=backoff(received.delivered),
                ) from exc
            raise  # the handler's own error (or its own timeout), not ours
        deadlines.end(watch, None)

    return layer


class _Watch:
    """One handler run under a deadline."""

    __slots__ = ("cancelling", "due", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], due: float) -> None:
        self.task = task
        self.due = due
        self.cancelling = task.cancelling()
        self.expired = False


class _Deadlines:
    """Deadlines of one length for handler runs, kept with one timer.

    What `asyncio.timeout` does for each run (cancel the task at the deadline, and
    turn the `CancelledError` that comes out into a timeout unless the task was also
    cancelled by someone else), without a timer handle per run: scheduling and
    cancelling one cost several microseconds per message, and cancelled handles pile
    up in the event loop's timer heap. All deadlines here have one length, so they
    fall due in the order the runs started: one timer, armed for the oldest run
    still going, cancels each run that is past its deadline, then re-arms itself
    for the next one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._runs: dict[_Watch, None] = {}
        """Runs in the order they started, which is the order their deadlines fall."""
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> _Watch:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a handler deadline must be used inside a task")
        loop = task.get_loop()
        if loop is not self._loop:  # first use, or a new event loop (tests)
            self._runs.clear()
            self._timer = None
            self._loop = loop
        watch = _Watch(task, loop.time() + self.seconds)
        self._runs[watch] = None
        if self._timer is None:
            self._timer = loop.call_at(watch.due, self._expire)
        return watch

    def end(self, watch: _Watch, error: BaseException | None) -> bool:
        """The run is over; whether it ended with `error` because of its deadline
        (the cancellation this timer made, and no other)."""
        self._runs.pop(watch, None)
        if not watch.expired:
            return False
        return watch.task.uncancel() <= watch.cancelling and isinstance(
            error, asyncio.CancelledError
        )

    def _expire(self) -> None:
        self._timer = None
        assert self._loop is not None
        now = self._loop.time()
        while self._runs:
            watch = next(iter(self._runs))
            if watch.due > now + _CLOCK_RESOLUTION:  # what the event loop counts as due
                self._timer = self._loop.call_at(watch.due, self._expire)
                return
            del self._runs[watch]
            watch.expired = True
            watch.task.cancel()


class StaleDrop:
    """Drops events older than what this replica already handled for their key."""

    def __init__(self, remember: int = STALE_REMEMBERED) -> None:
        self._remember = remember
        self._handled: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        self.dropped = 0

    def is_stale(self, envelope: events.Envelope) -> bool:
        if envelope.revision <= 0:
            return False  # no hub revision to compare (commands, cluster-agent reports)
        seen = self._handled.get((envelope.type, envelope.key))
        return seen is not None and seen[0] == envelope.uid and envelope.revision < seen[1]

    def handled(self, envelope: events.Envelope) -> None:
        if envelope.revision <= 0:
            return
        slot = (envelope.type, envelope.key)
        seen = self._handled.get(slot)
        revision = envelope.revision
        if seen is not None and seen[0] == envelope.uid:
            revision = max(revision, seen[1])
        self._handled[slot] = (envelope.uid, revision)
        self._handled.move_to_end(slot)
        while len(self._handled) > self._remember:
            self._handled.popitem(last=False)

    def forget(self, key: str) -> None:
        for slot in [s for s in self._handled if s[1] == key]:
            del self._handled[slot]

    async def __call__(self, received: Received[Any], following: Next) -> None:
        if self.is_stale(received.envelope):
            self.dropped += 1
            log.info(
                "dropping stale %s for %s (revision %d)",
                received.type,
                received.key,
                received.envelope.revision,
            )
            return
        await following(received)
        self.handled(received.envelope)


def standard(
    service: str,
    *,
    recorder: EventMetrics | None = None,
    handler_deadline: float = DEFAULT_DEADLINE,
    stale: StaleDrop | None = None,
    tracer: trace.Tracer | None = None,
) -> list[Middleware]:
    """The chain every service runs its handlers in (see the module docstring)."""
    chain: list[Middleware] = [tracing(service, tracer)]
    if recorder is not None:
        chain.append(metrics(recorder))
    chain.append(stale if stale is not None else StaleDrop())
    chain.append(deadline(handler_deadline))
    return chain


class Reporter(Protocol):
    """Where users hear about what they must fix: Kubernetes Events on hub objects in
    production (`flotilla.common.kube.EventRecorder`), a list in tests."""

    async def warning(self, obj: JsonObject, reason: str, message: str) -> None: ...


CLUSTER_API_VERSION = "flotilla.io/v1alpha1"


def involved_object(envelope: events.Envelope) -> JsonObject | None:
    """The hub object an event is about, as much of it as the event carries."""
    payload = envelope.payload
    carried = getattr(payload, "object", None)
    if isinstance(carried, dict) and isinstance(carried.get("metadata"), dict):
        return carried
    ref = getattr(payload, "ref", None)
    if isinstance(ref, events.ObjectRef):
        metadata: JsonObject = {"name": ref.name}
        if ref.namespace:
            metadata["namespace"] = ref.namespace
        if envelope.uid:
            metadata["uid"] = envelope.uid
        return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": metadata}
    cluster = getattr(payload, "cluster", None)
    if isinstance(cluster, str) and cluster:
        return {"apiVersion": CLUSTER_API_VERSION, "kind": "Cluster", "metadata": {"name": cluster}}
    return None


class DeadLetterReport:
    """The dead-letter hook: a Warning Event on the object the dead event was about."""

    def __init__(self, reporter: Reporter, service: str) -> None:
        self.reporter = reporter
        self.service = service

    async def __call__(self, letter: DeadLetter) -> None:
        if letter.envelope is None:
            return  # undecodable bytes: nothing names an object to report on
        obj = involved_object(letter.envelope)
        if obj is None:
            return
        if letter.user_reason:  # the handler said what the user must fix
            reason, message = letter.user_reason, letter.error
        else:
            reason = letter.reason
            message = f"the {self.service} set aside a {letter.envelope.type} event: {letter.error}"
        try:
            await self.reporter.warning(obj, reason, message)
        except Exception:
            log.warning(
                "could not report the dead letter of %s", letter.envelope.key, exc_info=True
            )
