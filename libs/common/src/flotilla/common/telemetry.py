"""OpenTelemetry tracing for every service: one trace per hub change, across NATS.

`setup` configures the SDK once per process from the standard ``OTEL_*`` variables;
`inject` / `extract` carry W3C trace context in NATS message headers; and
`publish_span` / `process_span` open PRODUCER / CONSUMER spans carrying the OTel
messaging semantic-convention attributes, so the bus adapter needs no OTel
knowledge beyond these four names. (No maintained OTel instrumentation exists for
nats-py, hence these few helpers.)

Exporter choice, in the order the SDK's own auto-configuration would apply it:

* ``OTEL_SDK_DISABLED=true`` → no exporter (the SDK hands out no-op tracers);
* ``OTEL_TRACES_EXPORTER=none`` → no exporter; ``=console`` → spans to stdout;
* ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set →
  OTLP over HTTP/protobuf (the exporter reads endpoint, headers, timeout and
  compression from those variables itself);
* otherwise no exporter: a developer's laptop does not spam connection errors
  to a collector that is not there.

Sampling (``OTEL_TRACES_SAMPLER``), batching (``OTEL_BSP_*``) and resource
attributes (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, which wins over the
name passed in, so an operator can rename a replica) are honoured by the SDK.

``messaging.operation.type`` follows the current conventions: ``send`` for
publishing (``publish`` is its deprecated older name, kept as
``messaging.operation.name``, NATS's own word for the operation) and ``process``.
"""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes, AttributeValue

MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
NATS = "nats"

_PROPAGATOR = TraceContextTextMapPropagator()
_lock = threading.Lock()
_provider: TracerProvider | None = None
_configured = False


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def exporter_from_env() -> SpanExporter | None:
    """The span exporter the ``OTEL_*`` variables ask for (see the module docstring)."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return None
    choice = _env("OTEL_TRACES_EXPORTER").lower()
    if choice == "none":
        return None
    if choice == "console":
        return ConsoleSpanExporter()
    if _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT"):
        # Imported only when used: it pulls in protobuf and requests.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def build_provider(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider configured from the environment (or with `exporter`), not
    yet installed globally."""
    resource = Resource.create({SERVICE_NAME: _env("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    exporter = exporter if exporter is not None else exporter_from_env()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class _PropagatingTracer(trace.NoOpTracer):
    """Records nothing, but keeps traces whole: a span continues the trace it is
    started in (the same context, handed on as is), and a span started outside any
    trace begins one (new random ids, not sampled), so every hub change still has
    one trace id from the watcher to the members."""

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            return trace.NonRecordingSpan(parent)
        return trace.NonRecordingSpan(
            trace.SpanContext(
                trace_id=random.getrandbits(128) or 1,
                span_id=random.getrandbits(64) or 1,
                is_remote=False,
                trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
            )
        )


class _PropagatingTracerProvider(trace.NoOpTracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        return _PROPAGATING


_PROPAGATING = _PropagatingTracer()


def setup(service_name: str) -> TracerProvider | None:
    """Configure tracing for this process once; later calls return the same provider.

    With an exporter configured, the provider becomes the global one (OTel allows
    setting it only once per process), so ``trace.get_tracer(__name__)`` anywhere
    in the service produces spans that reach the exporter. Without one, no SDK
    provider is built (None is returned): a tracer that records nothing is
    installed, which hands the incoming W3C context on and starts a trace id where
    there is none, so whatever a service publishes still carries one trace per
    hub change.
    """
    global _provider, _configured
    with _lock:
        if not _configured:
            _configured = True
            exporter = exporter_from_env()
            if exporter is not None:
                _provider = build_provider(service_name, exporter)
                trace.set_tracer_provider(_provider)
            else:
                trace.set_tracer_provider(_PropagatingTracerProvider())
        return _provider


class _CaseInsensitiveGetter(Getter[Mapping[str, str]]):
    """NATS keeps header names as sent; some clients capitalise ``Traceparent``."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        wanted = key.lower()
        for name, value in carrier.items():
            if name.lower() == wanted:
                return [value]
        return None

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _CaseInsensitiveGetter()


def inject(
    headers: MutableMapping[str, str], context: Context | None = None
) -> MutableMapping[str, str]:
    """Add ``traceparent`` (and ``tracestate``) of the current span to `headers`; returns them."""
    if context is None:
        _lean_inject(headers)
    else:
        _PROPAGATOR.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by message headers (an empty context when there is none)."""
    return _PROPAGATOR.extract(headers or {}, getter=_GETTER)


def messaging_attributes(
    destination: str,
    operation: Literal["send", "process"],
    *,
    message_id: str | None = None,
    consumer_group: str | None = None,
) -> dict[str, AttributeValue]:
    """Semantic-convention attributes of a NATS publish (``send``) or handling (``process``)."""
    attributes: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: NATS,
        MESSAGING_DESTINATION_NAME: destination,
        MESSAGING_OPERATION_TYPE: operation,
        MESSAGING_OPERATION_NAME: "publish" if operation == "send" else "process",
    }
    if message_id is not None:
        attributes[MESSAGING_MESSAGE_ID] = message_id
    if consumer_group is not None:
        attributes[MESSAGING_CONSUMER_GROUP_NAME] = consumer_group
    return attributes


_SDK_TYPES: dict[type, bool] = {}


def _is_sdk(thing: object, sdk: type) -> bool:
    kind = type(thing)
    known = _SDK_TYPES.get(kind)
    if known is None:
        known = _SDK_TYPES[kind] = issubclass(kind, sdk)
    return known


def records(tracer: trace.Tracer | None = None) -> bool:
    """Whether spans started with `tracer` (or the global provider's) are recorded:
    an SDK tracer, or the SDK provider `setup` installed when an exporter is
    configured. When not, the span helpers below only carry the W3C context, the
    same context the no-op `_PropagatingTracer` would hand on, without the tracer,
    attribute and span machinery, and with the ``traceparent`` header read and
    written directly: tens of microseconds per message, on every message."""
    if tracer is not None and _is_sdk(tracer, SdkTracer):
        return True
    return _is_sdk(trace.get_tracer_provider(), TracerProvider)


def _new_trace() -> Context:
    """A context whose current span begins a trace (not sampled, nothing recorded)."""
    return trace.set_span_in_context(_PROPAGATING.start_span("new trace"))


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""A version-00 ``traceparent``, as the W3C format writes it (lower-case hex)."""


def _lean_extract(headers: Mapping[str, str]) -> Context | None:
    """The remote parent of a plain version-00 ``traceparent`` header with no
    ``tracestate``, read with one small expression rather than the propagator's
    general one; None when the headers hold anything else, which `extract` then
    reads in full. A context it returns always has a valid span."""
    value = headers.get("traceparent")
    if value is None or "tracestate" in headers:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    trace_hex, span_hex, flags = match.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    parent = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(int(flags, 16))
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _lean_inject(headers: MutableMapping[str, str]) -> None:
    """`inject` of the current span's context, written directly (what the W3C
    propagator writes: ``traceparent``, and ``tracestate`` when there is one)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return
    headers["traceparent"] = (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()


@contextmanager
def publish_span(
    subject: str,
    headers: MutableMapping[str, str] | None,
    *,
    message_id: str | None = None,
    tracer: trace.Tracer | None = None,
) -> Iterator[Span]:
    """A PRODUCER span around a publish; its context is injected into `headers`
    (None: the caller injects it itself, inside the span)."""
    if not records(tracer):
        # The current span is handed on; outside any trace, one begins here.
        token = None
        if not trace.get_current_span().get_span_context().is_valid:
            token = otel_context.attach(_new_trace())
        try:
            if headers is not None:
                _lean_inject(headers)
            yield trace.get_current_span()
        finally:
            if token is not None:
                otel_context.detach(token)
        return
    tracer = tracer or trace.get_tracer(__name__)
    with tracer.start_as_current_span(
        f"publish {subject}",
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(subject, "send", message_id=message_id),
    ) as span:
        if headers is not None:
            inject(headers)
        yield span


def incoming(headers: Mapping[str, str] | None) -> Context:
    """The context a message with `headers` is handled in when spans are not
    recorded (`records` is false): the trace it carries, else a new one. What
    `process_span` attaches in that case; a caller on the per-message path may
    attach it itself and skip the span machinery (`flotilla.common.middleware.tracing`)."""
    if headers:
        context = _lean_extract(headers)
        if context is not None:
            return context
        context = extract(headers)
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
    return _new_trace()


@contextmanager
def process_span(
    subject: str,
    headers: Mapping[str, str] | None,
    *,
    message_id: str | None = None,
    consumer_group: str | None = None,
    tracer: trace.Tracer | None = None,
) -> Iterator[Span]:
    """A CONSUMER span for handling a message, child of the span that published it.

    The extracted context is attached for the duration, so whatever the handler
    publishes in turn joins the same trace.
    """
    if not records(tracer):
        token = otel_context.attach(incoming(headers))
        try:
            yield trace.get_current_span()
        finally:
            otel_context.detach(token)
        return
    tracer = tracer or trace.get_tracer(__name__)
    token = otel_context.attach(extract(headers))
    try:
        with tracer.start_as_current_span(
            f"process {subject}",
            kind=SpanKind.CONSUMER,
            attributes=messaging_attributes(
                subject, "process", message_id=message_id, consumer_group=consumer_group
            ),
        ) as span:
            yield span
    finally:
        otel_context.detach(token)


__all__ = [
    "MESSAGING_CONSUMER_GROUP_NAME",
    "MESSAGING_DESTINATION_NAME",
    "MESSAGING_MESSAGE_ID",
    "MESSAGING_OPERATION_NAME",
    "MESSAGING_OPERATION_TYPE",
    "MESSAGING_SYSTEM",
    "build_provider",
    "exporter_from_env",
    "extract",
    "incoming",
    "inject",
    "messaging_attributes",
    "process_span",
    "publish_span",
    "records",
    "setup",
]
