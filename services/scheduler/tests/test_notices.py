"""Warning Events written off the decision path: aggregated per object, rate-limited."""

from __future__ import annotations

from typing import Any

from flotilla.common.errors import Unavailable
from flotilla.scheduler.notices import Notices


class Reporter:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.down = False

    async def warning(self, obj: dict[str, Any], reason: str, message: str) -> None:
        if self.down:
            raise Unavailable("hub down")
        self.sent.append((obj["metadata"]["name"], reason, message))


def obj(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name}}


async def test_one_event_per_object_the_newest_note_wins() -> None:
    reporter = Reporter()
    notices = Notices(reporter)
    for attempt in range(10):
        notices.note("k/a", obj("a"), "Unschedulable", f"no room ({attempt})")
    notices.note("k/b", obj("b"), "PartiallyScheduled", "2 of 3")
    assert reporter.sent == [], "noting writes nothing"
    assert await notices.flush() == 2
    assert reporter.sent == [
        ("a", "Unschedulable", "no room (9)"),
        ("b", "PartiallyScheduled", "2 of 3"),
    ]


async def test_the_same_warning_is_not_repeated_within_the_window() -> None:
    now = [0.0]
    reporter = Reporter()
    notices = Notices(reporter, repeat_after=60.0, clock=lambda: now[0])
    notices.note("k/a", obj("a"), "Unschedulable", "no room")
    await notices.flush()
    notices.note("k/a", obj("a"), "Unschedulable", "no room")
    assert await notices.flush() == 0
    notices.note("k/a", obj("a"), "Unschedulable", "taints everywhere")
    assert await notices.flush() == 1, "a new message is news"
    now[0] = 61.0
    notices.note("k/a", obj("a"), "Unschedulable", "taints everywhere")
    assert await notices.flush() == 1, "the window is over"
    assert len(reporter.sent) == 3


async def test_a_placed_object_is_forgotten_and_a_dead_hub_stops_nothing() -> None:
    reporter = Reporter()
    notices = Notices(reporter)
    notices.note("k/a", obj("a"), "Unschedulable", "no room")
    notices.clear("k/a")
    assert await notices.flush() == 0
    reporter.down = True
    notices.note("k/b", obj("b"), "Unschedulable", "no room")
    assert await notices.flush() == 0
    assert len(notices) == 0
    quiet = Notices(None)  # no hub to write to: nothing is kept to write later
    quiet.note("k/c", obj("c"), "Unschedulable", "x")
    assert len(quiet) == 0
