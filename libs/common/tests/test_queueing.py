"""Per-key ordering, concurrency bounds and parking, with fake deliveries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from flotilla.common.queueing import KeyedLocks, KeyedQueue, Retry


@dataclass(eq=False)
class FakeDelivery:
    key: str
    sequence: int
    beats: int = 0
    released: bool = False
    acked_as_duplicate: bool = False
    log: list[str] = field(default_factory=list)

    async def heartbeat(self) -> None:
        self.beats += 1


def make_queue(
    process: object, *, concurrency: int = 4, heartbeat: float = 0.01, grace: float = 5.0
) -> KeyedQueue[FakeDelivery]:
    async def release(d: FakeDelivery) -> None:
        d.released = True

    async def duplicate(d: FakeDelivery) -> None:
        d.acked_as_duplicate = True

    return KeyedQueue(
        process,  # type: ignore[arg-type]
        concurrency=concurrency,
        heartbeat_interval=heartbeat,
        park_grace=grace,
        release=release,
        duplicate=duplicate,
    )


async def test_one_key_in_order_many_keys_in_parallel() -> None:
    order: list[tuple[str, int]] = []
    active = 0
    peak = 0

    async def process(d: FakeDelivery) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.005)
        order.append((d.key, d.sequence))
        active -= 1

    queue = make_queue(process, concurrency=3)
    seq = 0
    for _ in range(5):
        for key in "abcdef":
            seq += 1
            queue.submit(FakeDelivery(key, seq))
    await asyncio.wait_for(queue.wait_idle(), 5)
    for key in "abcdef":
        seqs = [s for k, s in order if k == key]
        assert seqs == sorted(seqs) and len(seqs) == 5
    assert peak == 3
    await queue.drain(1)


async def test_at_most_concurrency_tasks_run_the_deliveries() -> None:
    """Workers, not a task per delivery (or per key): each goes on to the next
    ready key when it is done with one."""
    runners: set[asyncio.Task[object] | None] = set()

    async def process(d: FakeDelivery) -> None:
        runners.add(asyncio.current_task())
        await asyncio.sleep(0)

    queue = make_queue(process, concurrency=3)
    for sequence in range(40):
        queue.submit(FakeDelivery(f"k{sequence % 10}", sequence))
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert len(runners) == 3
    await queue.drain(1)


async def test_handlers_that_never_wait_run_a_batch_on_one_worker() -> None:
    """A worker is started as a key becomes ready only when none is about to start:
    a batch whose handlers finish without waiting runs on the first worker, and the
    second finds nothing left (no task per delivery started only to exit)."""
    runners: set[asyncio.Task[object] | None] = set()
    started = len(asyncio.all_tasks())
    peak = 0

    async def process(d: FakeDelivery) -> None:
        nonlocal peak
        runners.add(asyncio.current_task())
        peak = max(peak, len(asyncio.all_tasks()) - started)

    queue = make_queue(process, concurrency=8)
    for sequence in range(40):
        queue.submit(FakeDelivery(f"k{sequence}", sequence))
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert len(runners) == 1
    assert peak <= 4  # the worker, the next one to start, the keeper, wait_for's task
    await queue.drain(1)


async def test_handlers_that_wait_all_run_at_once() -> None:
    """When handlers wait (I/O), every ready key gets a worker within a couple of
    loop turns, as with a task per delivery: not one more worker per turn."""
    active = 0
    gate = asyncio.Event()

    async def process(d: FakeDelivery) -> None:
        nonlocal active
        active += 1
        await gate.wait()

    queue = make_queue(process, concurrency=16)
    for sequence in range(20):
        queue.submit(FakeDelivery(f"k{sequence}", sequence))
    for _ in range(4):
        await asyncio.sleep(0)
    assert active == 16
    gate.set()
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert active == 20
    await queue.drain(1)


async def test_a_worker_cancelled_before_it_began_is_replaced() -> None:
    seen: list[int] = []

    async def process(d: FakeDelivery) -> None:
        seen.append(d.sequence)

    queue = make_queue(process)
    queue.submit(FakeDelivery("k", 1))
    starter = queue._starter
    assert starter is not None
    starter.cancel()
    await asyncio.wait_for(queue.wait_idle(), 2)
    assert seen == [1]
    await queue.drain(1)


async def test_a_busy_key_takes_its_turn_with_the_others() -> None:
    """A key with more waiting goes to the back of the line after each delivery, so
    it cannot hold a worker while other keys wait."""
    order: list[tuple[str, int]] = []

    async def process(d: FakeDelivery) -> None:
        await asyncio.sleep(0)
        order.append((d.key, d.sequence))

    queue = make_queue(process, concurrency=1)
    for key, sequence in (("a", 1), ("a", 2), ("a", 3), ("b", 4), ("c", 5)):
        queue.submit(FakeDelivery(key, sequence))
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert order == [("a", 1), ("b", 4), ("c", 5), ("a", 2), ("a", 3)]
    await queue.drain(1)


async def test_retry_parks_the_key_until_the_redelivery_arrives() -> None:
    seen: list[int] = []
    failed_once = False

    async def process(d: FakeDelivery) -> Retry | None:
        nonlocal failed_once
        seen.append(d.sequence)
        if d.sequence == 1 and not failed_once:
            failed_once = True
            return Retry(delay=0.05)
        return None

    queue = make_queue(process)
    first, second = FakeDelivery("k", 1), FakeDelivery("k", 2)
    queue.submit(first)
    queue.submit(second)
    await asyncio.sleep(0.1)
    assert seen == [1], "the second event must wait for the first one's retry"
    assert second.beats > 0, "a parked delivery is kept alive"
    queue.submit(FakeDelivery("k", 1))  # the server redelivers #1
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert seen == [1, 1, 2]
    await queue.drain(1)


async def test_a_redelivery_that_never_comes_releases_the_key() -> None:
    seen: list[int] = []

    async def process(d: FakeDelivery) -> Retry | None:
        seen.append(d.sequence)
        return Retry(delay=0.01) if d.sequence == 1 else None

    queue = make_queue(process, grace=0.05)
    queue.submit(FakeDelivery("k", 1))
    queue.submit(FakeDelivery("k", 2))
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert seen == [1, 2]
    await queue.drain(1)


async def test_an_already_processed_sequence_is_acknowledged_not_reprocessed() -> None:
    seen: list[int] = []

    async def process(d: FakeDelivery) -> None:
        seen.append(d.sequence)
        await asyncio.sleep(0.02)

    queue = make_queue(process)
    queue.submit(FakeDelivery("k", 1))
    queue.submit(FakeDelivery("k", 2))
    late = FakeDelivery("k", 1)
    await asyncio.sleep(0.03)  # #1 done, #2 running: the key is still known
    queue.submit(late)
    await asyncio.wait_for(queue.wait_idle(), 5)
    await asyncio.sleep(0)
    assert seen == [1, 2]
    assert late.acked_as_duplicate
    await queue.drain(1)


async def test_drain_finishes_running_work_and_hands_back_the_rest() -> None:
    started = asyncio.Event()
    finished: list[int] = []

    async def process(d: FakeDelivery) -> None:
        started.set()
        await asyncio.sleep(0.05)
        finished.append(d.sequence)

    queue = make_queue(process)
    waiting = [FakeDelivery("k", i) for i in range(2, 5)]
    queue.submit(FakeDelivery("k", 1))
    for d in waiting:
        queue.submit(d)
    await started.wait()
    await queue.drain(timeout=2)
    assert finished == [1]
    assert all(d.released for d in waiting)
    late = FakeDelivery("other", 9)
    queue.submit(late)
    await asyncio.sleep(0.01)
    assert late.released


@pytest.mark.parametrize("crash", [RuntimeError("boom"), KeyError("x")], ids=["runtime", "key"])
async def test_a_crashing_processor_does_not_kill_the_queue(crash: Exception) -> None:
    calls: list[int] = []

    async def process(d: FakeDelivery) -> None:
        calls.append(d.sequence)
        if len(calls) == 1:
            raise crash

    queue = make_queue(process, grace=0.01)
    queue.submit(FakeDelivery("k", 1))
    queue.submit(FakeDelivery("j", 2))
    await asyncio.wait_for(queue.wait_idle(), 5)
    assert sorted(calls) == [1, 2]
    await queue.drain(1)


async def test_waiting_for_some_keys_ignores_busy_others() -> None:
    gate = asyncio.Event()

    async def process(d: FakeDelivery) -> None:
        if d.key == "busy":
            await gate.wait()

    queue = make_queue(process)
    queue.submit(FakeDelivery("busy", 1))
    queue.submit(FakeDelivery("quick", 2))
    await asyncio.wait_for(queue.wait_keys_idle(lambda k: k == "quick"), 2)
    assert queue.pending == 1
    gate.set()
    await asyncio.wait_for(queue.wait_idle(), 2)
    await queue.drain(1)


async def test_a_redelivery_queued_behind_its_original_is_not_processed_twice() -> None:
    seen: list[int] = []

    async def process(d: FakeDelivery) -> None:
        seen.append(d.sequence)
        await asyncio.sleep(0.02)

    queue = make_queue(process)
    queue.submit(FakeDelivery("k", 1))
    again = FakeDelivery("k", 1)  # the server redelivered #1 while it was running
    queue.submit(again)
    queue.submit(FakeDelivery("k", 2))
    await asyncio.wait_for(queue.wait_idle(), 5)
    await asyncio.sleep(0)
    assert seen == [1, 2]
    assert again.acked_as_duplicate
    await queue.drain(1)


async def test_a_reopened_queue_takes_work_again_after_a_drain() -> None:
    handled: list[int] = []

    async def process(d: FakeDelivery) -> None:
        handled.append(d.sequence)

    queue = make_queue(process)
    await queue.drain(timeout=1)
    refused = FakeDelivery("k", 1)
    queue.submit(refused)
    queue.reopen()  # the consumer restarted after a crash
    accepted = FakeDelivery("k", 2)
    queue.submit(accepted)
    await asyncio.wait_for(queue.wait_idle(), 2)
    assert handled == [2]
    assert refused.released and not accepted.released
    await queue.drain(timeout=1)


async def test_pending_counts_what_is_accepted_and_not_finished() -> None:
    """The counter agrees with the keys at every step: completions, a retry (parked,
    not pending) and a drain."""
    gates = {key: asyncio.Event() for key in "abc"}

    async def process(d: FakeDelivery) -> Retry | None:
        await gates[d.key].wait()
        return Retry(delay=60) if d.key == "c" else None

    # A worker each: with fewer, "a"'s second delivery would wait its turn behind "c".
    queue = make_queue(process, concurrency=3)

    def counted() -> int:
        return sum(len(k.waiting) + (k.running is not None) for k in queue._keys.values())

    for sequence, key in enumerate("aabc", start=1):
        queue.submit(FakeDelivery(key, sequence))
    try:
        await _count_along(queue, gates, counted)
    finally:
        for gate in gates.values():
            gate.set()
        await queue.drain(1)
    assert queue.pending == 0


async def _count_along(
    queue: KeyedQueue[FakeDelivery],
    gates: dict[str, asyncio.Event],
    counted: Callable[[], int],
) -> None:
    assert queue.pending == counted() == 4
    gates["a"].set()
    await asyncio.wait_for(queue.wait_keys_idle(lambda k: k == "a"), 2)
    assert queue.pending == counted() == 2
    gates["c"].set()
    await asyncio.wait_for(queue.wait_for_room(2), 2)
    assert queue.pending == counted() == 1  # "c" is parked for its redelivery
    gates["b"].set()
    await asyncio.wait_for(queue.wait_keys_idle(lambda k: k == "b"), 2)
    assert queue.pending == counted() == 0


async def test_a_late_delivery_below_what_the_key_did_is_processed_not_dropped() -> None:
    """After a lease moved, JetStream redelivers #11 (held by the stopped fetcher)
    once its ack wait ends, when #12 and #13 of the key were already handled: it was
    never processed here, so it is processed now, late, not acknowledged as a
    duplicate and lost."""
    seen: list[int] = []
    started = asyncio.Event()

    async def process(d: FakeDelivery) -> None:
        seen.append(d.sequence)
        if d.sequence == 13:
            started.set()
        await asyncio.sleep(0.02)

    queue = make_queue(process)
    for sequence in (10, 12, 13):
        queue.submit(FakeDelivery("k", sequence))
    await asyncio.wait_for(started.wait(), 5)
    late = FakeDelivery("k", 11)
    again = FakeDelivery("k", 12)  # and a true redelivery of what was done
    queue.submit(late)
    queue.submit(again)
    await asyncio.wait_for(queue.wait_idle(), 5)
    await asyncio.sleep(0)
    assert seen == [10, 12, 13, 11]
    assert not late.acked_as_duplicate
    assert again.acked_as_duplicate
    await queue.drain(1)


async def test_keyed_locks_exclude_per_key_and_are_kept_only_while_in_use() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    inside = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with locks.hold("a"):
            order.append("a1 in")
            inside.set()
            await release.wait()
            order.append("a1 out")

    async def second() -> None:
        async with locks.hold("a"):
            order.append("a2 in")

    async def other() -> None:
        async with locks.hold("b"):
            order.append("b in")

    one = asyncio.create_task(first())
    await inside.wait()
    two = asyncio.create_task(second())
    await other()  # another key never waits for "a"
    await asyncio.sleep(0)
    assert order == ["a1 in", "b in"]
    assert len(locks) == 1  # "a": held and waited for; "b" already forgotten
    release.set()
    await asyncio.gather(one, two)
    assert order == ["a1 in", "b in", "a1 out", "a2 in"]
    assert len(locks) == 0


async def test_a_full_queue_lets_fetchers_in_again_once_half_of_it_is_done() -> None:
    # A fetcher per partition waits for room: waking them all on every completion
    # cost a dozen wake-ups per message. They are let in once, with room for a batch.
    gates = {f"k{i}": asyncio.Event() for i in range(8)}

    async def process(d: FakeDelivery) -> None:
        await gates[d.key].wait()

    queue = make_queue(process, concurrency=8)
    for i in range(8):
        queue.submit(FakeDelivery(f"k{i}", i))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(queue.wait_for_room(8)) for _ in range(3)]
    for i in range(3):
        gates[f"k{i}"].set()
        await asyncio.sleep(0.01)
        assert queue.pending == 7 - i
        assert not any(w.done() for w in waiters), f"let in with {queue.pending} unfinished"
    gates["k3"].set()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert queue.pending == 4
    await queue.wait_for_room(8)  # not full: no wait at all
    for gate in gates.values():
        gate.set()
    await asyncio.wait_for(queue.wait_idle(), 1)
    await queue.drain(1)
