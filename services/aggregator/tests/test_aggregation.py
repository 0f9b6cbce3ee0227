"""The folding rules, table by table: every op, each built-in kind, conditions,
staleness, observedGeneration and the annotations."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla.aggregator.aggregation import (
    Aggregate,
    MemberReport,
    ObjectReports,
    fold,
    fold_values,
    merge_conditions,
    merge_patch_for,
)
from flotilla.common.api import (
    AggregationOp,
    GroupVersionKind,
    PlacementState,
    ResourceInterpreterSpec,
)
from flotilla.common.events import ClusterPlacement, ObjectRef, PlacementDecided
from flotilla.common.interpreters import Interpreter, Registry

A, R = PlacementState.ACTIVE, PlacementState.RETIRING
REGISTRY = Registry.with_builtins()


def placed(
    kind: str = "Deployment", api_version: str = "apps/v1", *entries: Any
) -> PlacementDecided:
    clusters = [
        ClusterPlacement(cluster=e[0], replicas=e[1], state=e[2] if len(e) > 2 else A)
        for e in entries
    ]
    return PlacementDecided(
        ref=ObjectRef(api_version=api_version, kind=kind, name="web", namespace="default"),
        decision_id="d1",
        clusters=clusters,
        reason="split by capacity",
    )


def report(cluster: str, hub_generation: int | None = 2, **status: Any) -> MemberReport:
    return MemberReport(
        cluster=cluster,
        status=status,
        observed_generation=1,
        generation=1,
        hub_generation=hub_generation,
        ready=bool(status.get("availableReplicas", 0)),
    )


def interpreter(api_version: str, kind: str) -> Interpreter:
    return REGISTRY.lookup(GroupVersionKind.from_api_version(api_version, kind))


def run(
    placement: PlacementDecided,
    members: list[MemberReport],
    *,
    not_ready: tuple[str, ...] = (),
    hub_generation: int | None = 2,
    previous_observed: int | None = None,
    interp: Interpreter | None = None,
) -> Aggregate:
    interp = interp or interpreter(placement.ref.api_version, placement.ref.kind)
    return fold(
        placement,
        {m.cluster: m for m in members},
        interp.status_rules,
        whole=interp.spec.strategy.value == "any",
        not_ready=not_ready,
        hub_generation=hub_generation,
        previous_observed=previous_observed,
    )


FULL = {
    "replicas": 3,
    "readyReplicas": 3,
    "availableReplicas": 3,
    "updatedReplicas": 3,
    "unavailableReplicas": 0,
}


# --- ops ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "values", "expected"),
    [
        (AggregationOp.SUM, [1, 2, 3], 6),
        (AggregationOp.SUM, [1.5, 2], 3.5),
        (AggregationOp.SUM, ["x", 2, True], 2),
        (AggregationOp.SUM, [], None),
        (AggregationOp.MIN, [3, 1, 2], 1),
        (AggregationOp.MAX, [3, 1, 2], 3),
        (
            AggregationOp.MAX,
            ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"],
            "2026-02-01T00:00:00Z",
        ),
        (AggregationOp.MIN, [{"a": 1}], None),
        (AggregationOp.ALL, [True, True], True),
        (AggregationOp.ALL, [True, False], False),
        (AggregationOp.ALL, [], None),
        (AggregationOp.ANY, [False, True], True),
        (AggregationOp.ANY, [False, False], False),
        (AggregationOp.FIRST, ["Running", "Pending"], "Running"),
        (AggregationOp.FIRST, [], None),
    ],
    ids=[
        "sum",
        "sum-floats",
        "sum-ignores-non-numbers",
        "sum-of-nothing-is-left-out",
        "min",
        "max",
        "max-of-timestamps",
        "min-of-maps-is-left-out",
        "all-true",
        "all-one-false",
        "all-of-nothing",
        "any-one-true",
        "any-none-true",
        "first",
        "first-of-nothing",
    ],
)
def test_each_op_folds_the_values(op: AggregationOp, values: list[Any], expected: Any) -> None:
    assert fold_values(op, values) == expected


# --- built-in kinds -------------------------------------------------------------------


def test_nine_replicas_split_three_ways_sum_with_a_per_cluster_breakdown() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3), ("c", 3))
    result = run(placement, [report(c, **FULL) for c in "abc"])
    assert result.status["readyReplicas"] == 9
    assert result.status["availableReplicas"] == 9
    assert result.status["replicas"] == 9
    assert result.status["updatedReplicas"] == 9
    assert result.status["unavailableReplicas"] == 0
    breakdown = json.loads(result.cluster_status)
    assert [(e["cluster"], e["status"]["readyReplicas"], e["stale"]) for e in breakdown] == [
        ("a", 3, False),
        ("b", 3, False),
        ("c", 3, False),
    ]


def test_a_member_on_a_cluster_that_is_not_ready_is_stale_and_not_counted() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3), ("c", 3))
    result = run(placement, [report(c, **FULL) for c in "abc"], not_ready=("b",))
    assert result.status["availableReplicas"] == 6
    assert result.status["readyReplicas"] == 6
    stale = {e["cluster"]: (e["stale"], e["ready"]) for e in json.loads(result.cluster_status)}
    assert stale == {"a": (False, True), "b": (True, False), "c": (False, True)}


def test_retiring_copies_still_count_and_removed_members_do_not() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3, R))
    members = [report("a", **FULL), report("b", **FULL), report("gone", **FULL)]
    assert run(placement, members).status["readyReplicas"] == 6


def test_a_member_that_no_longer_exists_counts_nothing() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3))
    gone = MemberReport(cluster="b", exists=False, status=FULL)
    assert run(placement, [report("a", **FULL), gone]).status["readyReplicas"] == 3


def test_daemonset_sums_its_counters() -> None:
    placement = placed("DaemonSet", "apps/v1", ("a", None), ("b", None))
    counters = {
        "desiredNumberScheduled": 3,
        "currentNumberScheduled": 3,
        "numberReady": 2,
        "numberAvailable": 2,
    }
    status = run(placement, [report("a", **counters), report("b", **counters)]).status
    assert status == {
        "desiredNumberScheduled": 6,
        "currentNumberScheduled": 6,
        "numberReady": 4,
        "numberAvailable": 4,
        "observedGeneration": 2,
    }


@pytest.mark.parametrize(
    ("kind", "extra"), [("ReplicaSet", "fullyLabeledReplicas"), ("StatefulSet", "currentReplicas")]
)
def test_replicaset_and_statefulset_sum_the_workload_fields(kind: str, extra: str) -> None:
    placement = placed(kind, "apps/v1", ("a", 2), ("b", 1))
    members = [report("a", **FULL, **{extra: 2}), report("b", **FULL, **{extra: 1})]
    status = run(placement, members).status
    assert status["readyReplicas"] == 6 and status[extra] == 3


def test_job_completes_when_the_placed_copy_completes() -> None:
    placement = placed("Job", "batch/v1", ("a", 1))
    complete = {
        "succeeded": 1,
        "active": 0,
        "completionTime": "2026-01-01T00:01:00Z",
        "conditions": [{"type": "Complete", "status": "True", "reason": "Done"}],
    }
    status = run(placement, [report("a", **complete)]).status
    assert status["succeeded"] == 1 and status["completionTime"] == "2026-01-01T00:01:00Z"
    assert status["conditions"] == complete["conditions"]


def test_job_moving_takes_the_active_copy_and_sums_its_counters_with_the_retiring_one() -> None:
    placement = placed("Job", "batch/v1", ("b", 1, R), ("a", 1))
    status = run(
        placement, [report("b", active=1, phase="old"), report("a", active=1, phase="new")]
    ).status
    assert status["phase"] == "new" and status["active"] == 2


def test_pod_takes_the_single_members_status() -> None:
    placement = placed("Pod", "v1", ("a", None))
    pod = {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    status = run(placement, [report("a", **pod)]).status
    assert status == {**pod, "observedGeneration": 2}


def test_an_unknown_type_takes_its_members_status_without_rules() -> None:
    placement = placed("Widget", "example.com/v1", ("a", None))
    assert run(placement, [report("a", size=3)]).status == {"size": 3, "observedGeneration": 2}


def test_an_object_placed_whole_on_a_dead_cluster_shows_no_status_as_current() -> None:
    placement = placed("Pod", "v1", ("a", None))
    result = run(placement, [report("a", phase="Running")], not_ready=("a",))
    assert result.status == {}
    assert json.loads(result.cluster_status)[0]["stale"] is True


def test_declared_rules_of_a_crd_use_every_op() -> None:
    spec = ResourceInterpreterSpec.model_validate(
        {
            "target": {"apiVersion": "example.com/v1", "kind": "Flow"},
            "strategy": "split",
            "replicas": {"path": ".spec.replicas"},
            "statusAggregation": [
                {"path": ".status.workers", "op": "sum"},
                {"path": ".status.lag", "op": "max"},
                {"path": ".status.oldest", "op": "min"},
                {"path": ".status.healthy", "op": "all"},
                {"path": ".status.degraded", "op": "any"},
                {"path": ".status.version", "op": "first"},
            ],
        }
    )
    flow = Interpreter.compile(spec, "ResourceInterpreter/flow")
    placement = placed("Flow", "example.com/v1", ("a", 1), ("b", 1))
    members = [
        report("a", workers=2, lag=5, oldest=3, healthy=True, degraded=False, version="v2"),
        report("b", workers=3, lag=9, oldest=1, healthy=False, degraded=True, version="v1"),
    ]
    status = run(placement, members, interp=flow).status
    assert status == {
        "workers": 5,
        "lag": 9,
        "oldest": 1,
        "healthy": False,
        "degraded": True,
        "version": "v2",
        "observedGeneration": 2,
    }


# --- conditions -----------------------------------------------------------------------


def cond(
    type_: str, status: str, reason: str = "", at: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "lastTransitionTime": at}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("True", "True", "True"),
        ("True", "False", "False"),
        ("True", "Unknown", "Unknown"),
        ("True", None, "Unknown"),
        ("False", "Unknown", "False"),
    ],
    ids=[
        "true-everywhere",
        "false-somewhere",
        "unknown-somewhere",
        "absent-somewhere",
        "false-wins",
    ],
)
def test_a_condition_is_true_only_where_true_on_every_cluster(
    a: str, b: str | None, expected: str
) -> None:
    members = {
        "a": report("a", conditions=[cond("Available", a, "MinimumReplicasAvailable")]),
        "b": report("b", conditions=[cond("Available", b, "X")] if b else []),
    }
    (merged,) = merge_conditions(["a", "b"], members)
    assert merged["status"] == expected
    if expected != "True":
        assert "b" in merged["message"] and merged["reason"] == "NotTrueOnEveryCluster"
    else:
        assert merged["reason"] == "MinimumReplicasAvailable"


def test_a_condition_on_an_unreported_or_stale_cluster_is_not_true() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3))
    members = [
        report("a", conditions=[cond("Available", "True")]),
        report("b", conditions=[cond("Available", "True")]),
    ]
    (stale,) = run(placement, members, not_ready=("b",)).status["conditions"]
    assert stale["status"] == "Unknown" and "b (not reported)" in stale["message"]
    (missing,) = run(placement, members[:1]).status["conditions"]
    assert missing["status"] == "Unknown"


def test_condition_transition_time_is_the_latest_and_retiring_clusters_do_not_vote() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3), ("c", 3, R))
    members = [
        report("a", conditions=[cond("Available", "True", at="2026-01-01T00:00:00Z")]),
        report("b", conditions=[cond("Available", "True", at="2026-01-02T00:00:00Z")]),
        report("c", conditions=[cond("Available", "False")]),
    ]
    (merged,) = run(placement, members).status["conditions"]
    assert merged["status"] == "True"
    assert merged["lastTransitionTime"] == "2026-01-02T00:00:00Z"


# --- observedGeneration ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("generations", "not_ready", "expected"),
    [
        ((3, 3), (), 3),
        ((3, 2), (), 1),
        ((3, 3), ("b",), 1),
        ((3, None), (), 1),
    ],
    ids=["all-observed", "one-behind", "one-stale", "one-unknown"],
)
def test_observed_generation_is_set_only_when_every_member_observed_it(
    generations: tuple[int | None, int | None], not_ready: tuple[str, ...], expected: int
) -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3))
    members = [report(c, hub_generation=g, **FULL) for c, g in zip("ab", generations, strict=True)]
    status = run(
        placement, members, hub_generation=3, previous_observed=1, not_ready=not_ready
    ).status
    assert status["observedGeneration"] == expected


def test_a_member_that_has_not_observed_its_own_generation_holds_observed_generation_back() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3))
    behind = MemberReport(
        cluster="a", status=FULL, observed_generation=1, generation=2, hub_generation=3
    )
    assert "observedGeneration" not in run(placement, [behind], hub_generation=3).status


# --- annotations and records ----------------------------------------------------------


def test_placement_annotation_is_compact_json_of_the_decision() -> None:
    placement = placed("Deployment", "apps/v1", ("a", 3), ("b", 3, R))
    result = run(placement, [])
    assert result.placement == (
        '{"clusters":[{"cluster":"a","replicas":3,"state":"Active"},'
        '{"cluster":"b","replicas":3,"state":"Retiring"}],"decision":"d1",'
        '"reason":"split by capacity"}'
    )
    assert json.loads(result.cluster_status) == [
        {"cluster": "a", "state": "Active", "stale": False, "reported": False},
        {"cluster": "b", "state": "Retiring", "stale": False, "reported": False},
    ]


def test_a_new_placement_drops_the_reports_of_clusters_it_left() -> None:
    record = ObjectReports(key="k").with_report(report("a")).with_report(report("b"))
    moved = record.with_placement(placed("Deployment", "apps/v1", ("b", 3)))
    assert set(moved.members) == {"b"}


def test_a_report_sent_before_the_kept_one_changes_nothing() -> None:
    """Reports of one copy handed over out of order (a redelivery arriving after a
    newer report): the newer one stays; one without a time replaces as before."""
    sent = datetime(2026, 11, 30, 12, tzinfo=UTC)
    newer = report("a", readyReplicas=3).model_copy(update={"observed_at": sent})
    older = report("a", readyReplicas=1).model_copy(
        update={"observed_at": sent - timedelta(seconds=1)}
    )
    record = ObjectReports(key="k").with_report(newer).with_report(older)
    assert record.members["a"].status == {"readyReplicas": 3}
    later = report("a", readyReplicas=2).model_copy(
        update={"observed_at": sent + timedelta(seconds=1)}
    )
    assert record.with_report(later).members["a"].status == {"readyReplicas": 2}
    untimed = report("a", readyReplicas=0)
    assert record.with_report(untimed).members["a"].status == {"readyReplicas": 0}


@pytest.mark.parametrize(
    ("current", "wanted"),
    [
        ({}, {"readyReplicas": 3, "conditions": [{"type": "Available"}]}),
        ({"readyReplicas": 1, "replicas": 3}, {"readyReplicas": 3, "replicas": 3}),
        ({"readyReplicas": 1, "gone": 2}, {"readyReplicas": 1}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "d": [None, 1]}}),
        ({"a": 1}, {"a": {"b": {"c": 1}}}),
        ({"a": {"b": 1}}, {"a": 2}),
        ({"conditions": [{"type": "A"}, {"type": "B"}]}, {"conditions": [{"type": "B"}]}),
    ],
    ids=[
        "from-empty",
        "changed",
        "removed",
        "nested",
        "scalar-to-object",
        "object-to-scalar",
        "list-replaced",
    ],
)
def test_a_merge_patch_turns_the_status_shown_into_the_folded_one(
    current: dict[str, Any], wanted: dict[str, Any]
) -> None:
    from flotilla.common.patches import merge_patch

    patch = merge_patch_for(current, wanted)
    assert patch is not None
    assert merge_patch({"status": current}, {"status": patch}) == {"status": wanted}


def test_a_status_with_a_null_cannot_be_a_merge_patch() -> None:
    assert merge_patch_for({}, {"a": None}) is None
    assert merge_patch_for({"a": {}}, {"a": {"b": None}}) is None
    assert merge_patch_for({}, {"a": [None]}) == {"a": [None]}  # lists are replaced as they are
    assert merge_patch_for({"a": 1}, {"a": 1}) == {}
