"""The read model's pieces that need no bus: claim plans and the coalesced sync."""

from __future__ import annotations

import asyncio

from flotilla.common import capacity
from flotilla.common.capacity import Claim
from flotilla.common.events import ClusterPlacement
from flotilla.scheduler import claims
from flotilla.scheduler.readmodel import SyncPoint, with_reserved

from .builders import make_deployment


async def test_callers_that_ask_together_share_one_call_and_later_ones_get_a_new_one() -> None:
    calls = 0
    gate = asyncio.Event()

    async def sync() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return calls

    point = SyncPoint(sync)
    first = [asyncio.create_task(point()) for _ in range(5)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    # A call is running now: those who ask from here on need one that starts later.
    later = [asyncio.create_task(point()) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*first) == [1] * 5
    assert await asyncio.gather(*later) == [2] * 3
    assert calls == 2


def test_a_plan_claims_what_changed_releases_what_was_left_and_knows_its_undo() -> None:
    web = make_deployment("web", replicas=5).with_requests(cpu="1").build()
    key = web.ref.key
    previous = (
        ClusterPlacement(cluster="a", replicas=2),
        ClusterPlacement(cluster="b", replicas=3),
        ClusterPlacement(cluster="gone", replicas=1),
    )
    chosen = (
        ClusterPlacement(cluster="a", replicas=2),  # unchanged: not claimed again
        ClusterPlacement(cluster="b", replicas=1),
        ClusterPlacement(cluster="c", replicas=2),
    )
    plan = claims.plan(key, web, previous, chosen)
    assert plan.claims == (
        Claim("b", key, {"cpu": 1000}, 1),
        Claim("c", key, {"cpu": 1000}, 2),
    )
    assert plan.releases == (("gone", key),)
    assert plan.undo_claims == (
        Claim("b", key, {"cpu": 1000}, 3),
        Claim("gone", key, {"cpu": 1000}, 1),
    )
    assert plan.undo_releases == (("c", key),)
    assert plan.delta == {
        "b": {"cpu": -2000, "pods": -2},
        "c": {"cpu": 2000, "pods": 2},
        "gone": {"cpu": -1000, "pods": -1},
    }
    assert plan.clusters == {"b", "c", "gone"}
    assert not claims.plan(key, web, previous, previous)


def test_a_record_with_other_reserved_totals_is_the_record_model_copy_gives() -> None:
    """`with_reserved` skips pydantic's generic copy; what it builds must not differ
    from ``model_copy`` in anything a fleet or a comparison reads."""
    record = capacity.uniform("a", {"cpu": 4000, "pods": 10}, 2, observed_at=5.0)
    reserved = {"cpu": 500, "pods": 1}
    fast = with_reserved(record, reserved)
    slow = record.model_copy(update={"reserved": reserved})
    assert fast == slow
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.headroom == {"cpu": 7500, "pods": 19}
    assert fast.nodes is record.nodes  # shared, as the fleet's node-level memo expects
    assert record.reserved == {}  # the original is untouched
