"""Reading the recorded event stream, as ``flotilla events``, ``describe`` and
``replay`` need it.

The JetStream event stream is Flotilla's history: every decision, with the input
that led to it and the trace it belongs to. This module opens it read-only (it
never creates or changes a stream, so pointing it at a copied stream is safe),
turns the user's window (``--since 10m``, ``--from-seq``) into a read, and says
each event in one line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flotilla.cli.errors import CliError
from flotilla.common import events
from flotilla.common.bus import Bus
from flotilla.common.dispatch import ReplayedEvent
from flotilla.common.errors import FlotillaError
from flotilla.common.topology import Topology

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """A point in time: a duration ago (``90s``, ``10m``, ``2h``, ``1d``) or ISO 8601."""
    now = now or datetime.now(UTC)
    found = _DURATION.match(text.strip())
    if found:
        return now - timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(
            f"cannot read time {text!r}: use a duration like 10m or 2h, or ISO 8601"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """Which part of the stream to read; unset ends are open."""

    since: datetime | None = None
    until: datetime | None = None
    from_seq: int | None = None
    to_seq: int | None = None

    def covers(self, event: ReplayedEvent) -> bool:
        if self.from_seq is not None and event.sequence < self.from_seq:
            return False
        if self.to_seq is not None and event.sequence > self.to_seq:
            return False
        if self.since is not None and event.published_at < self.since:
            return False
        return self.until is None or event.published_at <= self.until


@contextlib.asynccontextmanager
async def connect(url: str, prefix: str) -> AsyncIterator[Bus]:
    """A read-only connection to the installation's stream (`prefix`)."""
    try:
        bus = await Bus.connect(
            url, topology=Topology(prefix=prefix), producer="flotilla-cli", ensure=False
        )
    except FlotillaError:
        raise CliError(f"cannot reach NATS at {url}: is the environment running?") from None
    try:
        yield bus
    finally:
        await bus.close()


async def read(
    bus: Bus,
    window: Window = Window(),
    types: Sequence[str] = (),
    *,
    from_start: bool = False,
) -> AsyncIterator[ReplayedEvent]:
    """The stream's events in `window` (of `types`), in stream order.

    With `from_start` the read begins at the stream's first event whatever the
    window says (a replay needs the state before its window), and the caller
    filters with `Window.covers`."""
    unknown = set(types) - set(events.EVENT_TYPES)
    if unknown:
        raise CliError(
            f"unknown event type {sorted(unknown)[0]!r}; known: {', '.join(events.EVENT_TYPES)}"
        )
    try:
        replay = bus.replay(
            start_sequence=None if from_start else window.from_seq,
            start_time=None if from_start else window.since,
            end_sequence=window.to_seq,
            end_time=window.until,
            event_types=list(types),
        )
        async for event in replay:
            yield event
    except FlotillaError as exc:
        raise CliError(f"reading the event stream failed: {exc}") from None
    except Exception as exc:
        if type(exc).__name__ == "NotFoundError":
            raise CliError(
                f"no event stream {bus.topology.events_stream.name} on this NATS server"
            ) from None
        raise


async def last_sequence(bus: Bus) -> int:
    """The stream's newest sequence now (0 when empty or absent)."""
    try:
        info = await bus.js.stream_info(bus.topology.events_stream.name)
    except Exception as exc:
        if type(exc).__name__ == "NotFoundError":
            return 0
        raise CliError(f"reading the event stream failed: {exc}") from None
    return int(info.state.last_seq or 0)


def trace_id(traceparent: str | None) -> str:
    """The trace id of a W3C ``traceparent`` header value ("" without one)."""
    if not traceparent:
        return ""
    parts = traceparent.split("-")
    return parts[1] if len(parts) >= 3 else ""


def matches_key(envelope: events.Envelope, selector: str) -> bool:
    """``NS/NAME`` (or a full key) against an event's key; a work key ``<key>@<cluster>``
    belongs to its object."""
    key = envelope.key.split("@", 1)[0]
    if selector == key:
        return True
    if "/" not in selector:
        selector = f"_/{selector}"
    return key.endswith(f"/{selector}")


def describe(envelope: events.Envelope) -> str:
    """One line saying what the event says."""
    payload = envelope.payload
    match payload:
        case events.PlacementDecided():
            where = ", ".join(
                f"{p.cluster}={p.replicas if p.replicas is not None else '-'}"
                + ("" if p.state == "Active" else f" ({p.state})")
                for p in payload.clusters
            )
            return f"[{where or 'nowhere'}] {payload.reason}"
        case events.WorkRendered():
            action = "remove" if payload.manifest is None else str(payload.state)
            return f"{payload.cluster}: {action}"
        case events.MemberStatusObserved():
            return f"{payload.cluster}: exists={payload.exists} ready={payload.ready}"
        case events.RescheduleRequested():
            extra = ""
            if payload.avoid_clusters:
                extra += f" avoid={','.join(payload.avoid_clusters)}"
            if payload.release_retiring:
                extra += f" release={','.join(payload.release_retiring)}"
            return f"{payload.reason}{extra}"
        case events.CapacityChanged() | events.ClusterHeartbeat():
            return f"cluster {payload.cluster}"
        case events.ClusterObserved():
            return f"cluster {payload.cluster}" + (" deleted" if payload.deleted else "")
        case events.ResourceAnalyzed():
            return f"strategy={payload.strategy} replicas={payload.replicas}" + (
                " deleted" if payload.deleted else ""
            )
    deleted = getattr(payload, "deleted", False)
    return "deleted" if deleted else ""
