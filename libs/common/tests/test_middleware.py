"""The router and each middleware unit, without a bus."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flotilla.common import events, middleware, telemetry
from flotilla.common.dispatch import DeadLetter, Received
from flotilla.common.errors import InvalidEvent, TemporaryError
from flotilla.common.router import DuplicateHandler, Middleware, Next, Router

REF = events.ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="shop")


def observed(*, uid: str = "u1", revision: int = 5) -> events.Envelope:
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
    payload = events.ResourceObserved(ref=REF, object=obj)
    return events.envelope(payload, key=REF.key, producer="t", uid=uid, revision=revision)


def received(envelope: events.Envelope, delivered: int = 1) -> Received[Any]:
    return Received.of(envelope, delivered=delivered)


# --- router ------------------------------------------------------------------------


async def test_the_router_routes_by_payload_type_and_derives_its_consumer() -> None:
    router = Router("svc", ack_wait=7.0)
    seen: list[str] = []

    @router.on(events.ResourceObserved)
    async def on_observed(event: Received[events.ResourceObserved]) -> None:
        seen.append(event.payload.ref.name)

    @router.on(events.ClusterObserved)
    async def on_cluster(event: Received[events.ClusterObserved]) -> None:
        seen.append(event.payload.cluster)

    assert router.spec.event_types == ("ResourceObserved", "ClusterObserved")
    assert router.spec.ack_wait == 7.0
    dispatch = router.dispatch()
    await dispatch(received(observed()))
    cluster = events.ClusterObserved(cluster="eu", object={})
    await dispatch(received(events.envelope(cluster, key="Cluster/eu", producer="t")))
    assert seen == ["web", "eu"]
    heartbeat = events.ClusterHeartbeat(cluster="eu", ready=True)
    with pytest.raises(InvalidEvent, match="no handler for ClusterHeartbeat"):
        await dispatch(received(events.envelope(heartbeat, key="eu", producer="t")))


def test_a_second_handler_for_one_type_is_refused() -> None:
    router = Router("svc")

    async def handler(event: Received[events.ResourceObserved]) -> None:
        return None

    router.on(events.ResourceObserved)(handler)
    with pytest.raises(DuplicateHandler, match="ResourceObserved"):
        router.on(events.ResourceObserved)(handler)
    with pytest.raises(TypeError, match="not an event payload"):
        router.on(events.ObjectRef)


async def test_middleware_runs_outermost_first() -> None:
    router = Router("svc")
    trail: list[str] = []

    @router.on(events.ResourceObserved)
    async def handler(event: Received[events.ResourceObserved]) -> None:
        trail.append("handler")

    def layer(name: str) -> Middleware:
        async def step(event: Received[Any], following: Next) -> None:
            trail.append(f"{name}>")
            await following(event)
            trail.append(f"<{name}")

        return step

    await router.dispatch([layer("a"), layer("b")])(received(observed()))
    assert trail == ["a>", "b>", "handler", "<b", "<a"]


# --- stale drop ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "dropped"),
    [
        (("u1", 5), ("u1", 4), True),
        (("u1", 5), ("u1", 5), False),
        (("u1", 5), ("u1", 6), False),
        (("u1", 5), ("u2", 1), False),
        (("u1", 5), ("u1", 0), False),
    ],
    ids=["older-dropped", "redelivery-kept", "newer-kept", "recreated-object-kept", "no-revision"],
)
async def test_stale_events_are_dropped(
    first: tuple[str, int], second: tuple[str, int], dropped: bool
) -> None:
    stale = middleware.StaleDrop()
    handled: list[int] = []

    async def handler(event: Received[Any]) -> None:
        handled.append(event.envelope.revision)

    for uid, revision in (first, second):
        await stale(received(observed(uid=uid, revision=revision)), handler)
    assert stale.dropped == int(dropped)
    assert len(handled) == (1 if dropped else 2)


async def test_a_failed_event_does_not_count_as_handled() -> None:
    stale = middleware.StaleDrop()

    async def failing(event: Received[Any]) -> None:
        raise TemporaryError("later")

    async def fine(event: Received[Any]) -> None:
        return None

    with pytest.raises(TemporaryError):
        await stale(received(observed(revision=9)), failing)
    await stale(received(observed(revision=8)), fine)
    assert stale.dropped == 0


def test_stale_memory_is_bounded() -> None:
    stale = middleware.StaleDrop(remember=2)
    for name in ("a", "b", "c"):
        ref = REF.model_copy(update={"name": name})
        payload = events.ResourceObserved(ref=ref, object={})
        stale.handled(events.envelope(payload, key=ref.key, producer="t", uid="u", revision=3))
    old = events.envelope(
        events.ResourceObserved(ref=REF.model_copy(update={"name": "a"}), object={}),
        key=REF.model_copy(update={"name": "a"}).key,
        producer="t",
        uid="u",
        revision=1,
    )
    assert not stale.is_stale(old), "the oldest key was forgotten"


# --- deadline -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delivered", "delay"), [(1, 1.0), (2, 2.0), (4, 8.0), (20, 60.0)], ids=str
)
def test_backoff_doubles_up_to_a_ceiling(delivered: int, delay: float) -> None:
    assert middleware.backoff(delivered) == delay


async def test_a_handler_over_its_deadline_is_cancelled_as_a_temporary_error() -> None:
    cancelled = asyncio.Event()

    async def hung(event: Received[Any]) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    with pytest.raises(TemporaryError, match=r"exceeded its 0\.05s deadline") as caught:
        await middleware.deadline(0.05)(received(observed(), delivered=3), hung)
    assert cancelled.is_set()
    assert caught.value.delay == 4.0


async def test_a_handlers_own_timeout_is_not_mistaken_for_the_deadline() -> None:
    async def own_timeout(event: Received[Any]) -> None:
        raise TimeoutError("the member did not answer")

    with pytest.raises(TimeoutError, match="member did not answer"):
        await middleware.deadline(5.0)(received(observed()), own_timeout)


async def test_each_run_is_cancelled_at_its_own_deadline() -> None:
    """One deadline layer, runs started at different times: each is cancelled when
    its own deadline is up, not another's; one that finishes in time is left alone."""
    layer = middleware.deadline(0.2)
    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    def hung(name: str) -> Next:
        async def handler(event: Received[Any]) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended[name] = loop.time()

        return handler

    async def quick(event: Received[Any]) -> None:
        await asyncio.sleep(0.01)

    began = loop.time()
    first = asyncio.create_task(layer(received(observed()), hung("first")))
    await layer(received(observed()), quick)
    await asyncio.sleep(0.2)
    second = asyncio.create_task(layer(received(observed()), hung("second")))
    for run in (first, second):
        with pytest.raises(TemporaryError, match="deadline"):
            await run
    assert 0.19 <= ended["first"] - began < 0.38
    assert 0.4 <= ended["second"] - began < 1.5


async def test_a_run_cancelled_from_outside_stays_cancelled() -> None:
    layer = middleware.deadline(5.0)
    started = asyncio.Event()

    async def hung(event: Received[Any]) -> None:
        started.set()
        await asyncio.Event().wait()

    run = asyncio.create_task(layer(received(observed()), hung))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def test_a_deadline_layer_works_in_a_later_event_loop() -> None:
    """A chain built once may be used in another event loop (a service restarted in
    a test): a run left in the first loop does not stop the second one's deadline."""
    layer = middleware.deadline(0.05)

    async def quick(event: Received[Any]) -> None:
        return None

    async def hung(event: Received[Any]) -> None:
        await asyncio.Event().wait()

    asyncio.run(layer(received(observed()), quick))
    with pytest.raises(TemporaryError, match="deadline"):
        asyncio.run(asyncio.wait_for(layer(received(observed()), hung), 2))


# --- tracing ------------------------------------------------------------------------


async def test_tracing_continues_the_trace_the_envelope_carries() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    envelope = observed().model_copy(update={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})

    async def handler(event: Received[Any]) -> None:
        return None

    await middleware.tracing("svc", tracer)(received(envelope), handler)
    (span,) = exporter.get_finished_spans()
    assert span.context is not None
    assert f"{span.context.trace_id:032x}" == trace_id


async def test_without_recorded_spans_tracing_still_hands_the_carried_trace_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry, "records", lambda tracer=None: False)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    envelope = observed().model_copy(update={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
    published: list[str] = []

    async def handler(event: Received[Any]) -> None:
        published.append(telemetry.inject({})["traceparent"])
        raise TemporaryError("again")

    with pytest.raises(TemporaryError):
        await middleware.tracing("svc")(received(envelope), handler)
    assert published[0].startswith(f"00-{trace_id}-b7ad6b7169203331-")
    assert not trace.get_current_span().get_span_context().is_valid  # detached again


# --- dead letters -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            events.ResourceObserved(
                ref=REF, object={"kind": "Deployment", "metadata": {"name": "web"}}
            ),
            {"kind": "Deployment", "metadata": {"name": "web"}},
        ),
        (
            events.RescheduleRequested(ref=REF, reason="drain"),
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop", "uid": "u9"},
            },
        ),
        (
            events.CapacityChanged(cluster="eu", available={}, allocatable={}),
            {"apiVersion": "flotilla.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "eu"}},
        ),
    ],
    ids=["carried-object", "reference", "cluster"],
)
def test_a_dead_event_names_the_object_it_was_about(
    payload: events.AnyPayload, expected: dict[str, Any]
) -> None:
    envelope = events.envelope(payload, key="k", producer="t", uid="u9")
    assert middleware.involved_object(envelope) == expected


class Failing:
    async def warning(self, obj: dict[str, Any], reason: str, message: str) -> None:
        raise RuntimeError("hub down")


async def test_a_failure_to_report_a_dead_letter_is_only_logged() -> None:
    letter = DeadLetter(
        subject="s",
        sequence=1,
        reason="InvalidObject",
        error="bad",
        delivered=1,
        data=b"",
        envelope=observed(),
        user_reason="InvalidPolicy",
    )
    await middleware.DeadLetterReport(Failing(), "svc")(letter)  # must not raise
