"""JSON log lines: fields, trace correlation, extras, and secret masking."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import SecretStr

from flotilla.common import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    out = io.StringIO()
    logs.setup("info", "scheduler", stream=out)
    yield out
    for handler in root.handlers:
        if handler not in saved_handlers:
            root.removeHandler(handler)
    root.setLevel(saved_level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_the_standard_fields(stream: io.StringIO) -> None:
    log = logging.getLogger("flotilla.scheduler.core")
    log.info("placed %s on %d clusters", "web", 2, extra={"key": "apps/v1/Deployment/d/web"})
    log.debug("not at info level")
    log.warning("multi\nline")

    first, second = lines(stream)
    assert first["message"] == "placed web on 2 clusters"
    assert first["level"] == "INFO"
    assert first["logger"] == "flotilla.scheduler.core"
    assert first["service"] == "scheduler"
    assert first["key"] == "apps/v1/Deployment/d/web"
    assert first["timestamp"].endswith("Z")
    assert "trace_id" not in first
    assert second["message"] == "multi\nline"


def test_lines_carry_the_current_trace(stream: io.StringIO) -> None:
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("handle") as span:
        logging.getLogger("x").info("inside")
    [entry] = lines(stream)
    context = span.get_span_context()
    assert entry["trace_id"] == f"{context.trace_id:032x}"
    assert entry["span_id"] == f"{context.span_id:016x}"
    provider.shutdown()


def test_exceptions_and_odd_extras_are_serialised(stream: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed", extra={"clusters": {"east", "west"}})
    [entry] = lines(stream)
    assert "RuntimeError: boom" in entry["exception"]
    assert entry["level"] == "ERROR"
    assert isinstance(entry["clusters"], str)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"password": "hunter2"}, {"password": "***"}),
        ({"nats_token": "t0k"}, {"nats_token": "***"}),
        ({"client_secret": "s"}, {"client_secret": "***"}),
        ({"credentials": {"user": "u"}}, {"credentials": "***"}),
        ({"Authorization": "Bearer x"}, {"Authorization": "***"}),
        (
            {"conn": {"url": "redis://h", "redisPassword": "p"}},
            {"conn": {"url": "redis://h", "redisPassword": "***"}},
        ),
        ({"items": [{"api_key": "k", "name": "n"}]}, {"items": [{"api_key": "***", "name": "n"}]}),
        ({"redis_url": SecretStr("redis://:p@h")}, {"redis_url": "**********"}),
        ({"bypass_cache": True, "compass": "n"}, {"bypass_cache": True, "compass": "n"}),
    ],
    ids=[
        "password",
        "token",
        "secret",
        "credentials",
        "authorization",
        "nested",
        "in-list",
        "secretstr",
        "not-secrets",
    ],
)
def test_secrets_never_reach_the_log(
    stream: io.StringIO, extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    logging.getLogger("x").info("connecting", extra=extra)
    [entry] = lines(stream)
    assert {k: entry[k] for k in expected} == expected
    assert "hunter2" not in stream.getvalue()


def test_setup_again_replaces_its_own_handler_only(stream: io.StringIO) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    second = io.StringIO()
    logs.setup(logging.WARNING, "scheduler", stream=second)
    assert len(root.handlers) == before
    logging.getLogger("x").warning("once")
    logging.getLogger("x").info("filtered by the new level")
    assert stream.getvalue() == ""
    assert [e["message"] for e in lines(second)] == ["once"]
