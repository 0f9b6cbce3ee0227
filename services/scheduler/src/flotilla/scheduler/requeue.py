"""Requeue: asking for objects to be decided again, through the bus, in their own order.

A change seen under one key (a cluster, a capacity record, another object's
placement) must not decide other objects right there: that would break their
per-key order and race their partition owners. `Requeue.request` sends a
``RescheduleRequested`` under each affected object's key instead; its id is
derived from what caused it (`dedupe`), so a redelivered cause sends nothing new.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flotilla.common import events
from flotilla.common.bus import Bus
from flotilla.common.events import RescheduleRequested
from flotilla.scheduler import state

log = logging.getLogger(__name__)


class Requeue:
    def __init__(self, bus: Bus, index: state.Index) -> None:
        self.bus = bus
        self.index = index

    async def request(
        self, keys: Iterable[str], reason: str, *, dedupe: tuple[object, ...]
    ) -> None:
        batch = []
        for key in sorted(keys):
            entry = self.index.get(key)
            if entry is None:
                continue
            command = RescheduleRequested(ref=entry.record.analyzed.ref, reason=reason)
            batch.append(
                events.envelope(
                    command,
                    key=key,
                    producer=self.bus.producer,
                    uid=entry.record.uid,
                    dedupe=dedupe,
                )
            )
        if batch:
            log.info("%s: re-evaluating %d objects", reason, len(batch))
            await self.bus.publish_batch(batch)
