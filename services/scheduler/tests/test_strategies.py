"""Table and property tests for selection and the strategies (split above all)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.scheduler import core, scores, strategies
from flotilla.scheduler.model import (
    ClusterView,
    Code,
    Context,
    Rejections,
    SchedulingInput,
    Verdict,
)

from .builders import (
    ClusterBuilder,
    ObjectBuilder,
    PolicyBuilder,
    make_cluster,
    make_configmap,
    make_daemonset,
    make_deployment,
    make_input,
    make_pod,
    make_policy,
    make_workload,
    placed,
    three_equal,
)


def assign(inp: SchedulingInput) -> strategies.Assignment:
    """filter → score → the strategy, without the core's bookkeeping."""
    strategy = core.effective_strategy(inp)
    ctx = core.context(inp, strategy)
    candidates, _ = core.run_filters(ctx)
    return strategies.STRATEGIES[strategy.value](ctx, scores.rank(ctx, candidates))


def shares(assignment: strategies.Assignment) -> dict[str, int | None]:
    return dict(assignment.placements)


# --- apportion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "weights", "caps", "start", "expected"),
    [
        (10, [1, 1, 1], [99, 99, 99], [0, 0, 0], [4, 3, 3]),
        (7, [3, 2, 1], [99, 99, 99], [0, 0, 0], [4, 2, 1]),
        (10, [1, 1], [3, 99], [0, 0], [3, 7]),
        (10, [1, 1], [3, 4], [0, 0], [3, 4]),
        (11, [1, 1, 1], [99, 99, 99], [4, 3, 3], [4, 4, 3]),
        (12, [1, 1, 1], [99, 99, 99], [9, 0, 0], [9, 2, 1]),
        (6, [1, 1, 1], [99, 99, 99], [4, 3, 3], [2, 2, 2]),
        (3, [1, 1, 1], [99, 99, 99], [0, 5, 0], [0, 3, 0]),
        (5, [0, 1], [99, 99], [0, 0], [0, 5]),
        (0, [1, 1], [99, 99], [2, 1], [0, 0]),
        (2, [5, 2], [99, 99], [0, 0], [1, 1]),
    ],
    ids=[
        "10 over three equal is 4/3/3, first-ranked gets the remainder",
        "weights 3:2:1",
        "a full cluster overflows to the other",
        "caps leave replicas unplaced",
        "scale up adds to the least loaded",
        "scale up never takes from a cluster above its share",
        "scale down takes from the most loaded",
        "scale down removes only where replicas are",
        "zero weight gets nothing",
        "scale to zero",
        "Sainte-Laguë, not D'Hondt: 5:2 for 2 seats is 1/1",
    ],
)
def test_apportion(
    total: int, weights: list[int], caps: list[int], start: list[int], expected: list[int]
) -> None:
    assert strategies.apportion(total, weights, caps, start) == expected


def one_at_a_time(total: int, weights: list[int], caps: list[int], start: list[int]) -> list[int]:
    """Sainte-Laguë by definition: the next seat to the best quotient, one by one."""
    counts = list(start)
    while sum(counts) < total:
        open_ = [i for i in range(len(counts)) if counts[i] < caps[i] and weights[i] > 0]
        if not open_:
            break
        best = max(open_, key=lambda i: (weights[i] / (counts[i] + 0.5), -i))
        counts[best] += 1
    while sum(counts) > total:
        held = [i for i in range(len(counts)) if counts[i] > 0]
        worst = min(held, key=lambda i: (weights[i] / (counts[i] - 0.5), -i))
        counts[worst] -= 1
    return counts


@st.composite
def apportionments(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int]]:
    n = draw(st.integers(min_value=1, max_value=8))
    weights = draw(st.lists(st.sampled_from([0, 1, 2, 3, 7, 100, 4999]), min_size=n, max_size=n))
    caps = draw(st.lists(st.sampled_from([0, 3, 40, 300, 2000]), min_size=n, max_size=n))
    start = [draw(st.integers(min_value=0, max_value=cap)) for cap in caps]
    total = draw(st.integers(min_value=0, max_value=6000))
    return total, weights, caps, start


@settings(max_examples=150, deadline=None)
@given(apportionments())
def test_apportion_in_bulk_equals_one_seat_at_a_time(
    case: tuple[int, list[int], list[int], list[int]],
) -> None:
    assert strategies.apportion(*case) == one_at_a_time(*case)


@st.composite
def few_seats(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int]]:
    """Many clusters, a few seats to hand out (`apportion`'s `_first_in_line` path):
    weights often equal, some clusters full or without a weight."""
    n = draw(st.integers(min_value=1, max_value=40))
    weights = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 100]), min_size=n, max_size=n))
    caps = draw(st.lists(st.sampled_from([0, 1, 2, 3, 40]), min_size=n, max_size=n))
    start = [draw(st.integers(min_value=0, max_value=min(cap, 2))) for cap in caps]
    total = sum(start) + draw(st.integers(min_value=1, max_value=strategies.BULK_AFTER))
    return total, weights, caps, start


@settings(max_examples=300, deadline=None)
@given(few_seats())
def test_apportion_of_a_few_seats_equals_one_seat_at_a_time(
    case: tuple[int, list[int], list[int], list[int]],
) -> None:
    assert strategies.apportion(*case) == one_at_a_time(*case)


def test_apportion_of_an_absurd_count_is_immediate() -> None:
    """10,000,000 replicas over 1,000 clusters: O(clusters), not O(replicas)."""
    weights = list(range(1, 1001))
    counts = strategies.apportion(10_000_000, weights, [2**31 - 1] * 1000, [0] * 1000)
    assert sum(counts) == 10_000_000
    assert counts == sorted(counts)  # more weight, more seats
    full = strategies.apportion(10_000_000, weights, [1100] * 1000, [0] * 1000)
    assert full == [1100] * 1000


# --- select: maxClusters and spread -----------------------------------------------------


def regions(*spec: tuple[str, str]) -> list[ClusterBuilder]:
    return [make_cluster(name).with_labels(region=region) for name, region in spec]


FLEET = regions(("eu-1", "eu"), ("eu-2", "eu"), ("us-1", "us"), ("us-2", "us"), ("ap-1", "ap"))


@dataclass
class SelectCase:
    id: str
    policy: PolicyBuilder
    chosen: int | None = None
    """How many clusters end up placed (None: unschedulable)."""
    min_regions: int = 1
    max_regions: int | None = None
    problem: str = ""
    rejected_by: dict[str, int] = field(default_factory=dict)
    """Unit → how many clusters it left out."""


SELECT_CASES = [
    SelectCase("no limits places everywhere", make_policy(), chosen=5, min_regions=3),
    SelectCase(
        "maxClusters keeps the best N",
        make_policy().max_clusters(2),
        chosen=2,
        rejected_by={"max-clusters": 3},
    ),
    SelectCase(
        "spread minGroups with maxClusters covers the groups",
        make_policy().max_clusters(3).spread("region", min_groups=3),
        chosen=3,
        min_regions=3,
        rejected_by={"max-clusters": 2},
    ),
    SelectCase(
        "spread maxGroups limits the groups",
        make_policy().spread("region", min_groups=1, max_groups=2),
        chosen=None,
        max_regions=2,
    ),
    SelectCase(
        "minGroups above the groups there are is unschedulable",
        make_policy().spread("region", min_groups=4),
        problem="spread by region needs at least 4 groups; eligible clusters are in 3 (ap, eu, us)",
    ),
    SelectCase(
        "maxClusters below minGroups is unschedulable",
        make_policy().max_clusters(1).spread("region", min_groups=2),
        problem="spread by region needs 2 groups but only 1 cluster may be chosen",
    ),
]


@pytest.mark.parametrize("case", SELECT_CASES, ids=[c.id for c in SELECT_CASES])
def test_select(case: SelectCase) -> None:
    outcome = assign(make_input(make_deployment(replicas=30), FLEET, policy=case.policy))
    if case.problem:
        assert not outcome.schedulable
        assert outcome.placements == []
        assert outcome.reason == case.problem
        return
    placed_on = [name for name, _ in outcome.placements]
    groups = {name.split("-")[0] for name in placed_on}
    if case.chosen is not None:
        assert len(placed_on) == case.chosen
    assert len(groups) >= case.min_regions
    if case.max_regions is not None:
        assert len(groups) <= case.max_regions
        assert all(v.unit == "spread" for v in outcome.rejections.values())
    for unit, count in case.rejected_by.items():
        assert sum(v.unit == unit for v in outcome.rejections.values()) == count


def select_one_by_one(
    ctx: Context, ranked: Sequence[ClusterView], limit: int | None, one: bool
) -> strategies.Selection:
    """`strategies.select` with a spread, as a loop grouping cluster by cluster (what
    it was before it worked on positions with C-level passes)."""
    spread = ctx.spread
    assert spread is not None
    key = spread.label_key
    rejections: Rejections = {}
    groups: dict[str, list[ClusterView]] = {}
    missing = Verdict(Code.UNRESOLVABLE, "spread", f"no {key} label to spread by")
    for cluster in ranked:
        value = cluster.labels.get(key)
        if value is None:
            rejections[cluster.name] = missing
        else:
            groups.setdefault(value, []).append(cluster)
    if len(groups) < spread.min_groups or (limit is not None and limit < spread.min_groups):
        return strategies.Selection([], rejections, "problem")
    names = list(groups)
    used = names[: spread.max_groups] if spread.max_groups is not None else names
    for value in names[len(used) :]:
        verdict = Verdict(
            Code.UNSCHEDULABLE,
            "spread",
            f"group {key}={value} not among the best {spread.max_groups} (maxGroups)",
        )
        for cluster in groups[value]:
            rejections[cluster.name] = verdict
    position = {c.name: i for i, c in enumerate(ranked)}
    leaders = [groups[value][0] for value in used]
    others = sorted(
        (c for value in used for c in groups[value][1:]), key=lambda c: position[c.name]
    )
    order = leaders + others
    if limit is not None and len(order) > limit:
        rejections.update(strategies._left_out(order[limit:], limit, one))
        order = order[:limit]
    order.sort(key=lambda c: position[c.name])
    return strategies.Selection(order, rejections)


@settings(max_examples=150, deadline=None)
@given(
    labels=st.lists(st.sampled_from(["eu", "us", "ap", "", None]), min_size=1, max_size=14),
    min_groups=st.integers(1, 4),
    max_extra=st.one_of(st.none(), st.integers(0, 3)),
    limit=st.one_of(st.none(), st.integers(1, 8)),
    one=st.booleans(),
)
def test_select_with_spread_equals_grouping_one_by_one(
    labels: list[str | None],
    min_groups: int,
    max_extra: int | None,
    limit: int | None,
    one: bool,
) -> None:
    """Same clusters chosen, same rejections in the same order, for any labels (some
    clusters without one, an empty value being a value)."""
    max_groups = None if max_extra is None else min_groups + max_extra
    clusters = []
    for i, label in enumerate(labels):
        cluster = make_cluster(f"c{i:02d}").with_room(i % 5 + 1, cpu="1")
        clusters.append(cluster if label is None else cluster.with_labels(zone=label))
    policy = make_policy().spread("zone", min_groups=min_groups, max_groups=max_groups)
    inp = make_input(make_deployment(replicas=3).with_requests(cpu="1"), clusters, policy=policy)
    ctx = core.context(inp, core.effective_strategy(inp))
    candidates, _ = core.run_filters(ctx)
    ranked = scores.rank(ctx, candidates)
    got = strategies.select(ctx, ranked, limit, one=one)
    want = select_one_by_one(ctx, ranked, limit, one)
    assert [c.name for c in got.chosen] == [c.name for c in want.chosen]
    assert list(got.rejections.items()) == list(want.rejections.items())
    assert bool(got.problem) == bool(want.problem)


def test_spread_rejects_clusters_without_the_label() -> None:
    clusters = [*regions(("eu-1", "eu")), make_cluster("bare")]
    outcome = assign(make_input(make_deployment(), clusters, policy=make_policy().spread("region")))
    assert str(outcome.rejections["bare"]) == "spread: no region label to spread by"
    assert shares(outcome) == {"eu-1": 3}


def test_spread_prefers_the_group_where_the_object_runs() -> None:
    policy = make_policy().spread("region", max_groups=1)
    outcome = assign(
        make_input(make_deployment(replicas=4), FLEET, policy=policy, previous=placed(("us-2", 4)))
    )
    assert shares(outcome) == {"us-2": 4}
    assert {name for name, v in outcome.rejections.items() if v.unit == "spread"} == {
        "eu-1",
        "eu-2",
        "ap-1",
    }


# --- split -------------------------------------------------------------------------


def test_split_by_capacity_follows_room() -> None:
    clusters = [
        make_cluster("big").with_room(1, cpu="3"),
        make_cluster("small").with_room(1, cpu="1"),
    ]
    obj = make_deployment(replicas=8).with_requests(cpu="250m")
    assert shares(assign(make_input(obj, clusters))) == {"big": 6, "small": 2}


def test_split_by_weights() -> None:
    clusters = regions(("eu-1", "eu"), ("us-1", "us"), ("ap-1", "ap"))
    policy = make_policy().weighted(
        ({"region": "eu"}, 2), ({"region": "us"}, 1), ({"region": "ap"}, 0)
    )
    outcome = assign(make_input(make_deployment(replicas=9), clusters, policy=policy))
    assert shares(outcome) == {"eu-1": 6, "us-1": 3}
    assert str(outcome.rejections["ap-1"]) == "weights: its weight is 0"
    assert "by weights" in outcome.reason


def test_split_by_weights_first_rule_wins_and_unmatched_get_nothing() -> None:
    clusters = [make_cluster("a").with_labels(tier="gold", region="eu"), make_cluster("b")]
    policy = make_policy().weighted(({"tier": "gold"}, 3), ({"region": "eu"}, 1))
    outcome = assign(make_input(make_deployment(replicas=3), clusters, policy=policy))
    assert shares(outcome) == {"a": 3}
    assert str(outcome.rejections["b"]) == "weights: no weight rule selects this cluster"


def test_split_places_what_fits_and_reports_the_rest_pending() -> None:
    clusters = [make_cluster("a").with_room(1, cpu="1"), make_cluster("b").with_room(1, cpu="500m")]
    obj = make_deployment(replicas=10).with_requests(cpu="250m")
    outcome = assign(make_input(obj, clusters))
    assert shares(outcome) == {"a": 4, "b": 2}
    assert outcome.pending == 4
    assert outcome.schedulable
    assert outcome.reason.endswith("; 4 of 10 pending: the chosen clusters fit no more")


def test_split_to_zero_keeps_one_empty_copy_where_it_runs() -> None:
    outcome = assign(
        make_input(make_deployment(replicas=0), three_equal(), previous=placed(("us-east", 2)))
    )
    assert outcome.placements == [("us-east", 0)]


def test_split_of_a_multi_component_object_is_whole() -> None:
    obj = make_workload().with_component("a", 2, cpu="1").with_component("b", 1, cpu="1")
    inp = make_input(obj.with_annotation("flotilla.io/strategy", "split"), three_equal())
    assert len(assign(inp).placements) == 1


# --- split properties -----------------------------------------------------------------

room = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=6)


def split_fleet(cpus: Sequence[int]) -> list[ClusterBuilder]:
    """Clusters whose fit for a 1-CPU replica is the given number."""
    return [make_cluster(f"c{i}").with_room(1, cpu=str(cpu)) for i, cpu in enumerate(cpus)]


def split(
    cpus: Sequence[int], replicas: int, previous: Sequence[tuple[str, int]] = (), uid: str = "u"
) -> dict[str, int]:
    obj = make_deployment(replicas=replicas).with_requests(cpu="1").with_uid(uid)
    outcome = assign(make_input(obj, split_fleet(cpus), previous=placed(*previous)))
    result = {name: n for name, n in outcome.placements if n is not None}
    assert all(n > 0 for n in result.values()) or replicas == 0
    return result


@settings(max_examples=60, deadline=None)
@given(
    cpus=room, replicas=st.integers(min_value=1, max_value=40), uid=st.text(min_size=1, max_size=8)
)
def test_split_sums_to_replicas_when_enough_fits_and_respects_fit(
    cpus: list[int], replicas: int, uid: str
) -> None:
    result = split(cpus, replicas, uid=uid)
    fit = {f"c{i}": cpu for i, cpu in enumerate(cpus)}
    assert sum(result.values()) == min(replicas, sum(fit.values()))
    for name, count in result.items():
        assert count <= fit[name]


@settings(max_examples=60, deadline=None)
@given(
    cpus=room,
    replicas=st.integers(min_value=1, max_value=30),
    steps=st.integers(min_value=1, max_value=5),
)
def test_split_is_monotonic_under_scale_up(cpus: list[int], replicas: int, steps: int) -> None:
    fleet_fit = sum(cpus)
    before = split(cpus, replicas)
    for _ in range(steps):
        replicas += 1
        # The replicas already placed are running: the snapshot no longer shows
        # their room as free, exactly as the syncer would report it.
        used = [cpu - before.get(f"c{i}", 0) for i, cpu in enumerate(cpus)]
        after = split(used, replicas, previous=sorted(before.items()))
        for name, count in before.items():
            assert after.get(name, 0) >= count
        assert sum(after.values()) == min(replicas, fleet_fit)
        before = after


@settings(max_examples=40, deadline=None)
@given(
    cpus=room,
    replicas=st.integers(min_value=1, max_value=30),
    drop=st.integers(min_value=1, max_value=10),
)
def test_split_scale_down_only_removes(cpus: list[int], replicas: int, drop: int) -> None:
    before = split(cpus, replicas)
    used = [cpu - before.get(f"c{i}", 0) for i, cpu in enumerate(cpus)]
    smaller = max(replicas - drop, 1)
    after = split(used, smaller, previous=sorted(before.items()))
    for name, count in after.items():
        assert count <= before[name]
    assert sum(after.values()) == min(smaller, sum(before.values()))


@settings(max_examples=40, deadline=None)
@given(cpus=room, replicas=st.integers(min_value=0, max_value=30), uid=st.text(max_size=8))
def test_split_is_deterministic(cpus: list[int], replicas: int, uid: str) -> None:
    obj = make_deployment(replicas=replicas).with_requests(cpu="1").with_uid(uid or "x")
    first = core.schedule(make_input(obj, split_fleet(cpus)))
    again = core.schedule(make_input(obj, list(reversed(split_fleet(cpus)))))
    assert first == again


# --- copy, any, as-needed ---------------------------------------------------------------


def test_copy_goes_to_every_eligible_cluster() -> None:
    clusters = [*three_equal(), make_cluster("cordoned").cordoned()]
    outcome = assign(make_input(make_daemonset(), clusters))
    assert sorted(shares(outcome)) == ["ap-south", "eu-west", "us-east"]
    assert outcome.reason.startswith("copied to 3 clusters: ")


def test_copy_respects_max_clusters() -> None:
    policy = make_policy().strategy("copy").max_clusters(2)
    outcome = assign(make_input(make_deployment(replicas=2), three_equal(), policy=policy))
    assert list(shares(outcome).values()) == [2, 2]


def test_any_goes_to_one_cluster() -> None:
    outcome = assign(make_input(make_pod(), three_equal()))
    assert len(outcome.placements) == 1
    assert outcome.reason.endswith("(best of 3 eligible)")
    assert sum(v.unit == "select" for v in outcome.rejections.values()) == 2


@pytest.mark.parametrize("current", ["ap-south", "eu-west", "us-east"])
def test_any_stays_on_the_current_cluster(current: str) -> None:
    outcome = assign(make_input(make_pod(), three_equal(), previous=placed((current, 1))))
    assert outcome.placements == [(current, 1)]
    assert outcome.reason == f"on {current} (stays where it runs)"


def test_any_leaves_the_current_cluster_when_it_is_no_longer_eligible() -> None:
    clusters = [make_cluster("a"), make_cluster("b")]
    outcome = assign(make_input(make_pod(), clusters, previous=placed(("a", 1)), avoid=["a"]))
    assert outcome.placements == [("b", 1)]


def test_whole_goes_to_the_only_cluster_where_every_component_fits() -> None:
    obj = (
        make_workload()
        .with_component("jobmanager", 1, cpu="2")
        .with_component("taskmanager", 2, cpu="4")
    )
    clusters = [
        make_cluster("a").with_room(4, cpu="3"),
        make_cluster("b").with_room(2, cpu="6"),
        make_cluster("c").with_room(1, cpu="64", pods=2),
    ]
    outcome = assign(make_input(obj, clusters))
    assert outcome.placements == [("b", None)]
    assert "room for 1 whole set" in outcome.reason


def test_as_needed_places_nothing() -> None:
    outcome = assign(make_input(make_configmap(), three_equal()))
    assert outcome.placements == []
    assert outcome.reason.startswith("as-needed")


def test_every_strategy_is_registered() -> None:
    assert set(strategies.STRATEGIES) == {"split", "copy", "any", "as-needed"}


@pytest.mark.parametrize(
    "obj",
    [make_deployment(replicas=5).with_requests(), make_deployment(replicas=5)],
    ids=["no requests: equal weights", "requests on equal clusters: equal weights"],
)
def test_split_over_equal_clusters_is_even(obj: ObjectBuilder) -> None:
    outcome = assign(make_input(obj, three_equal()))
    assert sorted(n or 0 for _, n in outcome.placements) == [1, 2, 2]
