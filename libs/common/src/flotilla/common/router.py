"""Typed handler registration: what a service consumes, declared by payload type.

A service's composition reads like a table of its handlers::

    router = Router("scheduler")
    router.on(ResourceAnalyzed)(scheduler.on_resource_analyzed)
    router.on(RescheduleRequested)(scheduler.on_reschedule_requested)

or, at module level, as a decorator (``@router.on(ResourceAnalyzed)``). A handler
takes a `Received[ResourceAnalyzed]`, so it never downcasts a payload. The
consumer spec (event types, subjects, partitioning, redelivery policy) is derived
from the declarations, and `Router.dispatch` wraps the table in the middleware
chain (`flotilla.common.middleware`) that every service shares.

FastStream's typed subscribers are the model; the transport is ours
(`flotilla.common.bus`, `flotilla.common.membus`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from flotilla.common import events
from flotilla.common.dispatch import Dispatch, Received
from flotilla.common.errors import InvalidEvent
from flotilla.common.topology import ConsumerSpec

P = TypeVar("P", bound=BaseModel)

Handler = Callable[[Received[P]], Awaitable[None]]
Next = Callable[[Received[Any]], Awaitable[None]]
Middleware = Callable[[Received[Any], Next], Awaitable[None]]
"""Runs around the next step of the chain; may stop (drop), time, trace or translate."""


class DuplicateHandler(ValueError):
    """Two handlers declared for one payload type: which one runs would be luck."""


class Router:
    """One service's handlers, keyed by payload type."""

    def __init__(
        self,
        service: str,
        *,
        ack_wait: float | None = None,
        max_deliver: int | None = None,
        max_ack_pending: int | None = None,
    ) -> None:
        self.service = service
        self._policy: dict[str, Any] = {
            name: value
            for name, value in (
                ("ack_wait", ack_wait),
                ("max_deliver", max_deliver),
                ("max_ack_pending", max_ack_pending),
            )
            if value is not None
        }
        self._routes: dict[type[BaseModel], Handler[Any]] = {}

    def on(self, payload_type: type[P]) -> Callable[[Handler[P]], Handler[P]]:
        """Declare `handler` for every event whose payload is `payload_type`."""
        if payload_type not in events.EVENT_PAYLOADS:
            raise TypeError(f"{payload_type.__name__} is not an event payload")

        def register(handler: Handler[P]) -> Handler[P]:
            if payload_type in self._routes:
                raise DuplicateHandler(
                    f"{self.service}: a handler for {payload_type.__name__} is already declared"
                )
            self._routes[payload_type] = handler
            return handler

        return register

    @property
    def payload_types(self) -> tuple[type[BaseModel], ...]:
        return tuple(self._routes)

    @property
    def spec(self) -> ConsumerSpec:
        """The consumer this router needs: its event types and redelivery policy."""
        return ConsumerSpec(
            service=self.service,
            event_types=tuple(t.__name__ for t in self._routes),
            **self._policy,
        )

    def dispatch(self, middleware: Sequence[Middleware] = ()) -> Dispatch:
        """The handler table wrapped in `middleware` (first = outermost)."""
        routes = dict(self._routes)
        service = self.service

        async def route(received: Received[Any]) -> None:
            handler = routes.get(type(received.payload))
            if handler is None:
                raise InvalidEvent(f"{service} has no handler for {received.type}")
            await handler(received)

        chain: Next = route
        for layer in reversed(middleware):
            chain = _bind(layer, chain)
        return chain


def _bind(layer: Middleware, following: Next) -> Next:
    """`layer` with `following` as its next step.

    A plain function handing back the layer's own coroutine, not an ``async def``
    awaiting it: such a wrapper is one more coroutine frame per layer and message,
    which every suspension and resumption of the handler passes through."""

    def step(received: Received[Any]) -> Awaitable[None]:
        return layer(received, following)

    return step
