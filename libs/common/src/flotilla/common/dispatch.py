"""What a transport hands a service, and what becomes of the message afterwards.

Both transports — the JetStream bus (`flotilla.common.bus`) and the in-memory bus
(`flotilla.common.membus`) — decode a message into a `Received`, run the service's
`Dispatch` (its `flotilla.common.router.Router` with the middleware chain), and
turn the result into an `Outcome` with `disposition`: the ONE place where the
error vocabulary of `flotilla.common.errors` becomes ack / nak(delay) /
term + dead-letter. Keeping this here, free of any I/O library, is what lets the
two transports behave the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from flotilla.common import events, telemetry
from flotilla.common.errors import InvalidObject, PermanentError, TemporaryError
from flotilla.common.topology import ConsumerSpec, Topology

P = TypeVar("P", bound=BaseModel, covariant=True)

DEFAULT_RETRY_DELAY = 1.0


@dataclass(frozen=True, slots=True)
class Received(Generic[P]):
    """One delivery of one event: the envelope, its typed payload and delivery facts."""

    envelope: events.Envelope
    payload: P
    subject: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delivered: int = 1
    """How many times this message has been delivered, this time included."""

    @property
    def key(self) -> str:
        return self.envelope.key

    @property
    def type(self) -> str:
        return self.envelope.type

    @classmethod
    def of(
        cls,
        envelope: events.Envelope,
        *,
        subject: str = "",
        headers: Mapping[str, str] | None = None,
        delivered: int = 1,
    ) -> Received[Any]:
        return Received(
            envelope, envelope.payload, subject=subject, headers=headers or {}, delivered=delivered
        )


Dispatch = Callable[[Received[Any]], Awaitable[None]]
"""A service's whole handling of one delivery (router + middleware chain)."""


@dataclass(frozen=True)
class Ack:
    pass


@dataclass(frozen=True)
class Nak:
    delay: float


@dataclass(frozen=True)
class Term:
    reason: str
    error: str


Outcome = Ack | Nak | Term


def disposition(error: BaseException | None, *, delivered: int, max_deliver: int) -> Outcome:
    """Map a handler's result to what happens to its message.

    A temporary error is retried after its delay until `max_deliver` deliveries;
    then, like a permanent error, the message goes to the dead-letter stream.
    An unexpected exception is a bug in a handler: retried like a temporary error
    (the bug may be a race that resolves), dead-lettered when retries run out.
    """
    if error is None:
        return Ack()
    if isinstance(error, PermanentError):
        return Term(reason=type(error).__name__, error=str(error))
    delay = error.delay if isinstance(error, TemporaryError) else DEFAULT_RETRY_DELAY
    if delivered >= max_deliver:
        return Term(
            reason="RetriesExhausted",
            error=f"gave up after {delivered} deliveries: {type(error).__name__}: {error}",
        )
    return Nak(delay=delay)


@dataclass(frozen=True)
class DeadLetter:
    """What a dead-letter hook is told, and what a bus's `dead_letters` reads back."""

    subject: str
    sequence: int
    reason: str
    error: str
    delivered: int
    data: bytes
    envelope: events.Envelope | None
    user_reason: str = ""
    """The Kubernetes Event reason for the user (an `InvalidObject`'s own reason, e.g.
    ``InvalidPolicy``); empty when the user has nothing to fix."""


DeadLetterHook = Callable[[DeadLetter], Awaitable[None]]

KEY_HEADER = "Flotilla-Key"
TYPE_HEADER = "Flotilla-Type"


def stamped(event: events.Envelope) -> tuple[events.Envelope, dict[str, str]]:
    """`event` as it goes on the wire, and its headers, inside the current (publish)
    span: the W3C context goes into the headers and, when the event carries none
    yet, into the envelope too, so replay and `describe` can name the trace."""
    headers = {"Nats-Msg-Id": event.id, KEY_HEADER: event.key, TYPE_HEADER: event.type}
    telemetry.inject(headers)
    traceparent = headers.get("traceparent")
    if event.traceparent is None and traceparent is not None:
        event = event.model_copy(update={"traceparent": traceparent})
    return event, headers


def user_reason(error: BaseException | None) -> str:
    """The Event reason of an input the user must fix (an `InvalidObject`'s own), or
    "" when the dead letter is not the user's to fix."""
    return error.reason if isinstance(error, InvalidObject) else ""


@dataclass(frozen=True)
class ReplayedEvent:
    sequence: int
    published_at: datetime
    subject: str
    envelope: events.Envelope


class EventConsumer(Protocol):
    """A service replica's share of the event stream, running its dispatch."""

    @property
    def partitions(self) -> set[int]: ...

    async def run(self) -> None:
        """Until `stop()`: consume, dispatch, settle; then drain in-flight work."""
        ...

    async def stop(self) -> None: ...


class EventBus(Protocol):
    """What a service needs of a bus; the JetStream `flotilla.common.bus.Bus` and the
    in-memory `flotilla.common.membus.MemoryBus` both provide it and pass one
    behaviour suite."""

    topology: Topology
    producer: str

    @property
    def connected(self) -> bool: ...

    async def publish(self, event: events.Envelope) -> Any: ...

    async def publish_batch(self, batch: Sequence[events.Envelope]) -> list[Any]: ...

    def consumer(
        self,
        spec: ConsumerSpec,
        dispatch: Dispatch,
        *,
        instance: str,
        concurrency: int = 64,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> EventConsumer: ...

    async def dead_letters(self, limit: int = 1000) -> list[DeadLetter]: ...

    def replay(
        self,
        *,
        start_sequence: int | None = None,
        start_time: datetime | None = None,
        end_sequence: int | None = None,
        end_time: datetime | None = None,
        event_types: Sequence[str] = (),
    ) -> AsyncIterator[ReplayedEvent]: ...

    async def close(self) -> None: ...
