"""Tracing setup from OTEL_* variables and trace context across NATS-style headers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from flotilla.common import telemetry

OTEL_VARS = [
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spans() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, ConsoleSpanExporter),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, OTLPSpanExporter),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"},
            OTLPSpanExporter,
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, None),
    ],
    ids=["nothing", "console", "none-wins", "otlp", "otlp-traces", "otlp-no-endpoint", "disabled"],
)
def test_exporter_follows_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: type | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = telemetry.exporter_from_env()
    assert type(exporter) is (expected or type(None))
    if exporter is not None:
        exporter.shutdown()


def test_resource_names_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    provider = telemetry.build_provider("scheduler")
    assert provider.resource.attributes["service.name"] == "scheduler"
    assert provider.resource.attributes["deployment.environment"] == "test"
    provider.shutdown()

    monkeypatch.setenv("OTEL_SERVICE_NAME", "scheduler-canary")
    provider = telemetry.build_provider("scheduler")
    assert provider.resource.attributes["service.name"] == "scheduler-canary"
    provider.shutdown()


SETUP_SCRIPT = """
from opentelemetry import trace
from flotilla.common import telemetry

provider = telemetry.setup("aggregator")
assert provider is not None
assert telemetry.setup("another-name") is provider
assert trace.get_tracer_provider() is provider
with trace.get_tracer("t").start_as_current_span("fold status"):
    pass
provider.shutdown()
"""


def test_setup_is_idempotent_global_and_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a child process: the global provider can be set only once per process, and
    # this test must not decide it for every other test in the session.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    done = subprocess.run(
        [sys.executable, "-c", SETUP_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    span = json.loads(done.stdout)
    assert span["name"] == "fold status"
    assert span["resource"]["attributes"]["service.name"] == "aggregator"


NO_EXPORTER_SCRIPT = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from flotilla.common import telemetry

assert telemetry.setup("scheduler") is None
assert not isinstance(trace.get_tracer_provider(), TracerProvider)
incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
with telemetry.process_span("subject", incoming) as span:
    assert not span.is_recording()
    sent = telemetry.inject({})
assert sent["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c", sent
with telemetry.publish_span("subject", {}) as root:
    assert not root.is_recording()
    first = telemetry.inject({})["traceparent"]
    with telemetry.process_span("subject", {"traceparent": first}):
        second = telemetry.inject({})["traceparent"]
assert first.split("-")[1] == second.split("-")[1] != "0" * 32, (first, second)
"""


def test_without_an_exporter_no_sdk_is_installed_and_context_still_flows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    done = subprocess.run(
        [sys.executable, "-c", NO_EXPORTER_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


async def test_spans_reach_an_otlp_http_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[bytes] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        provider = telemetry.build_provider("syncer")
        with provider.get_tracer("test").start_as_current_span("apply work"):
            pass
        # The exporter is synchronous (requests); flush it off the event loop.
        assert await asyncio.to_thread(provider.force_flush, 5000)
        await asyncio.to_thread(provider.shutdown)
    finally:
        await runner.cleanup()
    assert len(received) == 1
    assert b"apply work" in received[0]
    assert b"syncer" in received[0]


def test_inject_extract_makes_parent_and_child(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    with tracer.start_as_current_span("publisher") as parent:
        headers = telemetry.inject({"Nats-Msg-Id": "abc"})
    assert headers["Nats-Msg-Id"] == "abc"
    assert headers["traceparent"].startswith("00-")

    # Some clients capitalise header names; the context must survive that.
    carried = {"Traceparent": headers["traceparent"]}
    tracer.start_span("consumer", context=telemetry.extract(carried)).end()

    publisher, consumer = exporter.get_finished_spans()
    assert publisher.context is not None
    assert consumer.parent is not None
    assert consumer.parent.span_id == parent.get_span_context().span_id
    assert consumer.context is not None
    assert consumer.context.trace_id == publisher.context.trace_id


@pytest.mark.parametrize("headers", [None, {}, {"traceparent": "garbage"}], ids=str)
def test_extract_without_valid_context_starts_a_new_trace(
    headers: dict[str, str] | None,
) -> None:
    context = telemetry.extract(headers)
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_publish_and_process_spans_chain_across_a_message(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    headers: dict[str, str] = {}
    with telemetry.publish_span("flotilla.events.0", headers, message_id="m1", tracer=tracer):
        pass
    with (
        telemetry.process_span(
            "flotilla.events.0", headers, message_id="m1", consumer_group="scheduler", tracer=tracer
        ),
        tracer.start_as_current_span("handler"),
    ):
        follow_up = telemetry.inject({})

    publish, handler, process = exporter.get_finished_spans()
    assert publish.kind is SpanKind.PRODUCER
    assert process.kind is SpanKind.CONSUMER
    assert publish.name == "publish flotilla.events.0"
    assert dict(publish.attributes or {}) == {
        "messaging.system": "nats",
        "messaging.destination.name": "flotilla.events.0",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.id": "m1",
    }
    assert (process.attributes or {})["messaging.operation.type"] == "process"
    assert (process.attributes or {})["messaging.consumer.group.name"] == "scheduler"
    assert process.parent is not None
    assert publish.context is not None
    assert process.parent.span_id == publish.context.span_id
    assert handler.parent is not None
    assert process.context is not None
    assert handler.parent.span_id == process.context.span_id
    # What the handler publishes next carries the same trace on.
    assert f"{publish.context.trace_id:032x}" in follow_up["traceparent"]
    # The consumer span's context is detached afterwards.
    assert not trace.get_current_span().get_span_context().is_valid


_W3C = TraceContextTextMapPropagator()
_hex = st.text(alphabet="0123456789abcdef", min_size=0, max_size=34)
_traceparents = st.one_of(
    st.builds(
        lambda v, t, s, f: f"{v}-{t}-{s}-{f}",
        st.sampled_from(["00", "01", "ff", "0"]),
        st.one_of(_hex, st.just("0" * 32), st.just("0af7651916cd43dd8448eb211c80319c")),
        st.one_of(_hex, st.just("0" * 16), st.just("b7ad6b7169203331")),
        st.sampled_from(["00", "01", "02", "ff", "1", "0g"]),
    ),
    st.text(max_size=60),
)


@given(
    traceparent=_traceparents,
    tracestate=st.one_of(st.none(), st.just("vendor=value"), st.just("a=1,b=2")),
)
def test_the_lean_context_path_reads_and_writes_what_the_w3c_propagator_does(
    traceparent: str, tracestate: str | None
) -> None:
    # Without an SDK provider the span helpers parse and write traceparent
    # themselves; whatever the header holds, the context must be the propagator's.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    headers = {"traceparent": traceparent}
    if tracestate is not None:
        headers["tracestate"] = tracestate
    with telemetry.process_span("s", headers):
        lean = trace.get_current_span().get_span_context()
        written = telemetry.inject({})
    expected = trace.get_current_span(_W3C.extract(headers)).get_span_context()
    if expected.is_valid:
        assert (lean.trace_id, lean.span_id, lean.trace_flags) == (
            expected.trace_id,
            expected.span_id,
            expected.trace_flags,
        )
        assert lean.trace_state == expected.trace_state
        reference: dict[str, str] = {}
        _W3C.inject(reference, context=trace.set_span_in_context(trace.NonRecordingSpan(lean)))
        assert written == reference
    else:
        assert lean.is_valid  # no usable parent: a new trace begins
        assert lean.trace_id != expected.trace_id
