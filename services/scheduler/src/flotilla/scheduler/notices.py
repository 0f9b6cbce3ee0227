"""Warning Events about objects the scheduler cannot (fully) place, off the decision path.

A decision only notes what it would warn about (`Notices.note`, no I/O); `Notices.run`
(under `Runtime.spawn`) writes the Events every `interval` seconds. Notes are
aggregated per object (the newest wins: an object decided ten times in a second
gets one Event) and rate-limited: the same reason and message on the same object is
not written again within `repeat_after` seconds. Writing is best effort: a hub that
does not answer must never hold placements back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from flotilla.common.errors import FlotillaError
from flotilla.common.middleware import Reporter

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]


class Notices:
    """Pending Warning Events, one per object."""

    def __init__(
        self,
        reporter: Reporter | None,
        *,
        interval: float = 1.0,
        repeat_after: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.interval = interval
        self.repeat_after = repeat_after
        self._clock = clock
        self._pending: dict[str, tuple[JsonObject, str, str]] = {}
        self._sent: dict[str, tuple[str, str, float]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def note(self, key: str, obj: JsonObject, reason: str, message: str) -> None:
        """Warn about `obj` soon (replacing what was noted for `key` and not sent yet)."""
        if self.reporter is not None:
            self._pending[key] = (obj, reason, message)

    def clear(self, key: str) -> None:
        """`key` is placed now: drop what was noted for it."""
        self._pending.pop(key, None)
        self._sent.pop(key, None)

    async def flush(self) -> int:
        """Write what is pending now; how many Events were written."""
        pending, self._pending = self._pending, {}
        now = self._clock()
        for key, at in list(self._sent.items()):
            if now - at[2] >= self.repeat_after:
                del self._sent[key]
        written = 0
        for key, (obj, reason, message) in pending.items():
            last = self._sent.get(key)
            if last is not None and last[:2] == (reason, message):
                continue
            self._sent[key] = (reason, message, now)
            if await self._warn(obj, reason, message):
                written += 1
        return written

    async def _warn(self, obj: JsonObject, reason: str, message: str) -> bool:
        if self.reporter is None:
            return False
        try:
            await self.reporter.warning(obj, reason, message)
        except FlotillaError as error:
            name = (obj.get("metadata") or {}).get("name")
            log.warning("could not report %s for %s %s: %s", reason, obj.get("kind"), name, error)
            return False
        return True

    async def run(self) -> None:
        """Flush every `interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()
