"""Which objects a change can affect, the index that answers it, and record keys."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flotilla.common import api
from flotilla.common.api import STRATEGY_ANNOTATION, PlacementState, Strategy
from flotilla.common.events import ClusterPlacement, PlacementDecided, ResourceAnalyzed
from flotilla.scheduler import records, state
from flotilla.scheduler.records import PlacementRecord

from .builders import (
    NOW,
    ClusterBuilder,
    ObjectBuilder,
    make_cluster,
    make_configmap,
    make_daemonset,
    make_deployment,
    make_pod,
    make_policy,
    make_pvc,
)


def base() -> ClusterBuilder:
    return (
        make_cluster("c1").with_labels(region="eu", tier="gold").serving(("apps/v1", "Deployment"))
    )


CASES: list[tuple[str, ClusterBuilder | None, ClusterBuilder | None, state.Impact]] = [
    ("cordon affects nothing", base(), base().cordoned(), state.Impact()),
    ("uncordon opens", base().cordoned(), base(), state.Impact(opened=True)),
    # Draining is the drain coordinator's call; it asks with avoid_clusters.
    ("evictAfter set affects nothing", base(), base().draining(), state.Impact()),
    (
        "evictAfter moved affects nothing",
        base().draining(NOW),
        base().draining(NOW + timedelta(hours=1)),
        state.Impact(),
    ),
    ("evictAfter cleared affects nothing", base().draining(), base(), state.Impact()),
    ("not ready affects placed", base(), base().not_ready(), state.Impact(placed=True)),
    ("ready again opens", base().not_ready(), base(), state.Impact(opened=True)),
    ("taint added affects placed", base(), base().with_taint("gpu"), state.Impact(placed=True)),
    ("taint removed opens", base().with_taint("gpu"), base(), state.Impact(opened=True)),
    (
        "label changed",
        base(),
        base().with_labels(region="us"),
        state.Impact(labels=frozenset({"region"})),
    ),
    (
        "label added",
        base(),
        base().with_labels(gpu="v100"),
        state.Impact(labels=frozenset({"gpu"})),
    ),
    ("status only", base(), base().with_placements(12), state.Impact()),
    ("deleted affects placed", base(), None, state.Impact(placed=True)),
    (
        "new cluster opens and names its labels",
        None,
        base(),
        state.Impact(opened=True, labels=frozenset({"region", "tier"})),
    ),
    (
        "API removed affects placed",
        base().serving(("v1", "Pod")),
        base(),
        state.Impact(placed=True),
    ),
    ("API added opens", base(), base().serving(("v1", "Pod")), state.Impact(opened=True)),
]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_impact_of_a_cluster_change(
    old: ClusterBuilder | None, new: ClusterBuilder | None, expected: state.Impact
) -> None:
    before = old.build() if old else None
    after = new.build() if new else None
    assert state.impact(before, after) == expected


@pytest.mark.parametrize(
    ("old", "new", "worth_writing"),
    [
        (case[1], case[2], case[0] != "status only" and "evictAfter" not in case[0])
        for case in CASES
    ],
    ids=[case[0] for case in CASES],
)
def test_only_placement_relevant_changes_are_written(
    old: ClusterBuilder | None, new: ClusterBuilder | None, worth_writing: bool
) -> None:
    """Heartbeats and figures change all the time; writing them would churn every replica."""
    before = old.build() if old else None
    after = new.build() if new else None
    assert state.relevant(before, after) is worth_writing


def placed(
    analyzed: ResourceAnalyzed,
    *clusters: str,
    schedulable: bool = True,
    pending: int = 0,
    retiring: tuple[str, ...] = (),
) -> PlacementRecord:
    entries = [ClusterPlacement(cluster=c, replicas=1) for c in clusters]
    entries += [
        ClusterPlacement(cluster=c, replicas=1, state=PlacementState.RETIRING) for c in retiring
    ]
    return PlacementRecord(
        key=analyzed.ref.key,
        analyzed=analyzed,
        decided=PlacementDecided(ref=analyzed.ref, decision_id="d", clusters=entries),
        schedulable=schedulable,
        pending=pending,
    )


def test_index_answers_each_kind_of_change() -> None:
    index = state.Index()
    web = make_deployment("web").governed_by(make_policy().selecting(region="eu")).build()
    api_ = make_deployment("api").governed_by(make_policy().spread("zone", 2)).build()
    stuck = make_deployment("stuck").build()
    agent = make_daemonset("agent").build()
    index.apply(web.ref.key, placed(web, "c1"), 1)
    index.apply(api_.ref.key, placed(api_, "c2", retiring=("c1",)), 2)
    index.apply(stuck.ref.key, placed(stuck, schedulable=False), 3)
    index.apply(agent.ref.key, placed(agent, "c1", "c2"), 4)

    assert index.placed_on("c1") == {web.ref.key, api_.ref.key, agent.ref.key}
    assert index.waiting() == {stuck.ref.key}
    assert index.copies() == {agent.ref.key}
    assert index.selecting({"region"}) == {web.ref.key}
    assert index.selecting({"zone", "tier"}) == {api_.ref.key}
    assert state.affected(index, "c1", state.Impact()) == set()
    assert state.affected(index, "c2", state.Impact(placed=True)) == {api_.ref.key, agent.ref.key}
    assert state.affected(index, "c9", state.Impact(opened=True)) == {
        stuck.ref.key,
        agent.ref.key,
    }


def test_index_ignores_older_news_and_forgets_deleted_objects() -> None:
    index = state.Index()
    web = make_deployment("web").build()
    assert index.apply(web.ref.key, placed(web, "c1"), 5)
    assert not index.apply(web.ref.key, placed(web, "c2"), 4)
    assert index.placed_on("c1") == {web.ref.key}
    assert index.apply(web.ref.key, placed(web, "c2"), 6)
    assert index.placed_on("c1") == set()
    assert index.placed_on("c2") == {web.ref.key}
    assert index.apply(web.ref.key, None, 7)
    assert index.placed_on("c2") == set()
    assert index.get(web.ref.key) is None


def test_a_partly_placed_split_is_pending() -> None:
    index = state.Index()
    web = make_deployment("web").build()
    index.apply(web.ref.key, placed(web, "c1", pending=2), 1)
    assert index.waiting() == {web.ref.key}


def test_dependency_placements_pin_to_active_clusters_and_as_needed_pins_nothing() -> None:
    index = state.Index()
    pvc = make_pvc("data").build()
    settings = make_configmap("settings").build()
    pod = make_pod("p").depending_on("v1", "PersistentVolumeClaim", "data").build()
    index.apply(pvc.ref.key, placed(pvc, "b", retiring=("a",)), 1)
    index.apply(settings.ref.key, placed(settings), 2)
    index.apply(pod.ref.key, placed(pod, "b"), 3)
    assert index.dependency_placements([pvc.ref.key, settings.ref.key, "v1/X/_/nope"]) == {
        pvc.ref.key: ["b"],
        settings.ref.key: [],
    }
    assert index.dependents(pvc.ref.key) == {pod.ref.key}


def test_clusters_view_keeps_the_newest() -> None:
    view = state.Clusters()
    one = records.ClusterRecord(name="c1", revision=3, cluster=make_cluster("c1").build())
    view.apply("c1", one, 10)
    assert not view.apply("c1", records.ClusterRecord(name="c1", cluster=None), 9)
    assert [c.metadata.name for c in view.live()] == ["c1"]
    view.apply("c1", records.ClusterRecord(name="c1", cluster=None), 11)
    assert view.live() == []
    assert view.version == 11


def pending_on(
    rejection: str | None, requests: dict[str, int], *, grouped: bool = True
) -> PlacementRecord:
    """A Pending split object whose last decision turned cluster c1 down with `rejection`
    (grouped by reason, as sent now, or per cluster, as older decisions were)."""
    analyzed = make_deployment("p", replicas=2).build().model_copy(update={"requests": requests})
    if grouped:
        rejected = {rejection: ["c0", "c1"]} if rejection else {}
        decided = PlacementDecided(
            ref=analyzed.ref, decision_id="d", clusters=[], rejected=rejected
        )
    else:
        rejections = {"c1": [rejection]} if rejection else {}
        decided = PlacementDecided(
            ref=analyzed.ref, decision_id="d", clusters=[], rejections=rejections
        )
    return PlacementRecord(
        key=analyzed.ref.key, analyzed=analyzed, decided=decided, schedulable=False, pending=2
    )


HELPED_CASES = [
    ("no record seen, one fits now", "capacity: no capacity record in the snapshot yet", {}, True),
    ("too small before, fits now", "capacity: fits 0 of 2 replicas", {"cpu": 1000}, True),
    ("not rejected at all, fits", None, {"cpu": 1000}, True),
    ("does not fit", "capacity: fits 0 of 2 replicas", {"cpu": 64000}, False),
    ("tainted: room cannot help", "taints: taint x:NoSchedule is not tolerated", {}, False),
    ("no pod slot left", None, {"pods": 0}, False),
]


@pytest.mark.parametrize("grouped", [True, False], ids=["by-reason", "per-cluster"])
@pytest.mark.parametrize(
    ("rejection", "requests", "helped"),
    [case[1:] for case in HELPED_CASES],
    ids=[case[0] for case in HELPED_CASES],
)
def test_a_capacity_record_helps_pending_objects_it_could_place(
    rejection: str | None, requests: dict[str, int], helped: bool, grouped: bool
) -> None:
    room = make_cluster("c1").with_room(1, cpu="4", memory="8Gi").record()
    assert room is not None
    if requests.get("pods") == 0:
        room = room.model_copy(update={"available": {**room.available, "pods": 0}})
        requests = {}
    record = pending_on(rejection, requests, grouped=grouped)
    assert state.helped_by(record, "c1", room) is helped


@pytest.mark.parametrize(
    ("obj", "copies"),
    [
        pytest.param(make_daemonset("agent").detected_as(Strategy.COPY), True, id="type-default"),
        pytest.param(
            make_deployment("web")
            .governed_by(make_policy().strategy("copy"))
            .detected_as(Strategy.COPY),
            True,
            id="policy-copy",
        ),
        pytest.param(
            make_deployment("web")
            .with_annotation(STRATEGY_ANNOTATION, "any")
            .governed_by(make_policy().strategy("copy"))
            .detected_as(Strategy.ANY),
            False,
            id="annotation-any-over-policy-copy",
        ),
        pytest.param(
            make_daemonset("agent")
            .with_annotation(STRATEGY_ANNOTATION, "split")
            .detected_as(Strategy.SPLIT),
            False,
            id="annotation-split-over-type-copy",
        ),
    ],
)
def test_the_index_counts_copies_by_the_effective_strategy(
    obj: ObjectBuilder, copies: bool
) -> None:
    index = state.Index()
    analyzed = obj.build()
    index.apply(analyzed.ref.key, placed(analyzed, "c1"), 1)
    assert (index.copies() == {analyzed.ref.key}) is copies


def test_label_keys_of_a_policy() -> None:
    assert state.label_keys(None) == frozenset()
    assert state.label_keys(
        api.PlacementPolicySpec.model_validate(
            make_policy().weighted(({"gpu": "a"}, 2)).selecting(region="eu").spec
        )
    ) == frozenset({"gpu", "region"})


def test_index_remembers_when_an_object_was_deleted_and_forgets_it_whole() -> None:
    now = [100.0]
    index = state.Index(clock=lambda: now[0])
    empty = index.footprint()
    web = make_deployment("web").governed_by(make_policy().selecting(region="eu")).build()
    pod = make_pod("p").depending_on("v1", "PersistentVolumeClaim", "data").build()
    index.apply(web.ref.key, placed(web, "c1"), 1)
    index.apply(pod.ref.key, placed(pod, "c2", pending=1), 2)
    gone = placed(web).model_copy(
        update={
            "decided": PlacementDecided(ref=web.ref, decision_id="x", clusters=[], deleted=True)
        }
    )
    index.apply(web.ref.key, gone, 3)
    now[0] = 200.0
    index.apply(web.ref.key, gone, 4)  # seen again: still deleted since 100
    assert index.deleted_before(150.0) == [web.ref.key]
    assert index.deleted_before(50.0) == []
    assert index.get(web.ref.key) is not None  # kept: late events are judged by it
    index.apply(web.ref.key, None, 5)
    index.apply(pod.ref.key, None, 6)
    assert index.deleted_before(1e9) == []
    assert index.footprint() == empty, "a reverse map kept an empty entry"
    assert index.dependents("v1/PersistentVolumeClaim/default/data") == set()


def test_clusters_view_remembers_removed_clusters_until_forgotten() -> None:
    view = state.Clusters(clock=lambda: 10.0)
    view.apply("c1", records.ClusterRecord(name="c1", cluster=make_cluster("c1").build()), 1)
    assert view.removed_before(20.0) == []
    view.apply("c1", records.ClusterRecord(name="c1", cluster=None), 2)
    assert view.removed_before(20.0) == ["c1"]
    view.apply("c1", None, 3)
    assert view.removed_before(20.0) == [] and view.get("c1") is None
    assert view.version == 3


def test_equal_policies_are_interned_to_one_object_within_a_bound() -> None:
    interned = state.Interned[api.PlacementPolicySpec](limit=2)
    first = make_policy().selecting(region="eu").build()
    again = make_policy().selecting(region="eu").build()
    other = make_policy().selecting(region="us").build()
    assert again is not first
    assert interned.intern(first) is first
    assert interned.intern(again) is first
    assert interned.intern(other) is other
    interned.intern(make_policy().selecting(region="ap").build())  # pushes out the oldest
    assert interned.intern(again) is again
