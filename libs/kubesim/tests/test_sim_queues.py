"""The deduplicating work queue and the timer heap that drive the simulator's loops."""

from __future__ import annotations

import asyncio
import time

from flotilla.kubesim.sim.queues import TimerHeap, WorkQueue


async def test_work_queue_deduplicates_and_keeps_first_queued_order() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)

    assert list(queue.drain(time.monotonic() + 10)) == ["a", "b", "c"]
    assert len(queue) == 0


async def test_work_queue_drain_stops_at_the_deadline_and_keeps_the_rest() -> None:
    queue: WorkQueue[int] = WorkQueue()
    for key in range(3):
        queue.add(key)

    assert list(queue.drain(time.monotonic() - 1)) == []
    assert len(queue) == 3
    await queue.wait()  # still signalled: work is left


async def test_timer_heap_latest_schedule_wins_and_cancel_drops() -> None:
    timers: TimerHeap[str] = TimerHeap()
    timers.schedule("later", 60)
    timers.schedule("soon", 60)
    timers.schedule("soon", 0)
    timers.schedule("gone", 0)
    timers.cancel("gone")

    await timers.wait()

    assert timers.pop_due(time.monotonic(), limit=10) == ["soon"]
    assert "later" in timers
    assert "gone" not in timers
    assert len(timers) == 1


async def test_timer_heap_wakes_when_an_earlier_timer_arrives() -> None:
    timers: TimerHeap[str] = TimerHeap()
    timers.schedule("far", 60)
    waiter = asyncio.create_task(timers.wait())
    await asyncio.sleep(0)
    timers.schedule("near", 0.01)

    await asyncio.wait_for(waiter, 5)

    assert timers.pop_due(time.monotonic() + 0.02, limit=10) == ["near"]
