"""Work queues and a timer heap: how the simulator stays fast with thousands of objects.

Store listeners run synchronously inside every write, so they only drop a key into a
`WorkQueue` (a set in insertion order: a key queued ten times is reconciled once).
Each controller drains its queue in time-boxed batches and then yields, so HTTP
watchers keep being served while 10,000 pods are created. Delayed work ("this pod is
ready at t", "this job pod finishes at t") goes into one `TimerHeap` instead of one
sleeping task per pod. Hand-written because asyncio offers neither a deduplicating
queue nor a batched timer, and the controller-runtime equivalents are Go.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# How long one controller may hold the event loop before it yields to the HTTP side.
BATCH_SECONDS = 0.01


class WorkQueue(Generic[K]):
    """Keys waiting for reconciliation, deduplicated, in first-queued order."""

    def __init__(self) -> None:
        self._keys: dict[K, None] = {}
        self._ready = asyncio.Event()

    def add(self, key: K) -> None:
        if key not in self._keys:
            self._keys[key] = None
            self._ready.set()

    def __len__(self) -> int:
        return len(self._keys)

    async def wait(self) -> None:
        await self._ready.wait()

    def drain(self, deadline: float) -> Iterator[K]:
        """Pop keys until the queue is empty or `time.monotonic()` passes `deadline`.

        A key re-added while the batch runs goes to the back, and is seen again later.
        """
        while self._keys and time.monotonic() < deadline:
            key = next(iter(self._keys))
            del self._keys[key]
            yield key
        if not self._keys:
            self._ready.clear()


class TimerHeap(Generic[K]):
    """Keys due at a monotonic time; the latest `schedule` for a key wins."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._counter = itertools.count()
        self._changed = asyncio.Event()

    def schedule(self, key: K, delay: float) -> None:
        at = time.monotonic() + max(delay, 0.0)
        self._due[key] = at
        heapq.heappush(self._heap, (at, next(self._counter), key))
        if self._heap[0][2] == key:
            self._changed.set()

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def pop_due(self, now: float, limit: int) -> list[K]:
        """Up to `limit` keys whose time has come, earliest first (cancelled ones skipped)."""
        out: list[K] = []
        while self._heap and self._heap[0][0] <= now and len(out) < limit:
            at, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == at:
                del self._due[key]
                out.append(key)
        return out

    async def wait(self) -> None:
        """Return when the earliest timer is due or an earlier one was scheduled."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # cancelled or superseded entries
        self._changed.clear()
        timeout = None
        if self._heap:
            timeout = self._heap[0][0] - time.monotonic()
            if timeout <= 0:
                return
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return
