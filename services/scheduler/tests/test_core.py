"""End-to-end scenarios through ``core.schedule``: the decision a user would see."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flotilla.common import capacity
from flotilla.common.api import STRATEGY_ANNOTATION, PlacementState, Strategy
from flotilla.common.events import ClusterPlacement, PlacementDecided
from flotilla.scheduler.core import (
    context,
    decision_id,
    effective_strategy,
    release_retiring,
    run_filters,
    schedule,
)
from flotilla.scheduler.model import (
    RECENT_PATCHES,
    ClusterView,
    Code,
    Decision,
    Fleet,
    Rejections,
    SchedulingInput,
    Verdict,
    _reserved_text,
)

from .builders import (
    NOW,
    ClusterBuilder,
    ObjectBuilder,
    PolicyBuilder,
    fleet,
    make_cluster,
    make_configmap,
    make_daemonset,
    make_deployment,
    make_input,
    make_pod,
    make_policy,
    make_pvc,
    make_workload,
    placed,
    three_equal,
    varied_inputs,
)


def active(decision: Decision) -> dict[str, int | None]:
    return {p.cluster: p.replicas for p in decision.active}


def retiring(decision: Decision) -> dict[str, int | None]:
    return {p.cluster: p.replicas for p in decision.clusters if p.state is PlacementState.RETIRING}


# --- seed scenarios -----------------------------------------------------------------


def test_deployment_of_ten_over_three_equal_clusters_splits_4_3_3() -> None:
    decision = schedule(make_input(make_deployment(replicas=10), three_equal()))
    assert sorted((n or 0 for n in active(decision).values()), reverse=True) == [4, 3, 3]
    assert decision.schedulable
    assert decision.pending == 0
    assert decision.reason.startswith("split 10 replicas over 3 clusters by capacity: ")


def test_daemonset_is_copied_to_every_eligible_cluster() -> None:
    clusters = [*three_equal(), make_cluster("down").not_ready()]
    decision = schedule(make_input(make_daemonset(), clusters))
    assert set(active(decision)) == {"ap-south", "eu-west", "us-east"}
    assert decision.strategy is Strategy.COPY
    assert str(decision.rejections["down"]) == "ready: not Ready: Ready is False (HeartbeatMissed)"


def test_pod_goes_to_one_cluster() -> None:
    decision = schedule(make_input(make_pod(), three_equal()))
    assert len(decision.active) == 1
    assert decision.strategy is Strategy.ANY


def test_pod_depending_on_a_pvc_goes_where_the_pvc_is() -> None:
    pvc_key = "v1/PersistentVolumeClaim/default/data"
    pod = make_pod().depending_on("v1", "PersistentVolumeClaim", "data")
    for where in ("ap-south", "eu-west", "us-east"):
        decision = schedule(make_input(pod, three_equal(), dependencies={pvc_key: [where]}))
        assert active(decision) == {where: 1}
        assert all(v.unit == "dependencies" for v in decision.rejections.values())


def test_pvc_itself_is_placed_with_any() -> None:
    assert len(schedule(make_input(make_pvc(), three_equal())).active) == 1


def test_two_component_workload_goes_whole_to_the_only_cluster_where_both_fit() -> None:
    obj = (
        make_workload()
        .with_component("jobmanager", 1, cpu="1", memory="2Gi")
        .with_component("taskmanager", 4, cpu="2", memory="4Gi")
    )
    clusters = [
        make_cluster("cpu-poor").with_room(4, cpu="1500m", memory="32Gi"),
        make_cluster("mem-poor").with_room(4, cpu="8", memory="3Gi"),
        make_cluster("fits").with_room(2, cpu="5", memory="12Gi"),
    ]
    decision = schedule(make_input(obj, clusters))
    assert active(decision) == {"fits": None}
    assert "all 2 components (jobmanager, taskmanager) on fits" in decision.reason
    assert "room for 1 whole set" in decision.reason
    for name in ("cpu-poor", "mem-poor"):
        assert decision.rejections[name].unit == "capacity"


def test_whole_sets_estimate_counts_more_than_one() -> None:
    obj = make_workload().with_component("a", 1, cpu="1").with_component("b", 2, cpu="1")
    decision = schedule(make_input(obj, [make_cluster("big").with_room(2, cpu="6")]))
    assert "room for 4 whole sets" in decision.reason


@pytest.mark.parametrize(
    ("cluster", "unit", "reason"),
    [
        (
            make_cluster("x").with_taint("dedicated", "batch"),
            "taints",
            "taint dedicated=batch:NoSchedule is not tolerated",
        ),
        (
            make_cluster("x").cordoned(),
            "cordon",
            "cordoned (spec.unschedulable); no new placements",
        ),
        (make_cluster("x").not_ready("Lost"), "ready", "not Ready: Ready is False (Lost)"),
    ],
    ids=["tainted", "cordoned", "NotReady"],
)
def test_unusable_cluster_is_rejected_with_the_right_reason(
    cluster: ClusterBuilder, unit: str, reason: str
) -> None:
    decision = schedule(make_input(make_deployment(), [cluster, make_cluster("ok")]))
    assert active(decision) == {"ok": 3}
    verdict = decision.rejections["x"]
    assert (verdict.unit, verdict.reason, verdict.code) == (unit, reason, Code.UNSCHEDULABLE)
    assert decision.rejection_reasons() == {f"{unit}: {reason}": ["x"]}


def test_nowhere_to_go_is_unschedulable_with_every_reason() -> None:
    clusters = [
        make_cluster("a").cordoned(),
        make_cluster("b").with_taint("gpu"),
        make_cluster("c").not_ready(),
        make_cluster("d").with_labels(region="us"),
    ]
    decision = schedule(
        make_input(make_deployment(), clusters, policy=make_policy().selecting(region="eu"))
    )
    assert not decision.schedulable
    assert decision.clusters == ()
    assert decision.reason == ("no cluster can take it: 4 of 4 rejected (cluster-selector 4)")
    decision = schedule(make_input(make_deployment(), clusters[:3]))
    assert (
        decision.reason == "no cluster can take it: 3 of 3 rejected (cordon 1, ready 1, taints 1)"
    )
    grouped = decision.rejection_reasons()
    assert sorted(name for names in grouped.values() for name in names) == ["a", "b", "c"]


def test_empty_fleet() -> None:
    decision = schedule(make_input(make_pod(), []))
    assert not decision.schedulable
    assert decision.reason == "no cluster can take it: no clusters are registered"


# --- existing placements: cordon keeps, avoid_clusters moves (make-before-break) ---------


def test_cordon_keeps_existing_placement() -> None:
    clusters = [make_cluster("a").cordoned(), make_cluster("b")]
    decision = schedule(
        make_input(make_deployment(replicas=4), clusters, previous=placed(("a", 4)))
    )
    assert active(decision) == {"a": 4}
    assert retiring(decision) == {}


def test_evict_after_alone_moves_nothing_and_places_as_before() -> None:
    """When a cluster is drained is the drain coordinator's decision, not the core's."""
    clusters = [make_cluster("a").draining(NOW - timedelta(hours=1)), make_cluster("b")]
    kept = schedule(make_input(make_deployment(replicas=4), clusters, previous=placed(("a", 4))))
    assert active(kept) == {"a": 4}
    fresh = schedule(make_input(make_pod(), [make_cluster("a").draining()]))
    assert active(fresh) == {"a": 1}


def test_avoided_cluster_moves_everything_and_keeps_the_old_copy_retiring() -> None:
    clusters = [make_cluster("a"), make_cluster("b"), make_cluster("c")]
    decision = schedule(
        make_input(make_deployment(replicas=4), clusters, previous=placed(("a", 4)), avoid={"a"})
    )
    assert active(decision) == {"b": 2, "c": 2}
    assert retiring(decision) == {"a": 4}
    assert decision.clusters[-1] == ClusterPlacement(
        cluster="a", replicas=4, state=PlacementState.RETIRING
    )


def test_retiring_cluster_chosen_again_becomes_active_and_gone_cluster_is_dropped() -> None:
    previous = (
        ClusterPlacement(cluster="a", replicas=2, state=PlacementState.RETIRING),
        ClusterPlacement(cluster="vanished", replicas=2),
    )
    decision = schedule(make_input(make_pod(), [make_cluster("a")], previous=previous))
    assert active(decision) == {"a": 1}
    assert retiring(decision) == {}


def test_scale_up_keeps_existing_replicas_where_they_are() -> None:
    previous = placed(("ap-south", 3), ("eu-west", 4), ("us-east", 3))
    decision = schedule(make_input(make_deployment(replicas=13), three_equal(), previous=previous))
    after = active(decision)
    assert all((after[c] or 0) >= (n or 0) for c, n in ((p.cluster, p.replicas) for p in previous))
    assert sum(n or 0 for n in after.values()) == 13


def test_existing_cluster_without_a_capacity_record_keeps_its_replicas() -> None:
    clusters = [make_cluster("a").without_capacity(), make_cluster("b")]
    decision = schedule(
        make_input(make_deployment(replicas=4), clusters, previous=placed(("a", 2)))
    )
    assert active(decision) == {"a": 2, "b": 2}


def test_reschedule_request_moves_off_an_avoided_cluster() -> None:
    decision = schedule(
        make_input(make_pod(), three_equal(), previous=placed(("us-east", 1)), avoid=["us-east"])
    )
    assert "us-east" not in active(decision)
    assert retiring(decision) == {"us-east": 1}


# --- strategy resolution, as-needed, deletion ----------------------------------------------


def test_policy_strategy_overrides_the_interpreter_default() -> None:
    decision = schedule(
        make_input(
            make_deployment(replicas=2), three_equal(), policy=make_policy().strategy("copy")
        )
    )
    assert decision.strategy is Strategy.COPY
    assert active(decision) == {"ap-south": 2, "eu-west": 2, "us-east": 2}


def test_annotation_overrides_the_policy() -> None:
    obj = make_deployment(replicas=2).with_annotation("flotilla.io/strategy", "any")
    decision = schedule(make_input(obj, three_equal(), policy=make_policy().strategy("copy")))
    assert decision.strategy is Strategy.ANY
    assert len(decision.active) == 1


def test_unknown_strategy_annotation_keeps_the_placement_and_says_why() -> None:
    obj = make_deployment().with_annotation("flotilla.io/strategy", "spread-thin")
    decision = schedule(make_input(obj, three_equal(), previous=placed(("eu-west", 3))))
    assert not decision.schedulable
    assert active(decision) == {"eu-west": 3}
    assert retiring(decision) == {}
    assert decision.reason.startswith("annotation flotilla.io/strategy: unknown strategy")
    assert decision.reason.endswith("; placement left unchanged")


def test_as_needed_is_never_placed_by_itself() -> None:
    decision = schedule(
        make_input(make_configmap(), three_equal(), previous=placed(("eu-west", 1)))
    )
    assert decision.clusters == ()
    assert decision.schedulable
    assert decision.reason.startswith("as-needed: ")


def test_deleted_object_is_removed_everywhere() -> None:
    decision = schedule(
        make_input(make_deployment().deleted(), three_equal(), previous=placed(("eu-west", 3)))
    )
    assert decision.deleted
    assert decision.clusters == ()
    assert decision.to_event().deleted


# --- determinism and the decision id --------------------------------------------------


def test_same_input_same_decision() -> None:
    obj = make_deployment(replicas=7).with_requests(cpu="300m")
    clusters = [*three_equal(), make_cluster("tainted").with_taint("x")]
    first = schedule(make_input(obj, clusters))
    second = schedule(make_input(obj, list(reversed(clusters))))
    assert first == second
    assert len(first.decision_id) == 32


@pytest.mark.parametrize(
    "change",
    ["now", "replicas", "previous", "policy", "cluster label", "uid"],
)
def test_decision_id_changes_with_any_input(change: str) -> None:
    obj = make_deployment(replicas=6)
    base = make_input(obj, three_equal())
    if change == "now":
        other = dataclasses.replace(base, now=NOW + timedelta(seconds=1))
    elif change == "replicas":
        other = make_input(make_deployment(replicas=7), three_equal())
    elif change == "previous":
        other = dataclasses.replace(base, previous=placed(("eu-west", 6)))
    elif change == "policy":
        other = dataclasses.replace(base, policy=make_policy().max_clusters(3).build())
    elif change == "cluster label":
        other = make_input(obj, [*three_equal()[:2], make_cluster("us-east").with_labels(a="b")])
    else:
        other = make_input(make_deployment(replicas=6).with_uid("other"), three_equal())
    assert schedule(base).decision_id != schedule(other).decision_id


_IDS_IN_A_PROCESS = """
import importlib.util, json, sys
from flotilla.scheduler.core import schedule
spec = importlib.util.spec_from_file_location("builders", sys.argv[1])
builders = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builders)
print(json.dumps([schedule(inp).decision_id for inp in builders.varied_inputs()]))
"""


def test_decision_ids_are_the_same_in_every_process() -> None:
    """Two replicas, a restarted one and ``flotilla replay`` must derive the same id
    from the same input: nothing in it may depend on the process (``hash`` of a
    string, set order). Two interpreters with other hash seeds give this one's ids."""
    here = [schedule(inp).decision_id for inp in varied_inputs()]
    assert len(set(here)) == len(here)
    builders = Path(__file__).with_name("builders.py")
    for seed in ("0", "4242"):
        done = subprocess.run(
            [sys.executable, "-c", _IDS_IN_A_PROCESS, str(builders)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(done.stdout) == here


def test_objects_with_equal_scores_spread_over_the_fleet() -> None:
    clusters = [make_cluster(f"c{i}") for i in range(5)]
    shared = Fleet(
        [c.build() for c in clusters],
        capacity.Snapshot(
            clusters={c.name: r for c in clusters if (r := c.record())}, taken_at=0.0
        ),
    )
    landed = Counter(
        next(iter(active(schedule(make_input(make_pod().with_uid(f"pod-{i}"), shared)))))
        for i in range(50)
    )
    assert len(landed) == 5


def test_to_event_carries_the_decision() -> None:
    clusters = [make_cluster("a").cordoned(), make_cluster("b")]
    previous = placed(("b", 3))
    decision = schedule(make_input(make_deployment(), clusters, previous=previous))
    event = decision.to_event(previous)
    assert isinstance(event, PlacementDecided)
    assert event.decision_id == decision.decision_id
    assert event.clusters == [ClusterPlacement(cluster="b", replicas=3)]
    assert event.previous == list(previous)
    assert event.rejected == {"cordon: cordoned (spec.unschedulable); no new placements": ["a"]}
    assert event.rejections == {}, "the per-cluster shape is no longer sent"
    assert event.reasons_for("a") == ["cordon: cordoned (spec.unschedulable); no new placements"]
    assert event.ref.key == "apps/v1/Deployment/default/web"


def test_fleet_refuses_a_cluster_listed_twice() -> None:
    cluster = make_cluster("a")
    with pytest.raises(ValueError, match="cluster 'a' appears twice"):
        Fleet([cluster.build(), cluster.build()], capacity.Snapshot(clusters={}, taken_at=0.0))


def test_reasons_are_one_line_even_for_a_large_fleet() -> None:
    clusters = [make_cluster(f"c{i:03d}") for i in range(40)]
    decision = schedule(make_input(make_deployment(replicas=100), clusters))
    assert "\n" not in decision.reason
    assert decision.reason.endswith("and 32 more")
    assert sum(n or 0 for n in active(decision).values()) == 100


# --- memoised filters give the same decisions as a fresh fleet ------------------------


@st.composite
def fleets(draw: st.DrawFn) -> list[ClusterBuilder]:
    clusters = []
    for i in range(draw(st.integers(min_value=1, max_value=7))):
        cluster = make_cluster(f"c{i}").with_labels(
            region=draw(st.sampled_from(["eu", "us", "ap"]))
        )
        cluster.with_room(draw(st.integers(1, 3)), cpu=str(draw(st.integers(0, 4))))
        state = draw(st.sampled_from(["ok", "ok", "cordon", "notready"]))
        if state == "cordon":
            cluster.cordoned()
        elif state == "notready":
            cluster.not_ready()
        taint = draw(st.sampled_from(["", "NoSchedule", "NoExecute"]))
        if taint:
            cluster.with_taint("dedicated", "batch", taint, added=NOW - timedelta(seconds=90))
        if draw(st.booleans()):
            cluster.serving(("apps/v1", "Deployment"), ("v1", "Pod"))
        clusters.append(cluster)
    return clusters


@st.composite
def policies(draw: st.DrawFn) -> PolicyBuilder | None:
    if draw(st.booleans()):
        return None
    policy = make_policy()
    if draw(st.booleans()):
        policy.selecting_expression(
            "region", "In", *draw(st.sets(st.sampled_from(["eu", "us", "ap"]), min_size=1))
        )
    if draw(st.booleans()):
        policy.tolerating(
            "dedicated",
            "batch",
            effect=draw(st.sampled_from(["NoSchedule", "NoExecute"])),
            seconds=None,
        )
    if draw(st.booleans()):
        policy.tolerating("dedicated", effect="NoExecute", seconds=60)
    if draw(st.booleans()):
        policy.max_clusters(draw(st.integers(1, 4)))
    if draw(st.booleans()):
        policy.spread("region", min_groups=draw(st.integers(1, 2)))
    return policy


@settings(max_examples=60, deadline=None)
@given(
    clusters=fleets(),
    policy=policies(),
    kind=st.sampled_from(["deployment", "daemonset", "pod"]),
    replicas=st.integers(0, 12),
    held=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), max_size=3),
    other_held=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), max_size=3),
    pin=st.one_of(st.none(), st.integers(0, 6)),
    avoid=st.sets(st.integers(0, 6), max_size=2),
)
def test_memoised_filters_decide_like_a_fresh_fleet(
    clusters: list[ClusterBuilder],
    policy: PolicyBuilder | None,
    kind: str,
    replicas: int,
    held: list[tuple[int, int]],
    other_held: list[tuple[int, int]],
    pin: int | None,
    avoid: set[int],
) -> None:
    if kind == "deployment":
        obj = make_deployment(replicas=replicas).with_requests(cpu="500m")
    elif kind == "daemonset":
        obj = make_daemonset()
    else:
        obj = make_pod()
    previous = held_placement(held)
    dependencies = {"v1/PersistentVolumeClaim/default/data": [f"c{pin}"]} if pin is not None else {}
    shared = fleet(*clusters)
    # Warm the memos with another decision that holds different clusters.
    schedule(
        make_input(
            obj,
            shared,
            policy=policy,
            previous=placed(*{f"c{i}": n for i, n in other_held}.items()),
        )
    )
    avoided = [f"c{i}" for i in avoid]
    warm = schedule(
        make_input(
            obj, shared, policy=policy, previous=previous, dependencies=dependencies, avoid=avoided
        )
    )
    cold = schedule(
        make_input(
            obj,
            clusters,
            policy=policy,
            previous=previous,
            dependencies=dependencies,
            avoid=avoided,
        )
    )
    assert warm == cold
    assert warm.decision_id == cold.decision_id
    assert list(warm.rejections) == list(cold.rejections)


def test_input_with_its_own_fleet_decides_like_a_shared_one() -> None:
    clusters = three_equal()
    shared = make_input(make_deployment(replicas=5), clusters)
    own = SchedulingInput.of(
        shared.analyzed,
        policy=None,
        clusters=[c.build() for c in reversed(clusters)],
        snapshot=shared.fleet,
        now=NOW,
    )
    assert schedule(own) == schedule(shared)


def test_naive_now_is_taken_as_utc() -> None:
    clusters = [make_cluster("a").with_taint("t", "", "NoExecute", added=NOW), make_cluster("b")]
    tolerated = make_policy().tolerating("t", effect="NoExecute", seconds=60)
    inp = make_input(make_pod(), clusters, previous=placed(("a", 1)), policy=tolerated)
    naive = dataclasses.replace(inp, now=NOW.replace(tzinfo=None) + timedelta(minutes=2))
    assert active(schedule(naive)) == {"b": 1}


def _decided(*placements: tuple[str, PlacementState]) -> PlacementDecided:
    return PlacementDecided(
        ref=make_deployment(replicas=6).ref,
        decision_id="d1",
        clusters=[ClusterPlacement(cluster=c, replicas=3, state=s) for c, s in placements],
        reason="spread",
    )


A, R = PlacementState.ACTIVE, PlacementState.RETIRING


@pytest.mark.parametrize(
    ("placements", "released", "left"),
    [
        ([("a", A), ("b", A), ("c", R)], ["c"], [("a", A), ("b", A)]),
        ([("a", A), ("c", R), ("d", R)], ["c", "d"], [("a", A)]),
        ([("a", A), ("c", R), ("d", R)], ["d"], [("a", A), ("c", R)]),
        ([("a", A), ("c", A)], ["c"], [("a", A), ("c", A)]),
        ([("a", A), ("c", R)], ["x"], [("a", A), ("c", R)]),
    ],
    ids=[
        "one-retiring-released",
        "two-retiring-released",
        "only-the-named-one",
        "active-entry-is-never-released",
        "unknown-cluster-changes-nothing",
    ],
)
def test_release_retiring_drops_only_the_named_retiring_entries(
    placements: list[tuple[str, PlacementState]],
    released: list[str],
    left: list[tuple[str, PlacementState]],
) -> None:
    decided = _decided(*placements)
    result = release_retiring(decided, released)
    assert [(p.cluster, p.state) for p in result.clusters] == left
    if left == placements:
        assert result is decided
    else:
        assert result.decision_id != decided.decision_id
        assert result.previous == decided.clusters
        assert result.ref == decided.ref and not result.deleted
        assert result == release_retiring(decided, released)  # deterministic


def patch_lists(most: int) -> st.SearchStrategy[list[list[tuple[int, int | None]]]]:
    """Up to `most` patches of up to three clusters ``c0``..``c6`` each: a record with
    that many millicores reserved (small ones mostly change no verdict, large ones
    move clusters between passing and rejected), or None for no record."""
    return st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 6),
                st.one_of(st.none(), st.integers(0, 250), st.integers(0, 4000)),
            ),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=most,
    )


def patch_records(
    clusters: list[ClusterBuilder], patch: list[tuple[int, int | None]]
) -> dict[str, capacity.ClusterCapacity | None]:
    """One patch of `patch_lists` as the records it puts in (clusters without a
    record, or not in the fleet, are left out)."""
    change: dict[str, capacity.ClusterCapacity | None] = {}
    for index, reserved_cpu in patch:
        name = f"c{index}"
        base = next((c for c in clusters if c.name == name), None)
        record = base.record() if base is not None else None
        if record is None:
            continue
        change[name] = (
            None
            if reserved_cpu is None
            else record.model_copy(update={"reserved": {"cpu": reserved_cpu, "pods": 1}})
        )
    return change


def held_placement(held: list[tuple[int, int]]) -> tuple[ClusterPlacement, ...]:
    """A drawn previous placement: replicas on ``c<index>`` (a later index wins)."""
    return placed(*{f"c{i}": n for i, n in held}.items())


def patch_test_objects(replicas: int) -> list[ObjectBuilder]:
    """A split, a copy and an any object, decided between patches."""
    return [
        make_deployment(replicas=replicas).with_requests(cpu="500m"),
        make_daemonset(),
        make_pod().with_requests(cpu="1"),
    ]


PATCHED_FLEET_CASES = {
    "clusters": fleets(),
    "policy": policies(),
    "replicas": st.integers(0, 12),
    "held": st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), max_size=3),
}
"""A fleet, a policy and an object's size and previous placement, for the tests that
patch a fleet and compare it with one built fresh."""


@settings(max_examples=60, deadline=None)
@given(**PATCHED_FLEET_CASES, patches=patch_lists(4))
def test_patched_fleet_decides_like_a_fresh_one(
    clusters: list[ClusterBuilder],
    policy: PolicyBuilder | None,
    replicas: int,
    held: list[tuple[int, int]],
    patches: list[list[tuple[int, int | None]]],
) -> None:
    """A fleet patched record by record (warm memos in between) decides exactly as a
    fleet built fresh from the final records: same decision, same decision_id."""
    objects = patch_test_objects(replicas)
    previous = held_placement(held)
    patched = fleet(*clusters)
    records = {c.name: c.record() for c in clusters}
    for patch in patches:
        for obj in objects:  # warm every memo on the current records
            schedule(make_input(obj, patched, policy=policy, previous=previous))
        change = patch_records(clusters, patch)
        records.update(change)
        patched.patch(change)
    snapshot = capacity.Snapshot(
        clusters={n: r for n, r in records.items() if r is not None}, taken_at=NOW.timestamp()
    )
    fresh = Fleet([c.build() for c in clusters], snapshot)
    assert patched.fingerprint == fresh.fingerprint
    assert patched.views == fresh.views  # every field of a patched view carried over
    for obj in objects:
        warm = schedule(make_input(obj, patched, policy=policy, previous=previous))
        cold = schedule(make_input(obj, fresh, policy=policy, previous=previous))
        assert warm == cold
        assert warm.decision_id == cold.decision_id
        assert list(warm.rejections) == list(cold.rejections)


def id_from_scratch(inp: SchedulingInput, decision: Decision) -> str:
    """The decision id of `decision` with its rejections' mark summed afresh."""
    return decision_id(
        inp,
        decision.strategy,
        [inp.fleet.placement_line(p) for p in decision.clusters],
        decision.reason,
        len(decision.rejections),
        inp.fleet.rejections_mark(decision.rejections),
        decision.schedulable,
        decision.pending,
        decision.deleted,
    )


@settings(max_examples=60, deadline=None)
@given(**PATCHED_FLEET_CASES, patches=patch_lists(4))
def test_the_memoised_rejections_mark_is_the_sum_of_the_decisions_rejections(
    clusters: list[ClusterBuilder],
    policy: PolicyBuilder | None,
    replicas: int,
    held: list[tuple[int, int]],
    patches: list[list[tuple[int, int | None]]],
) -> None:
    """The mark a decision id hashes (the filter memo's share kept up to date through
    patches, the holders', the per-decision filters' and the strategy's added) is the
    mark of the decision's rejections summed from scratch."""
    objects = [
        *patch_test_objects(replicas),
        make_deployment(replicas=replicas).with_requests(cpu="500m").with_uid("pinned"),
    ]
    previous = held_placement(held)
    # A dozen cordoned clusters more: a patch then changes a few of many rejections,
    # which the memo updates term by term rather than summing again.
    patched = fleet(*clusters, *[make_cluster(f"x{i:02d}").cordoned() for i in range(12)])
    for patch in [[], *patches]:
        patched.patch(patch_records(clusters, patch))
        for obj in objects:
            pinned = obj.uid == "pinned"  # per-decision filters reject some clusters
            inp = make_input(
                obj,
                patched,
                policy=policy,
                previous=previous,
                dependencies={"v1/ConfigMap/default/x": ["c1", "c2"]} if pinned else {},
                avoid={"c3"} if pinned else (),
            )
            decision = schedule(inp)
            assert decision.decision_id == id_from_scratch(inp, decision)


def test_the_rejections_mark_names_which_cluster_got_which_verdict() -> None:
    """Two clusters' verdicts swapped, one rejection more or less: another mark."""
    patched = fleet(make_cluster("a"), make_cluster("b"), make_cluster("c"))
    cordon = Verdict(Code.UNSCHEDULABLE, "cordon", "cordoned")
    taint = Verdict(Code.UNSCHEDULABLE, "taints", "tainted")
    marks = {
        patched.rejections_mark(rejections)
        for rejections in [
            {},
            {"a": cordon},
            {"a": cordon, "b": taint},
            {"a": taint, "b": cordon},
            {"a": cordon, "b": cordon},
            {"a": cordon, "b": taint, "c": taint},
        ]
    }
    assert len(marks) == 6
    # In any order, from any verdict objects with the same lines: the same mark (one
    # verdict object for every cluster is summed the short way).
    same = Verdict(Code.UNSCHEDULABLE, "cordon", "cordoned")
    assert patched.rejections_mark({"b": taint, "a": same}) == patched.rejections_mark(
        {"a": cordon, "b": taint}
    )
    assert patched.rejections_mark({"a": cordon, "b": cordon}) == patched.rejections_mark(
        {"a": cordon, "b": same}
    )


def test_rejections_are_sent_once_per_reason() -> None:
    """Twenty clusters turned down for the same taint are one reason with twenty
    names on the event, not twenty copies of the line."""
    clusters = [make_cluster(f"t{i:02d}").with_taint("gpu") for i in range(20)]
    clusters.append(make_cluster("ok"))
    event = schedule(make_input(make_pod(), clusters)).to_event()
    (reason,) = event.rejected
    assert event.rejected[reason] == [f"t{i:02d}" for i in range(20)]
    assert event.reasons_for("t07") == [reason]
    assert event.reasons_for("ok") == []


def cordon_and_capacity_judge(
    judged: list[list[str]], words: dict[str, str]
) -> Callable[[Sequence[ClusterView]], tuple[list[ClusterView], Rejections]]:
    """A filter that rejects cluster "a" as cordoned and "c" for capacity, in the
    words `words["c"]` holds when it judges; it notes which clusters it judged."""

    def judge(views: Sequence[ClusterView]) -> tuple[list[ClusterView], Rejections]:
        judged.append([v.name for v in views])
        rejections: Rejections = {}
        for v in views:
            if v.name == "a":
                rejections[v.name] = Verdict(Code.UNSCHEDULABLE, "cordon", "cordoned")
            elif v.name == "c":
                rejections[v.name] = Verdict(Code.UNSCHEDULABLE, "capacity", words["c"])
        return [v for v in views if v.name not in rejections], rejections

    return judge


def test_a_capacity_patch_judges_again_only_what_capacity_can_change() -> None:
    """A rejection by a filter that does not read capacity stands through a patch;
    clusters that passed, or that capacity rejected, are judged again."""
    clusters = [make_cluster("a").cordoned(), make_cluster("b"), make_cluster("c")]
    patched = fleet(*clusters)
    judged: list[list[str]] = []
    judge = cordon_and_capacity_judge(judged, {"c": "full"})

    def stands(verdict: Verdict) -> bool:
        return verdict.unit != "capacity"

    first = patched.verdicts("k", judge, stands=stands)
    records = {c.name: c.record() for c in clusters}
    patched.patch(
        {
            name: record.model_copy(update={"reserved": {"cpu": 1}})
            for name, record in records.items()
            if record is not None
        }
    )
    second = patched.verdicts("k", judge, stands=stands)
    assert judged == [["a", "b", "c"], ["b", "c"]]
    assert [v.name for v in second[0]] == [v.name for v in first[0]] == ["b"]
    assert second[1] == first[1]
    assert patched.verdicts("k", judge, stands=stands) == second
    assert len(judged) == 2  # nothing patched since: the memo answers
    # The patch changed no verdict: the memo's own objects come back (so the
    # rejections' mark is known without a pass over them).
    assert second[0] is first[0] and second[1] is first[1]
    assert patched.verdicts_mark("k", second[1]) == patched.rejections_mark(second[1])


def test_which_rejections_stand_is_remembered_with_the_memo() -> None:
    """`stands` is asked once per rejection when the memo is filled (and for a
    reworded one when it is judged again), not for every stale cluster after
    every patch; a rejection that stands is never judged again."""
    clusters = [make_cluster("a").cordoned(), make_cluster("b"), make_cluster("c")]
    patched = fleet(*clusters)
    asked: list[str] = []
    judged: list[list[str]] = []
    words = {"c": "full"}
    judge = cordon_and_capacity_judge(judged, words)

    def stands(verdict: Verdict) -> bool:
        asked.append(verdict.unit)
        return verdict.unit != "capacity"

    patched.verdicts("k", judge, stands=stands)
    assert sorted(asked) == ["capacity", "cordon"]
    records = {c.name: c.record() for c in clusters}
    for _ in range(3):
        patched.patch({name: r for name, r in records.items() if r is not None})
        patched.verdicts("k", judge, stands=stands)
    assert sorted(asked) == ["capacity", "cordon"]  # nothing asked again
    assert judged[1:] == [["b", "c"]] * 3  # "a" stands: never judged again
    words["c"] = "fuller"
    patched.patch({"c": records["c"]})
    _, rejections = patched.verdicts("k", judge, stands=stands)
    assert rejections["c"].reason == "fuller" and asked[-1] == "capacity"


def test_a_patch_that_words_a_rejection_alike_keeps_the_memos_objects() -> None:
    """A cluster judged again whose verdict reads as before (a new but equal
    `Verdict`) leaves the memo's rejections as they were, the very objects; one
    whose words change gets a new rejections dict."""
    clusters = [make_cluster("a"), make_cluster("b")]
    patched = fleet(*clusters)
    words = {"a": "full", "b": "full"}

    def judge(views: Sequence[ClusterView]) -> tuple[list[ClusterView], Rejections]:
        rejections = {v.name: Verdict(Code.UNSCHEDULABLE, "capacity", words[v.name]) for v in views}
        return [], rejections

    first = patched.verdicts("k", judge)
    records = {c.name: c.record() for c in clusters}
    patched.patch({"a": records["a"], "b": records["b"]})
    second = patched.verdicts("k", judge)
    assert second[1] is first[1]
    words["b"] = "fuller"
    patched.patch({"b": records["b"]})
    third = patched.verdicts("k", judge)
    assert third[1] is not first[1] and list(third[1]) == ["a", "b"]
    assert third[1]["a"] is first[1]["a"] and third[1]["b"].reason == "fuller"
    assert first[1]["b"].reason == "full"  # the memo's earlier dict is not changed


@pytest.mark.parametrize("width", [1, 9])
@pytest.mark.parametrize("patches", [1, 2, RECENT_PATCHES, RECENT_PATCHES + 5])
def test_memos_catch_up_on_any_number_of_patches_since_they_were_filled(
    patches: int, width: int
) -> None:
    """A memo filled before a run of patches recomputes the clusters they changed,
    whether the fleet unions the names of the few it remembers or scans for them
    (patches of `width` clusters: 9 of 12 is a copy object's claim)."""
    clusters = [make_cluster(f"c{i:02d}") for i in range(12)]
    patched = fleet(*clusters)
    objects = [make_deployment(replicas=9).with_requests(cpu="500m"), make_daemonset()]
    for obj in objects:
        schedule(make_input(obj, patched))
    records = {c.name: c.record() for c in clusters}
    for step in range(patches):
        change = {}
        for name in sorted({f"c{(step + j) % 12:02d}" for j in range(width)}, reverse=True):
            base = records[name]
            assert base is not None
            reserved = {"cpu": 100 * (step + 1), "pods": 1}
            change[name] = records[name] = base.model_copy(update={"reserved": reserved})
        patched.patch(change)
    snapshot = capacity.Snapshot(
        clusters={n: r for n, r in records.items() if r is not None}, taken_at=NOW.timestamp()
    )
    fresh = Fleet([c.build() for c in clusters], snapshot)
    for obj in objects:
        warm = schedule(make_input(obj, patched))
        cold = schedule(make_input(obj, fresh))
        assert warm == cold
        assert warm.decision_id == cold.decision_id


def test_clusters_judged_again_after_a_patch_go_to_the_narrower_judge() -> None:
    """With `again`, a patched cluster whose earlier verdict may change is judged by it
    (the filters before the first capacity-reading one are not run again); the whole
    `judge` runs only for a fleet seen the first time."""
    clusters = [make_cluster("a").cordoned(), make_cluster("b"), make_cluster("c")]
    patched = fleet(*clusters)
    calls: list[tuple[str, list[str]]] = []

    def judging(
        name: str,
    ) -> Callable[[Sequence[ClusterView]], tuple[list[ClusterView], Rejections]]:
        def judge(views: Sequence[ClusterView]) -> tuple[list[ClusterView], Rejections]:
            calls.append((name, [v.name for v in views]))
            rejections: Rejections = {}
            if any(v.name == "a" for v in views):
                rejections["a"] = Verdict(Code.UNSCHEDULABLE, "cordon", "cordoned")
            return [v for v in views if v.name not in rejections], rejections

        return judge

    def stands(verdict: Verdict) -> bool:
        return verdict.unit != "capacity"

    first = patched.verdicts("k", judging("judge"), stands=stands, again=judging("again"))
    records = {c.name: c.record() for c in clusters}
    patched.patch(
        {n: r.model_copy(update={"reserved": {"cpu": 1}}) for n, r in records.items() if r}
    )
    second = patched.verdicts("k", judging("judge"), stands=stands, again=judging("again"))
    assert calls == [("judge", ["a", "b", "c"]), ("again", ["b", "c"])]
    assert [v.name for v in second[0]] == [v.name for v in first[0]] == ["b", "c"]
    assert second[1] == first[1]


def test_rejection_reasons_list_names_sorted_and_reasons_by_their_first_name() -> None:
    """The event's grouping: each reason once, its clusters sorted, the reasons in the
    order of their first cluster by name (whatever order the verdicts were made in)."""
    taint = Verdict(Code.UNSCHEDULABLE, "taints", "taint x is not tolerated")
    cordon = Verdict(Code.UNSCHEDULABLE, "cordon", "cordoned")
    decision = schedule(make_input(make_pod(), [make_cluster("ok")]))
    decision = dataclasses.replace(
        decision, rejections={"d": taint, "b": taint, "c": cordon, "a": cordon, "e": taint}
    )
    grouped = decision.rejection_reasons()
    assert grouped == {
        "cordon: cordoned": ["a", "c"],
        "taints: taint x is not tolerated": ["b", "d", "e"],
    }
    assert list(grouped) == ["cordon: cordoned", "taints: taint x is not tolerated"]
    assert str(taint) == taint.text == "taints: taint x is not tolerated"


@settings(max_examples=60, deadline=None)
@given(**PATCHED_FLEET_CASES, patches=patch_lists(6), data=st.data())
def test_every_patch_leaves_the_memos_as_a_fresh_fleet_would_fill_them(
    clusters: list[ClusterBuilder],
    policy: PolicyBuilder | None,
    replicas: int,
    held: list[tuple[int, int]],
    patches: list[list[tuple[int, int | None]]],
    data: st.DataObject,
) -> None:
    """After every patch, what the memoised filters pass and reject is what a fresh
    fleet computes: the same views, the same rejections in the same order. Small
    reservations mostly leave every verdict as it was (the memo is updated cluster
    by cluster); large ones move clusters between passing and rejected (the memo is
    rebuilt). Only some objects are decided
    after each patch, so memos filled together fall behind by different numbers of
    patches (what the fleet remembers as stale per epoch must follow every patch)."""
    objects = [*patch_test_objects(replicas), make_pod()]
    previous = held_placement(held)
    patched = fleet(*clusters)
    records = {c.name: c.record() for c in clusters}
    for patch in patches:
        change = patch_records(clusters, patch)
        records.update(change)
        patched.patch(change)
        snapshot = capacity.Snapshot(
            clusters={n: r for n, r in records.items() if r is not None},
            taken_at=NOW.timestamp(),
        )
        fresh = Fleet([c.build() for c in clusters], snapshot)
        decided = data.draw(st.sets(st.integers(0, len(objects) - 1)))
        for obj in [objects[i] for i in sorted(decided)]:
            for prior in ((), previous):
                warm = make_input(obj, patched, policy=policy, previous=prior)
                cold = make_input(obj, fresh, policy=policy, previous=prior)
                strategy = effective_strategy(warm)
                warm_passing, warm_rejections = run_filters(context(warm, strategy))
                cold_passing, cold_rejections = run_filters(context(cold, strategy))
                assert warm_passing == cold_passing
                assert list(warm_rejections.items()) == list(cold_rejections.items())
                assert schedule(warm) == schedule(cold)


def test_a_verdict_that_changes_unit_after_a_patch_takes_its_canonical_place() -> None:
    """Rejections stay ordered by (unit, cluster) through a patch that changes which
    unit turns a cluster down, as a fresh fleet orders them."""
    clusters = [make_cluster(name) for name in ("a", "b", "c")]
    patched = fleet(*clusters)
    units = {"a": "late", "b": "early", "c": "early"}

    def judge(views: Sequence[ClusterView]) -> tuple[list[ClusterView], Rejections]:
        rejections = {v.name: Verdict(Code.UNSCHEDULABLE, units[v.name], "no") for v in views}
        return [], rejections

    patched.verdicts("k", judge, stands=lambda verdict: False)
    units["a"], units["c"] = "early", "late"
    records = {c.name: c.record() for c in clusters}
    patched.patch(
        {n: r.model_copy(update={"reserved": {"cpu": 1}}) for n, r in records.items() if r}
    )
    _, rejections = patched.verdicts("k", judge, stands=lambda verdict: False)
    assert [(name, v.unit) for name, v in rejections.items()] == [
        ("a", "early"),
        ("b", "early"),
        ("c", "late"),
    ]


def test_memos_filled_together_and_read_after_different_patches_see_every_patch() -> None:
    """Two memos filled by the same decisions, the first read again between two
    patches and the second only after both: the second sees both patches."""
    clusters = [make_cluster(name).with_room(1, cpu="4") for name in ("a", "b")]
    patched = fleet(*clusters)
    pod = make_pod().with_requests(cpu="1")
    deployment = make_deployment(replicas=2).with_requests(cpu="500m")
    for obj in (pod, deployment):
        schedule(make_input(obj, patched))
    records = {c.name: c.record() for c in clusters}
    for name in ("a", "b"):
        base = records[name]
        assert base is not None
        records[name] = base.model_copy(update={"reserved": {"cpu": 4000}})
        patched.patch({name: records[name]})
        schedule(make_input(pod, patched))  # only the pod's memos catch up
    snapshot = capacity.Snapshot(
        clusters={n: r for n, r in records.items() if r is not None}, taken_at=NOW.timestamp()
    )
    fresh = Fleet([c.build() for c in clusters], snapshot)
    warm = schedule(make_input(deployment, patched))
    assert not warm.active
    assert warm == schedule(make_input(deployment, fresh))


@settings(max_examples=40, deadline=None)
@given(
    policy=policies(),
    held=st.lists(st.tuples(st.sampled_from(["a", "b", 'q"x']), st.integers(0, 5)), max_size=3),
    pins=st.dictionaries(
        st.sampled_from(["v1/ConfigMap/default/x", "dep\u00e9"]),
        st.lists(st.sampled_from(["a", "b"]), max_size=2),
        max_size=2,
    ),
    avoid=st.sets(st.sampled_from(["a", "b", "c"]), max_size=2),
)
def test_digest_is_the_hash_of_the_input_parts(
    policy: PolicyBuilder | None,
    held: list[tuple[str, int]],
    pins: dict[str, list[str]],
    avoid: set[str],
) -> None:
    """`SchedulingInput.digest` is sha256 of the input's parts joined by ``\\x1e``:
    the object's facts, the policy's JSON (escaped once per policy), the fleet's
    fingerprint, the previous placement, the pins, ``now`` and the clusters to avoid;
    the object's facts and the lists as their ``repr`` (an empty list as ``()``)."""
    inp = make_input(
        make_deployment(replicas=3).with_requests(cpu="500m"),
        [make_cluster("a"), make_cluster("b")],
        policy=policy,
        previous=placed(*held),
        dependencies=pins,
        avoid=avoid,
    )
    analyzed = inp.analyzed
    metadata = analyzed.object.get("metadata") or {}
    facts = (
        analyzed.ref.key,
        metadata.get("uid"),
        metadata.get("generation"),
        metadata.get("resourceVersion"),
        (metadata.get("annotations") or {}).get(STRATEGY_ANNOTATION),
        analyzed.deleted,
        analyzed.strategy.value,
        analyzed.replicas,
        sorted(analyzed.requests.items()),
        (),
    )
    previous = [(p.cluster, p.replicas, p.state.value) for p in inp.previous]
    pinned = sorted((k, sorted(v)) for k, v in inp.dependency_placements.items())
    parts = [
        repr(facts),
        json.dumps(inp.fleet.policy_text(inp.policy)),
        inp.fleet.fingerprint,
        repr(previous) if previous else "()",
        repr(pinned) if pinned else "()",
        inp.now.isoformat(),
        repr(sorted(inp.avoid_clusters)) if inp.avoid_clusters else "()",
    ]
    expected = hashlib.sha256("\x1e".join(parts).encode()).hexdigest()
    assert inp.digest() == expected
    assert inp.digest() == expected  # the policy's JSON from the memo


AMOUNTS = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "gpu"]), st.integers(-5, 40))


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(
        st.tuples(AMOUNTS, AMOUNTS, st.lists(AMOUNTS, max_size=3)), min_size=1, max_size=6
    ),
    shapes=st.lists(
        st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "gpu"]), st.integers(0, 7)),
        min_size=1,
        max_size=3,
    ),
    patches=st.lists(st.tuples(st.integers(0, 5), AMOUNTS), max_size=4),
)
@example(  # a resource reserved below zero that the record does not offer: no room
    records=[({"cpu": 10, "pods": 10}, {"gpu": -4}, [])],
    shapes=[{"cpu": 1, "gpu": 1}],
    patches=[(0, {"gpu": -2})],
)
def test_fleet_fits_follow_the_fit_rule_through_patches(
    records: list[tuple[dict[str, int], dict[str, int], list[dict[str, int]]]],
    shapes: list[dict[str, int]],
    patches: list[tuple[int, dict[str, int]]],
) -> None:
    """`Fleet.fits` (computed a column at a time, node-level half remembered) is
    ``ClusterCapacity.fit_replicas`` for every cluster with a record, before and
    after patches of the reservations: resources reserved that are not available,
    negative amounts, records without nodes and shapes asking for nothing included."""

    def record(
        name: str, available: dict[str, int], reserved: dict[str, int], nodes: list[dict[str, int]]
    ) -> capacity.ClusterCapacity:
        return capacity.ClusterCapacity(
            cluster=name,
            allocatable=available,
            available=available,
            reserved=reserved,
            nodes=[
                capacity.NodeCapacity(name=f"{name}-{i}", allocatable=free, free=free)
                for i, free in enumerate(nodes)
            ],
            observed_at=NOW.timestamp(),
        )

    built = {f"c{i}": record(f"c{i}", *parts) for i, parts in enumerate(records)}
    patched = Fleet(
        [make_cluster(name).build() for name in built],
        capacity.Snapshot(clusters=built, taken_at=NOW.timestamp()),
    )

    def check() -> None:
        for shape in shapes:
            expected = {name: r.fit_replicas(shape) for name, r in built.items()}
            assert dict(patched.fits(shape)) == expected

    check()
    for index, reserved in patches:
        name = f"c{index}"
        if name in built:
            built[name] = built[name].model_copy(update={"reserved": reserved})
            patched.patch({name: built[name]})
            check()


def test_a_patch_replaces_records_and_keeps_the_views() -> None:
    """Views hold no capacity: a patch replaces the cluster's record in
    `Fleet.records` and leaves every view (and the tuple of them) as it was, so no
    memo holding views goes stale."""
    built = fleet(make_cluster("a").with_labels(region="eu").with_room(cpu="2").with_taint("gpu"))
    views, view = built.views, built.by_name["a"]
    record = make_cluster("a").with_room(cpu="1").record()
    built.patch({"a": record})
    assert built.views is views and built.by_name["a"] is view
    assert built.records["a"] is record and built.get("a") is record
    built.patch({"a": None})
    assert "a" not in built.records and built.views is views


@given(st.lists(st.dictionaries(st.text(max_size=6), st.integers(), max_size=5), max_size=4))
def test_reserved_totals_are_hashed_as_their_sorted_repr(totals: list[dict[str, int]]) -> None:
    """A fingerprint part hashes ``repr(sorted(reserved.items()))``, made from a
    template per set of names: the same text for any names (quotes, ``%``) and any
    order they come in, the template reused."""
    for reserved in totals + [dict(reversed(t.items())) for t in totals]:
        assert _reserved_text(reserved) == repr(sorted(reserved.items()))
