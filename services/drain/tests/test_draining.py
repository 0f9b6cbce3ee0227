"""The drain coordinator's decisions, driven by a controllable clock: drain,
release after readiness or timeout, stuck objects, failover (NotReady and
NoExecute taints), failback with a settle period, the floor and the conditions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla.common.api import (
    Condition,
    ConditionStatus,
    Failover,
    PlacementState,
    Taint,
    TaintEffect,
    Toleration,
)
from flotilla.common.events import ClusterPlacement, ObjectRef
from flotilla.drain import draining
from flotilla.drain.draining import (
    ClusterRecord,
    Member,
    MoveKind,
    ObjectRecord,
    Timing,
    cluster_conditions,
    floor,
    plan,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A, R = PlacementState.ACTIVE, PlacementState.RETIRING
TIMING = Timing(settle=60, timeout=300, stuck_after=5, retry=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def web(*placed: tuple[str, int, PlacementState], **fields: Any) -> ObjectRecord:
    ref = ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="shop")
    values: dict[str, Any] = {"replicas": 9, "floor": 7, "split": True, **fields}
    return ObjectRecord(
        key=ref.key,
        ref=ref,
        clusters=[ClusterPlacement(cluster=c, replicas=n, state=s) for c, n, s in placed],
        **values,
    )


def fleet(*records: ClusterRecord) -> dict[str, ClusterRecord]:
    healthy = {name: ClusterRecord(name=name) for name in ("a", "b", "c")}
    return {**healthy, **{r.name: r for r in records}}


def drained(name: str = "a", after: float = 0) -> ClusterRecord:
    return ClusterRecord(name=name, unschedulable=True, evict_after=at(after))


def ready(record: ObjectRecord, **available: int) -> ObjectRecord:
    """Members as the syncer reports them: ready when at least 3 are available (their
    old share), whatever they are given now."""
    members = {c: Member(ready=n >= 3, available=n) for c, n in available.items()}
    return record.model_copy(update={"members": members})


def moved(record: ObjectRecord, *placed: tuple[str, int, PlacementState]) -> ObjectRecord:
    clusters = [ClusterPlacement(cluster=c, replicas=n, state=s) for c, n, s in placed]
    return record.model_copy(update={"clusters": clusters, "decision_id": "d2"})


# --- the floor --------------------------------------------------------------------------


def deployment(replicas: int, max_unavailable: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "template": {"metadata": {"labels": {"app": "web"}}},
    }
    if max_unavailable is not None:
        spec["strategy"] = {"rollingUpdate": {"maxUnavailable": max_unavailable}}
    return {"spec": spec}


def pdb(selector: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"spec": {"selector": selector or {"matchLabels": {"app": "web"}}, **spec}}


@pytest.mark.parametrize(
    ("obj", "replicas", "pdbs", "expected"),
    [
        (deployment(9), 9, [], 7),
        (deployment(9, 1), 9, [], 8),
        (deployment(9, "50%"), 9, [], 5),
        (deployment(9, 0), 9, [], 9),
        (deployment(4, "100%"), 4, [], 1),
        (deployment(1), 1, [], 1),
        (deployment(0), 0, [], 0),
        (deployment(9), 9, [pdb(minAvailable=8)], 8),
        (deployment(9), 9, [pdb(minAvailable="100%")], 9),
        (deployment(9), 9, [pdb(maxUnavailable=1)], 8),
        (deployment(9), 9, [pdb(minAvailable=4)], 7),
        (deployment(9), 9, [pdb({"matchLabels": {"app": "other"}}, minAvailable=9)], 7),
        (deployment(9), 9, [pdb({"matchLabels": 3}, minAvailable=9)], 7),
    ],
    ids=[
        "default-25-percent-rounded-down",
        "max-unavailable-1",
        "max-unavailable-50-percent",
        "max-unavailable-0",
        "everything-may-go-but-never-zero",
        "one-replica-never-zero",
        "zero-replicas",
        "pdb-min-available",
        "pdb-min-available-percent",
        "pdb-max-unavailable",
        "pdb-weaker-than-the-budget",
        "pdb-selecting-other-pods",
        "pdb-with-an-unreadable-selector",
    ],
)
def test_the_floor(obj: dict[str, Any], replicas: int, pdbs: list[Any], expected: int) -> None:
    assert floor(obj, replicas, pdbs) == expected


# --- drain ------------------------------------------------------------------------------


def test_nothing_happens_before_evict_after_and_the_plan_wakes_at_it() -> None:
    record = web(("a", 3, A), ("b", 3, A), ("c", 3, A))
    result = plan(record, fleet(drained("a", after=100)), at(50), TIMING)
    assert result.commands == [] and result.next_at == at(100)
    result = plan(record, fleet(drained("a", after=100)), at(100), TIMING)
    assert [(c.kind, c.cluster) for c in result.commands] == [("avoid", "a")]
    assert result.record.moves["a"].kind is MoveKind.DRAIN
    # A second look at the same time asks nothing again (the move is recorded).
    again = plan(result.record, fleet(drained("a", after=100)), at(101), TIMING)
    assert again.commands == []


def test_a_plan_that_changes_nothing_hands_back_the_record_itself() -> None:
    """The coordinator tells "nothing to write" by identity, not a deep comparison."""
    record = web(("a", 3, A), ("b", 3, A))
    assert plan(record, fleet(drained("a", after=100)), at(50), TIMING).record is record
    moving = plan(record, fleet(drained("a", after=100)), at(100), TIMING).record
    assert moving is not record
    assert plan(moving, fleet(drained("a", after=100)), at(101), TIMING).record is moving


def test_cordon_alone_moves_nothing() -> None:
    cordoned = ClusterRecord(name="a", unschedulable=True)
    result = plan(web(("a", 3, A)), fleet(cordoned), at(0), TIMING)
    assert result.commands == [] and result.record.moves == {}


def test_the_retiring_copy_is_released_only_once_the_new_copies_are_ready() -> None:
    clusters = fleet(drained("a"))
    asked = plan(web(("a", 3, A), ("b", 3, A), ("c", 3, A)), clusters, at(0), TIMING).record
    retiring = moved(asked, ("b", 5, A), ("c", 4, A), ("a", 3, R))
    waiting = plan(ready(retiring, a=3, b=3, c=3), clusters, at(10), TIMING)
    assert waiting.commands == []
    assert waiting.next_at == at(300)  # the timeout; readiness arrives as events
    done = plan(ready(retiring, a=3, b=5, c=4), clusters, at(20), TIMING)
    assert [(c.kind, c.cluster, c.reason) for c in done.commands] == [
        ("release", "a", "the new copies are ready")
    ]
    assert done.record.moves["a"].released
    # Once released and dropped by the scheduler the move is forgotten.
    gone = moved(done.record, ("b", 5, A), ("c", 4, A))
    assert plan(gone, clusters, at(21), TIMING).record.moves == {}


def test_a_new_copy_on_a_cluster_that_is_not_ready_does_not_count() -> None:
    down = ClusterRecord(name="b", ready=False, since=at(0))
    clusters = fleet(drained("a"), down)
    record = moved(web(("a", 9, A)), ("b", 9, A), ("a", 9, R))
    assert plan(ready(record, a=9, b=9), clusters, at(1), TIMING).commands == []


def test_after_the_timeout_the_old_copy_goes_with_a_warning_if_the_floor_holds() -> None:
    clusters = fleet(drained("a"))
    asked = plan(web(("a", 3, A), ("b", 3, A), ("c", 3, A)), clusters, at(0), TIMING).record
    retiring = ready(moved(asked, ("b", 5, A), ("c", 4, A), ("a", 3, R)), a=3, b=5, c=2)
    before = plan(retiring, clusters, at(299), TIMING)
    assert before.commands == [] and before.next_at == at(300)
    result = plan(retiring, clusters, at(300), TIMING)
    assert [(c.kind, c.cluster) for c in result.commands] == [("release", "a")]
    ((reason, message),) = result.warnings
    assert reason == "DrainTimeout" and "7 ready" in message


def test_after_the_timeout_the_old_copy_stays_when_the_floor_would_break() -> None:
    clusters = fleet(drained("a"))
    asked = plan(web(("a", 3, A), ("b", 3, A), ("c", 3, A)), clusters, at(0), TIMING).record
    retiring = ready(moved(asked, ("b", 5, A), ("c", 4, A), ("a", 3, R)), a=3, b=3, c=2)
    result = plan(retiring, clusters, at(300), TIMING)
    assert result.commands == []
    ((_, message),) = result.warnings
    assert "kept" in message and "5 would be ready" in message
    assert plan(result.record, clusters, at(301), TIMING).warnings == []  # said once


def test_a_policy_timeout_overrides_the_default() -> None:
    clusters = fleet(drained("a"))
    asked = plan(web(("a", 9, A), timeout=20.0), clusters, at(0), TIMING).record
    retiring = ready(moved(asked, ("b", 9, A), ("a", 9, R)), a=9, b=8)
    assert [c.kind for c in plan(retiring, clusters, at(20), TIMING).commands] == ["release"]


def test_an_object_nothing_else_can_take_is_stuck_and_asked_again_later() -> None:
    clusters = fleet(drained("a"))
    record = web(("a", 9, A), rejections={"b": ["capacity"], "c": ["taints"]})
    asked = plan(record, clusters, at(0), TIMING).record
    early = plan(asked, clusters, at(4), TIMING)
    assert early.stuck == {} and early.next_at == at(5)
    stuck = plan(asked, clusters, at(5), TIMING)
    assert stuck.stuck == {"a": "no other cluster can take it (b: capacity; c: taints)"}
    assert stuck.commands == []
    retried = plan(asked, clusters, at(30), TIMING)
    assert [(c.kind, c.attempt) for c in retried.commands] == [("avoid", 2)]


def test_uncordon_abandons_the_move() -> None:
    asked = plan(web(("a", 9, A)), fleet(drained("a")), at(0), TIMING).record
    assert asked.moves
    assert plan(asked, fleet(), at(1), TIMING).record.moves == {}


def test_a_copy_the_scheduler_retired_on_its_own_is_released_when_the_new_one_is_ready() -> None:
    record = ready(web(("b", 9, A), ("a", 9, R)), a=9, b=9)
    result = plan(record, fleet(), at(0), TIMING)
    assert [(c.kind, c.cluster) for c in result.commands] == [("release", "a")]
    assert result.record.moves["a"].kind is MoveKind.RETIRE


def test_clusters_not_observed_yet_release_nothing_early() -> None:
    """A coordinator that has not seen the clusters yet (a fresh start, events in any
    order) waits for readiness as usual; it never takes "unknown" for "gone"."""
    record = ready(web(("b", 9, A), ("a", 9, R)), a=9, b=9)
    assert plan(record, {}, at(0), TIMING).commands == []
    assert plan(record, {"b": ClusterRecord(name="b")}, at(1), TIMING).commands != []


def test_a_lost_release_is_sent_again_after_the_retry_interval() -> None:
    record = ready(web(("b", 9, A), ("a", 9, R)), a=9, b=9)
    released = plan(record, fleet(), at(0), TIMING).record
    assert plan(released, fleet(), at(29), TIMING).commands == []
    again = plan(released, fleet(), at(30), TIMING)
    assert [(c.kind, c.attempt) for c in again.commands] == [("release", 2)]


# --- failover ---------------------------------------------------------------------------


def down(name: str = "a", since: float = 0) -> ClusterRecord:
    return ClusterRecord(name=name, ready=False, since=at(since))


def test_failover_waits_for_the_toleration_then_moves_and_releases_at_once() -> None:
    record = web(("a", 9, A), failover=Failover(tolerationSeconds=60, failback=True))
    clusters = fleet(down("a"))
    early = plan(record, clusters, at(59), TIMING)
    assert early.commands == [] and early.next_at == at(60)
    asked = plan(record, clusters, at(60), TIMING)
    assert [(c.kind, c.cluster) for c in asked.commands] == [("avoid", "a")]
    assert asked.record.moves["a"].kind is MoveKind.FAILOVER
    retiring = moved(asked.record, ("b", 9, A), ("a", 9, R))
    result = plan(retiring, clusters, at(61), TIMING)  # b not ready yet: not waited for
    assert [(c.kind, c.cluster) for c in result.commands] == [("release", "a")]
    (entry,) = result.record.history
    assert (entry.from_cluster, entry.to_cluster, entry.at) == ("a", "b", at(61))
    assert result.record.failed_from == {"a": at(61)}


def test_default_toleration_is_300_seconds() -> None:
    result = plan(web(("a", 9, A)), fleet(down("a")), at(10), TIMING)
    assert result.next_at == at(300)


@pytest.mark.parametrize(
    ("tolerations", "expected"),
    [
        ([], at(0)),
        ([Toleration(key="maintenance", operator="Exists", effect="NoExecute")], None),
        (
            [
                Toleration(
                    key="maintenance", operator="Exists", effect="NoExecute", tolerationSeconds=30
                )
            ],
            at(30),
        ),
    ],
    ids=["not-tolerated-leaves-at-once", "tolerated-stays", "tolerated-for-30s"],
)
def test_a_no_execute_taint_sets_when_the_object_fails_over(
    tolerations: list[Toleration], expected: datetime | None
) -> None:
    taint = Taint(key="maintenance", effect=TaintEffect.NO_EXECUTE, timeAdded=at(0))
    tainted = ClusterRecord(name="a", taints=[taint])
    record = web(("a", 9, A), tolerations=tolerations)
    assert draining.failover_due(record, tainted, at(1)) == expected


def test_failback_after_the_settle_period_and_not_while_flapping() -> None:
    failover = Failover(tolerationSeconds=60, failback=True)
    record = web(("b", 9, A), failover=failover, failed_from={"a": at(100)})
    flapping = plan(record, fleet(down("a", since=150)), at(400), TIMING)
    assert flapping.commands == [] and flapping.record.failed_from == {"a": at(100)}
    back = ClusterRecord(name="a", since=at(200))
    early = plan(record, fleet(back), at(259), TIMING)
    assert early.commands == [] and early.next_at == at(260)
    result = plan(record, fleet(back), at(260), TIMING)
    assert [(c.kind, c.cluster, c.avoid) for c in result.commands] == [("failback", "a", ())]
    assert result.record.failed_from == {}
    assert result.record.history[-1].to_cluster == "a"


def test_an_object_placed_whole_fails_back_by_avoiding_where_it_runs() -> None:
    failover = Failover(failback=True)
    record = web(("b", None, A), split=False, failover=failover, failed_from={"a": at(0)})
    result = plan(record, fleet(ClusterRecord(name="a", since=at(0))), at(60), TIMING)
    assert [(c.kind, c.avoid) for c in result.commands] == [("failback", ("b",))]


def test_without_failback_nothing_returns() -> None:
    record = web(("b", 9, A), failed_from={"a": at(0)})
    result = plan(record, fleet(ClusterRecord(name="a", since=at(0))), at(1000), TIMING)
    assert result.commands == [] and result.record.failed_from == {}


# --- cluster conditions -----------------------------------------------------------------


def statuses(conditions: list[Condition]) -> dict[str, str]:
    return {c.type: c.status.value for c in conditions}


def test_conditions_through_cordon_drain_drained_and_uncordon() -> None:
    objects = [web(("a", 9, A))]
    cordoned = ClusterRecord(name="a", unschedulable=True)
    conditions, count = cluster_conditions(cordoned, objects, {}, at(0))
    assert statuses(conditions) == {"Cordoned": "True", "Draining": "False", "Drained": "False"}
    assert count == 1

    draining_cluster = drained("a")
    conditions, _ = cluster_conditions(draining_cluster, objects, {web().key: "no room"}, at(1))
    assert statuses(conditions) == {"Cordoned": "True", "Draining": "True", "Drained": "False"}
    draining_condition = conditions[1]
    assert draining_condition.reason == "ObjectsCannotMove"
    assert "no room" in draining_condition.message and web().key in draining_condition.message

    conditions, count = cluster_conditions(draining_cluster, [], {}, at(2))
    assert statuses(conditions) == {"Cordoned": "True", "Draining": "False", "Drained": "True"}
    assert count == 0

    conditions, _ = cluster_conditions(ClusterRecord(name="a"), [], {}, at(3))
    assert statuses(conditions) == {"Cordoned": "False", "Draining": "False", "Drained": "False"}


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    seen = Condition(
        type="Cordoned", status=ConditionStatus.TRUE, reason="Cordoned", last_transition_time=at(0)
    )
    cluster = ClusterRecord(name="a", unschedulable=True, conditions=[seen])
    conditions, _ = cluster_conditions(cluster, [], {}, at(50))
    by_type = {c.type: c for c in conditions}
    assert by_type["Cordoned"].last_transition_time == at(0)
    assert by_type["Drained"].last_transition_time == at(50)
    assert draining.same_conditions(conditions, cluster_conditions(cluster, [], {}, at(99))[0])
