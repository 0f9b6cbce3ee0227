"""Per-key ordered processing with bounded concurrency across keys.

The bus hands every delivered message to `KeyedQueue.submit`. Messages of one key
are processed strictly one after another, in stream order; different keys run in
parallel, at most `concurrency` at a time (kopf's `reactor/queueing.py` is the
model). Everything not yet finished is kept alive with periodic heartbeats
(JetStream `in_progress`) so the server does not redeliver it meanwhile.

A temporary failure parks the key: the failed message is handed back to the server
to be redelivered after its delay, and later messages of that key wait until the
redelivery arrives and succeeds, so a retry never lets a newer event overtake an
older one. If the redelivery does not arrive in time (the partition moved to
another replica), the key is released rather than stuck forever.

A delivery is skipped as a duplicate only when this queue processed that very
sequence while its key was active. A sequence *below* what the key already did is
not a duplicate: after a partition lease moved, JetStream redelivers a message the
stopped fetcher held once its ack wait ends, after later messages of the key were
handled. It is processed late (handlers are idempotent and level-triggered, and
tolerate a late event) rather than acknowledged unprocessed and lost.

Pure asyncio, no NATS: it is tested with fake deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class Delivery(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def sequence(self) -> int:
        """Position in the stream: orders deliveries and identifies redeliveries."""
        ...

    async def heartbeat(self) -> None: ...


@dataclass(frozen=True)
class Retry:
    """The processor's answer when a delivery must be retried after `delay` seconds."""

    delay: float


D = TypeVar("D", bound=Delivery)


@dataclass
class _Key(Generic[D]):
    waiting: deque[D] = field(default_factory=deque)
    running: D | None = None
    parked_on: int | None = None
    parked_until: float = 0.0
    done: set[int] = field(default_factory=set)
    """Sequences processed while the key was active (forgotten with the key)."""


class KeyedQueue(Generic[D]):
    def __init__(
        self,
        process: Callable[[D], Awaitable[Retry | None]],
        *,
        concurrency: int,
        heartbeat_interval: float,
        park_grace: float,
        release: Callable[[D], Awaitable[None]],
        duplicate: Callable[[D], Awaitable[None]],
    ) -> None:
        self._process = process
        self._release = release
        self._duplicate = duplicate
        self._concurrency = concurrency
        self._ready: deque[tuple[str, _Key[D]]] = deque()
        """Keys whose next delivery (their `running` one) waits for a worker, in turn."""
        self._workers: set[asyncio.Task[None]] = set()
        self._starter: asyncio.Task[None] | None = None
        """The worker started last, until it takes its first key (see `_work`)."""
        self._heartbeat_interval = heartbeat_interval
        self._park_grace = park_grace
        self._keys: dict[str, _Key[D]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._progress = asyncio.Event()
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._low = 0
        """A fetcher that found the queue full waits until this few are unfinished."""

    @property
    def pending(self) -> int:
        """Deliveries accepted and not yet finished (for fetch backpressure).

        Counted as they come and go rather than summed over the keys: every fetcher
        asks after every completion."""
        return self._pending

    def submit(self, delivery: D) -> None:
        if self._closing:
            self._spawn(self._release(delivery))
            return
        state = self._keys.setdefault(delivery.key, _Key())
        if delivery.sequence in state.done:
            self._spawn(self._duplicate(delivery))
            return
        if state.parked_on == delivery.sequence:
            state.waiting.appendleft(delivery)
            state.parked_on = None
        else:
            state.waiting.append(delivery)
        self._pending += 1
        self._idle.clear()
        self._ensure_keeper()
        self._wake(delivery.key, state)

    def _wake(self, key: str, state: _Key[D]) -> None:
        if state.running is None and state.parked_on is None and state.waiting:
            state.running = state.waiting.popleft()
            self._ready.append((key, state))
            if self._starter is None:
                self._add_worker()

    def _add_worker(self, relief: bool = False) -> None:
        if len(self._workers) < self._concurrency:
            worker = asyncio.get_running_loop().create_task(self._work(relief))
            self._workers.add(worker)
            self._tasks.add(worker)
            worker.add_done_callback(self._worker_gone)
            self._starter = worker

    def _worker_gone(self, worker: asyncio.Task[None]) -> None:
        self._tasks.discard(worker)
        self._workers.discard(worker)
        if self._starter is worker:  # cancelled before it took a key
            self._starter = None
            if self._ready and not self._closing:
                self._add_worker()

    async def _work(self, relief: bool) -> None:
        """One of at most `concurrency` workers: takes the key whose turn it is, runs
        its next delivery, puts the key back in line if more of it waits, and ends
        when no key is ready. A key goes to the back of the line after each
        delivery, so a busy key cannot hold a worker while other keys wait.

        Workers rather than a task per delivery, started as they turn out to be
        needed: one when a key becomes ready and none is about to start; and a
        worker that takes a key while more are ready starts a `relief` worker. That
        one runs in the next loop turn: if keys are still ready then, the worker
        before it is waiting in its handler (I/O), so the relief starts a worker for
        each of them at once, as a task per delivery would have. When handlers
        finish without waiting, the first worker runs the whole fetched batch and
        the relief finds nothing to do: two tasks per batch, not one per message."""
        me = asyncio.current_task()
        if self._starter is me:
            self._starter = None
        if relief:
            for _ in range(len(self._ready) - 1):  # all but the key this one takes
                self._add_worker()
        try:
            while self._ready:
                key, state = self._ready.popleft()
                if self._ready and self._starter is None:
                    self._add_worker(relief=True)
                delivery = state.running
                assert delivery is not None, "a ready key has its next delivery"
                try:
                    outcome = await self._process(delivery)
                except Exception:  # the processor maps errors; this is a last line of defence
                    log.exception("processing %s#%s crashed", key, delivery.sequence)
                    outcome = Retry(delay=1.0)
                self._finished()
                if isinstance(outcome, Retry):
                    state.parked_on = delivery.sequence
                    state.parked_until = time.monotonic() + outcome.delay + self._park_grace
                    state.running = None
                else:
                    state.done.add(delivery.sequence)
                    self._progress.set()
                    state.running = self._next(state)
                    if state.running is not None:
                        self._ready.append((key, state))
                        continue
                self._forget_if_idle(key, state)
        finally:
            if me is not None:
                self._workers.discard(me)

    def _next(self, state: _Key[D]) -> D | None:
        """The next waiting delivery, skipping redeliveries of what is already done."""
        while state.waiting and not self._closing:
            candidate = state.waiting.popleft()
            if candidate.sequence not in state.done:
                return candidate
            self._finished()
            self._spawn(self._duplicate(candidate))
        return None

    def _finished(self) -> None:
        """One accepted delivery is done with: let waiting fetchers in at the low mark."""
        self._pending -= 1
        if self._pending <= self._low:
            self._room.set()

    def _forget_if_idle(self, key: str, state: _Key[D]) -> None:
        idle = state.running is None and not state.waiting and state.parked_on is None
        if idle and self._keys.get(key) is state:
            del self._keys[key]
        if not self._keys:
            self._idle.set()
        self._progress.set()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ensure_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep_alive(), name="keyed-queue-keeper")

    async def _keep_alive(self) -> None:
        """Heartbeat everything unfinished; release keys whose redelivery never came."""
        while self._keys:
            await asyncio.sleep(self._heartbeat_interval)
            now = time.monotonic()
            beats: list[D] = []
            for key, state in list(self._keys.items()):
                beats.extend(state.waiting)
                if state.running is not None:
                    beats.append(state.running)
                if state.parked_on is not None and now >= state.parked_until:
                    log.warning(
                        "redelivery of %s#%s did not arrive; releasing key", key, state.parked_on
                    )
                    state.parked_on = None
                    self._wake(key, state)
                    self._forget_if_idle(key, state)
            for delivery in beats:
                with contextlib.suppress(Exception):
                    await delivery.heartbeat()

    def reopen(self) -> None:
        """Take work again after `drain` (a consumer restarted after a crash)."""
        self._closing = False

    async def drain(self, timeout: float) -> None:
        """Stop taking work, let running handlers finish, hand the rest back."""
        self._closing = True
        leftovers: list[D] = []
        for state in self._keys.values():
            leftovers.extend(state.waiting)
            state.waiting.clear()
        for delivery in leftovers:
            self._spawn(self._release(delivery))
        running = [t for t in self._tasks if not t.done()]
        if running:
            _, still = await asyncio.wait(running, timeout=timeout)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        self._keys.clear()
        self._ready.clear()
        self._starter = None
        self._pending = 0
        self._room.set()
        self._idle.set()

    async def wait_for_room(self, limit: int) -> None:
        """Backpressure: return at once while fewer than `limit` deliveries are
        unfinished; when that many are, return once half of them have finished.

        The slack lets every waiting fetcher take a whole batch when it wakes, and
        wakes them once per half-queue rather than on every completion (with a
        fetcher per partition, that was a dozen wake-ups per message)."""
        if self._pending < limit:
            return
        self._low = limit // 2
        while self._pending > self._low:
            self._room.clear()
            await self._room.wait()

    async def wait_keys_idle(self, belongs: Callable[[str], bool]) -> None:
        """Return once no key for which `belongs(key)` holds has unfinished work."""
        while any(belongs(key) for key in self._keys):
            self._progress.clear()
            await self._progress.wait()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class KeyedLocks:
    """One `asyncio.Lock` per key, for work on one key that must not overlap (a
    handler and a background repair of the same object); a key's lock is kept only
    while someone holds or waits for it, so memory follows the keys in use."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys whose lock is held or waited for."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
