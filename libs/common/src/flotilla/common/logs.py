"""Structured logs: one JSON object per line on stderr, joined to the current trace.

Every service calls `setup` once at start-up. Each line carries ``timestamp``
(RFC 3339, UTC), ``level``, ``logger``, ``message``, ``service``, the
``trace_id``/``span_id`` of the span current when the line was logged (so a log
search jumps straight to the trace), ``exception`` when there is one, and every
field passed through ``extra=``::

    log.info("placement decided", extra={"key": ref.key, "clusters": ["east"]})

Secrets: configuration secrets are `pydantic.SecretStr` (see `flotilla.common.config`)
and must stay wrapped until the moment they are used, so they print as
``**********`` anywhere. As a second line of defence, `SecretMaskingFilter` replaces
the value of any ``extra`` field (at any nesting depth) whose name looks like a
password, token, secret, credential, API key or authorization header. Messages
themselves are not scanned: never format a secret into one.

Written on the standard library rather than structlog or python-json-logger to
keep the dependency set the lock file already pins; it is one small Formatter.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any

from opentelemetry import trace

MASK = "***"
SECRET_KEY = re.compile(
    r"passw(or)?d|passphrase|token|secret|credential|api[_-]?key|authorization|private[_-]?key",
    re.IGNORECASE,
)

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: MASK if SECRET_KEY.search(str(k)) else _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mask(v) for v in value]
    return value


class SecretMaskingFilter(logging.Filter):
    """Masks `extra` fields named like secrets, including inside nested dicts."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in list(vars(record)):
            if name in _STANDARD:
                continue
            if SECRET_KEY.search(name):
                setattr(record, name, MASK)
            else:
                setattr(record, name, _mask(getattr(record, name)))
        return True


class JsonFormatter(logging.Formatter):
    """Formats a record as one compact JSON line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "service": self.service,
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = f"{span.trace_id:032x}"
            entry["span_id"] = f"{span.span_id:016x}"
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, separators=(",", ":"), ensure_ascii=False)


class _Handler(logging.StreamHandler[IO[str]]):
    """Marks the handler `setup` installed, so calling it again replaces it."""


def setup(level: str | int, service: str, *, stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger's records to `stream` (stderr) as JSON lines at `level`.

    Idempotent: a second call replaces the handler the first one installed. Handlers
    others installed (pytest's log capture, for one) are left alone.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(handler)
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.addFilter(SecretMaskingFilter())
    handler.setFormatter(JsonFormatter(service))
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


__all__ = ["MASK", "SECRET_KEY", "JsonFormatter", "SecretMaskingFilter", "setup"]
