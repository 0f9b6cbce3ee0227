"""One error vocabulary for every Flotilla service.

Handlers say *what kind* of failure happened; the bus decides what that means for
the message, in exactly one place (`flotilla.common.bus.disposition`)::

    FlotillaError
    ├── TemporaryError(delay)     retry later: JetStream nak with that delay
    │   └── Unavailable           a dependency (member cluster, hub, Redis) is down
    ├── PermanentError            never succeeds: term + copy to the dead-letter stream
    │   ├── InvalidEvent          the bytes on the bus are not a valid event (poison)
    │   └── InvalidObject         a user's object / policy cannot be acted on as written
    └── ConfigError               the service's own configuration is wrong (startup)

Adapters wrap third-party exceptions into these with ``raise ... from exc`` so the
cause stays in the traceback while the rest of the code only knows this tree.
"""

from __future__ import annotations


class FlotillaError(Exception):
    """Base of every error Flotilla raises on purpose."""


class TemporaryError(FlotillaError):
    """Worth retrying after `delay` seconds; the message is redelivered then."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        if delay < 0:
            raise ValueError("delay must not be negative")
        self.delay = delay


class Unavailable(TemporaryError):
    """Something we depend on did not answer (connection refused, 503, timeout)."""


class PermanentError(FlotillaError):
    """Retrying cannot help: the input itself is wrong."""


class InvalidEvent(PermanentError):
    """A message on the bus that does not parse as a known event."""


class InvalidObject(PermanentError):
    """A user's object, policy or patch that cannot be acted on as written.

    `reason` is a CamelCase Kubernetes Event reason (e.g. ``InvalidPolicy``) so the
    user-facing Warning Event and the dead-letter record say the same thing.
    """

    def __init__(self, message: str, *, reason: str = "InvalidObject") -> None:
        super().__init__(message)
        self.reason = reason


class ConfigError(FlotillaError):
    """The service's configuration is invalid; raised at start-up, never at runtime."""
