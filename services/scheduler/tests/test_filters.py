"""Table tests for every filter: which clusters it rejects, with which code and reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from flotilla.common.api import Taint, TaintEffect, Toleration, TolerationOperator
from flotilla.common.events import ClusterPlacement
from flotilla.scheduler import core, filters, scores, strategies
from flotilla.scheduler.model import Code, Registry

from .builders import (
    NOW,
    ClusterBuilder,
    ObjectBuilder,
    PolicyBuilder,
    make_cluster,
    make_deployment,
    make_input,
    make_pod,
    make_policy,
    make_workload,
    placed,
)


@dataclass
class Case:
    id: str
    clusters: list[ClusterBuilder]
    expected: dict[str, str]
    """Rejected cluster → a fragment of its reason; clusters absent here must pass."""
    obj: ObjectBuilder = field(default_factory=make_deployment)
    policy: PolicyBuilder | None = None
    previous: tuple[ClusterPlacement, ...] = ()
    dependencies: dict[str, list[str]] = field(default_factory=dict)
    avoid: tuple[str, ...] = ()
    code: Code = Code.UNSCHEDULABLE


def run(unit: str, case: Case) -> dict[str, str]:
    inp = make_input(
        case.obj,
        case.clusters,
        policy=case.policy,
        previous=case.previous,
        dependencies=case.dependencies,
        avoid=case.avoid,
    )
    ctx = core.context(inp, core.effective_strategy(inp))
    rejected = filters.FILTERS[unit](ctx, inp.fleet.views)
    for verdict in rejected.values():
        assert verdict.unit == unit
        assert verdict.code is case.code
        assert "\n" not in verdict.reason
    return {name: verdict.reason for name, verdict in rejected.items()}


def check(unit: str, case: Case) -> None:
    got = run(unit, case)
    assert set(got) == set(case.expected), got
    for name, fragment in case.expected.items():
        assert fragment in got[name]


def ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]


SELECTOR_CASES = [
    Case(
        "no selector passes all", [make_cluster("a"), make_cluster("b")], {}, code=Code.UNRESOLVABLE
    ),
    Case(
        "matchLabels keeps matching clusters",
        [make_cluster("a").with_labels(region="eu"), make_cluster("b").with_labels(region="us")],
        {"b": "clusterSelector"},
        policy=make_policy().selecting(region="eu"),
        code=Code.UNRESOLVABLE,
    ),
    Case(
        "NotIn keeps clusters without the label",
        [make_cluster("a").with_labels(env="prod"), make_cluster("b")],
        {"a": "clusterSelector"},
        policy=make_policy().selecting_expression("env", "NotIn", "prod"),
        code=Code.UNRESOLVABLE,
    ),
    Case(
        "existing placement is rejected too when the policy changes",
        [make_cluster("a").with_labels(region="us")],
        {"a": "clusterSelector"},
        policy=make_policy().selecting(region="eu"),
        previous=placed(("a", 3)),
        code=Code.UNRESOLVABLE,
    ),
]


@pytest.mark.parametrize("case", SELECTOR_CASES, ids=ids(SELECTOR_CASES))
def test_cluster_selector(case: Case) -> None:
    check("cluster-selector", case)


NAMES_CASES = [
    Case("no clusterNames passes all", [make_cluster("a")], {}, code=Code.UNRESOLVABLE),
    Case(
        "only listed names pass",
        [make_cluster("a"), make_cluster("b"), make_cluster("c")],
        {"b": "clusterNames"},
        policy=make_policy().names("a", "c"),
        code=Code.UNRESOLVABLE,
    ),
]


@pytest.mark.parametrize("case", NAMES_CASES, ids=ids(NAMES_CASES))
def test_cluster_names(case: Case) -> None:
    check("cluster-names", case)


TAINT_CASES = [
    Case("untainted passes", [make_cluster("a")], {}),
    Case(
        "NoSchedule not tolerated rejects new",
        [make_cluster("a").with_taint("dedicated", "batch")],
        {"a": "taint dedicated=batch:NoSchedule is not tolerated"},
    ),
    Case(
        "NoSchedule not tolerated keeps existing",
        [make_cluster("a").with_taint("dedicated", "batch")],
        {},
        previous=placed(("a", 2)),
    ),
    Case(
        "NoSchedule tolerated by key and value",
        [make_cluster("a").with_taint("dedicated", "batch")],
        {},
        policy=make_policy().tolerating("dedicated", "batch", effect="NoSchedule"),
    ),
    Case(
        "wrong value is not tolerated",
        [make_cluster("a").with_taint("dedicated", "batch")],
        {"a": "not tolerated"},
        policy=make_policy().tolerating("dedicated", "web"),
    ),
    Case(
        "Exists with empty key tolerates everything",
        [make_cluster("a").with_taint("x").with_taint("y", effect="NoExecute")],
        {},
        policy=make_policy().tolerating(),
    ),
    Case(
        "toleration for another effect does not match",
        [make_cluster("a").with_taint("gpu", effect="NoExecute")],
        {"a": "gpu:NoExecute is not tolerated"},
        policy=make_policy().tolerating("gpu", effect="NoSchedule"),
    ),
    Case(
        "NoExecute not tolerated rejects existing",
        [make_cluster("a").with_taint("gpu", effect="NoExecute")],
        {"a": "gpu:NoExecute is not tolerated"},
        previous=placed(("a", 2)),
    ),
    Case(
        "NoExecute tolerated forever accepts new",
        [make_cluster("a").with_taint("gpu", effect="NoExecute")],
        {},
        policy=make_policy().tolerating("gpu", effect="NoExecute"),
    ),
    Case(
        "NoExecute tolerated for a while rejects new",
        [make_cluster("a").with_taint("gpu", effect="NoExecute", added=NOW)],
        {"a": "tolerated for only 60s"},
        policy=make_policy().tolerating("gpu", effect="NoExecute", seconds=60),
    ),
    Case(
        "NoExecute tolerated for a while keeps existing inside the window",
        [
            make_cluster("a").with_taint(
                "gpu", effect="NoExecute", added=NOW - timedelta(seconds=30)
            )
        ],
        {},
        policy=make_policy().tolerating("gpu", effect="NoExecute", seconds=60),
        previous=placed(("a", 1)),
    ),
    Case(
        "NoExecute window over rejects existing",
        [
            make_cluster("a").with_taint(
                "gpu", effect="NoExecute", added=NOW - timedelta(seconds=90)
            )
        ],
        {"a": "tolerated for 60s and has been there 90s"},
        policy=make_policy().tolerating("gpu", effect="NoExecute", seconds=60),
        previous=placed(("a", 1)),
    ),
    Case(
        "smallest tolerationSeconds wins",
        [
            make_cluster("a").with_taint(
                "gpu", effect="NoExecute", added=NOW - timedelta(seconds=90)
            )
        ],
        {"a": "tolerated for 60s"},
        policy=make_policy()
        .tolerating("gpu", effect="NoExecute", seconds=600)
        .tolerating(effect="NoExecute", seconds=60),
        previous=placed(("a", 1)),
    ),
    Case(
        "NoExecute without timeAdded keeps existing",
        [make_cluster("a").with_taint("gpu", effect="NoExecute")],
        {},
        policy=make_policy().tolerating("gpu", effect="NoExecute", seconds=1),
        previous=placed(("a", 1)),
    ),
]


@pytest.mark.parametrize("case", TAINT_CASES, ids=ids(TAINT_CASES))
def test_taints(case: Case) -> None:
    check("taints", case)


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (
            Toleration(key="k", value="v"),
            Taint(key="k", value="v", effect=TaintEffect.NO_SCHEDULE),
            True,
        ),
        (
            Toleration(key="k", value="v"),
            Taint(key="k", value="w", effect=TaintEffect.NO_SCHEDULE),
            False,
        ),
        (
            Toleration(key="k", operator=TolerationOperator.EXISTS),
            Taint(key="k", value="w", effect=TaintEffect.NO_EXECUTE),
            True,
        ),
        (
            Toleration(key="j", operator=TolerationOperator.EXISTS),
            Taint(key="k", effect=TaintEffect.NO_EXECUTE),
            False,
        ),
        (
            Toleration(operator=TolerationOperator.EXISTS, effect=TaintEffect.NO_SCHEDULE),
            Taint(key="k", effect=TaintEffect.NO_EXECUTE),
            False,
        ),
    ],
    ids=[
        "equal value",
        "different value",
        "exists any value",
        "exists other key",
        "effect mismatch",
    ],
)
def test_tolerates(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert filters.tolerates(toleration, taint) is expected


CORDON_CASES = [
    Case("uncordoned passes", [make_cluster("a")], {}),
    Case("cordon rejects new", [make_cluster("a").cordoned()], {"a": "cordoned"}),
    Case("cordon keeps existing", [make_cluster("a").cordoned()], {}, previous=placed(("a", 1))),
]


@pytest.mark.parametrize("case", CORDON_CASES, ids=ids(CORDON_CASES))
def test_cordon(case: Case) -> None:
    check("cordon", case)


def test_evict_after_is_not_a_filter() -> None:
    """Draining is the drain coordinator's call (``avoid_clusters``), not a filter."""
    assert "draining" not in filters.FILTERS


READY_CASES = [
    Case("Ready passes", [make_cluster("a")], {}),
    Case(
        "NotReady rejects new",
        [make_cluster("a").not_ready("Lost")],
        {"a": "Ready is False (Lost)"},
    ),
    Case(
        "missing Ready condition rejects new",
        [make_cluster("a").without_ready_condition()],
        {"a": "no Ready condition reported yet"},
    ),
    Case(
        "NotReady keeps existing (failover is the drain coordinator's)",
        [make_cluster("a").not_ready()],
        {},
        previous=placed(("a", 1)),
    ),
]


@pytest.mark.parametrize("case", READY_CASES, ids=ids(READY_CASES))
def test_ready(case: Case) -> None:
    check("ready", case)


API_CASES = [
    Case("unreported API resources pass", [make_cluster("a")], {}),
    Case(
        "served type passes",
        [make_cluster("a").serving(("apps/v1", "Deployment"), ("v1", "Pod"))],
        {},
    ),
    Case(
        "unserved type is rejected even where it runs",
        [
            make_cluster("a").serving(("v1", "Pod")),
            make_cluster("b").serving(("apps/v1", "Deployment")),
        ],
        {"a": "does not serve apps/v1, Kind=Deployment"},
        previous=placed(("a", 1)),
    ),
    Case(
        "other version of the group does not count",
        [make_cluster("a").serving(("flink.apache.org/v1alpha1", "FlinkDeployment"))],
        {"a": "flink.apache.org/v1beta1"},
        obj=make_workload(),
    ),
]


@pytest.mark.parametrize("case", API_CASES, ids=ids(API_CASES))
def test_api_resources(case: Case) -> None:
    check("api-resources", case)


PVC = "v1/PersistentVolumeClaim/default/data"
CM = "v1/ConfigMap/default/settings"
DEPENDENCY_CASES = [
    Case("no dependencies", [make_cluster("a")], {}, obj=make_pod()),
    Case(
        "pinned dependency keeps only its clusters",
        [make_cluster("a"), make_cluster("b")],
        {"a": f"dependency {PVC} is placed on b"},
        obj=make_pod(),
        dependencies={PVC: ["b"]},
    ),
    Case(
        "unpinned (as-needed) dependency does not constrain",
        [make_cluster("a"), make_cluster("b")],
        {},
        obj=make_pod(),
        dependencies={CM: []},
    ),
    Case(
        "every pinned dependency must be there",
        [make_cluster("a"), make_cluster("b"), make_cluster("c")],
        {"a": PVC, "c": CM},
        obj=make_pod(),
        dependencies={PVC: ["b", "c"], CM: ["a", "b"]},
    ),
    Case(
        "existing placement follows its dependency",
        [make_cluster("a"), make_cluster("b")],
        {"a": "placed on b"},
        obj=make_pod(),
        previous=placed(("a", 1)),
        dependencies={PVC: ["b"]},
    ),
]


@pytest.mark.parametrize("case", DEPENDENCY_CASES, ids=ids(DEPENDENCY_CASES))
def test_dependencies(case: Case) -> None:
    check("dependencies", case)


def small(name: str) -> ClusterBuilder:
    return make_cluster(name).with_room(1, cpu="1", memory="4Gi")


CAPACITY_CASES = [
    Case(
        "split needs room for one replica",
        [small("a"), make_cluster("b").with_room(1, cpu="100m", memory="1Gi")],
        {"b": "room for 0 of 1 replica (cpu=500m, memory=1Gi, pods=1)"},
        obj=make_deployment(replicas=10).with_requests(cpu="500m", memory="1Gi", pods=1),
    ),
    Case(
        "node-level fragmentation counts",
        [make_cluster("a").with_nodes({"cpu": "300m", "pods": 10}, {"cpu": "300m", "pods": 10})],
        {"a": "room for 0 of 1"},
        obj=make_deployment(replicas=2).with_requests(cpu="500m"),
    ),
    Case(
        "live reservations count",
        [small("a").with_reserved(cpu="800m")],
        {"a": "room for 0 of 1"},
        obj=make_deployment(replicas=2).with_requests(cpu="500m"),
    ),
    Case(
        "any needs room for every replica",
        [small("a")],
        {"a": "room for 2 of 3 replicas"},
        obj=make_deployment(replicas=3)
        .with_requests(cpu="500m")
        .with_annotation("flotilla.io/strategy", "any"),
    ),
    Case(
        "existing placement is never rejected for capacity",
        [make_cluster("a").with_room(1, cpu="0")],
        {},
        obj=make_deployment(replicas=3).with_requests(cpu="500m"),
        previous=placed(("a", 3)),
    ),
    Case(
        "no capacity record rejects new",
        [make_cluster("a").without_capacity()],
        {"a": "no capacity record"},
    ),
    Case(
        "objects without requests still need a pod slot per replica",
        [
            make_cluster("a").with_room(1, cpu="64", memory="64Gi", pods=2),
            make_cluster("b").with_room(1, cpu="64", memory="64Gi", pods=3),
        ],
        {"a": "room for 2 of 3 replicas (pods=1)"},
        obj=make_deployment().with_requests(),
        policy=make_policy().strategy("any"),
    ),
    Case(
        "objects without requests need a capacity record",
        [make_cluster("a").without_capacity()],
        {"a": "no capacity record"},
        obj=make_deployment().with_requests(),
    ),
    Case(
        "components need one whole set",
        [make_cluster("a").with_room(2, cpu="2"), make_cluster("b").with_room(2, cpu="4")],
        {"a": "room for 0 of 1 whole component set (jm 1x(cpu=1); tm 2x(cpu=3))"},
        obj=make_workload().with_component("jm", 1, cpu="1").with_component("tm", 2, cpu="3"),
    ),
]


@pytest.mark.parametrize("case", CAPACITY_CASES, ids=ids(CAPACITY_CASES))
def test_capacity(case: Case) -> None:
    check("capacity", case)


RESCHEDULE_CASES = [
    Case("nothing to avoid", [make_cluster("a")], {}),
    Case(
        "avoided cluster is left even where it runs",
        [make_cluster("a"), make_cluster("b")],
        {"a": "reschedule request"},
        previous=placed(("a", 1)),
        avoid=("a",),
    ),
]


@pytest.mark.parametrize("case", RESCHEDULE_CASES, ids=ids(RESCHEDULE_CASES))
def test_reschedule(case: Case) -> None:
    check("reschedule", case)


def test_every_filter_has_a_table() -> None:
    tested = {
        "reschedule",
        "cluster-names",
        "cluster-selector",
        "cordon",
        "ready",
        "taints",
        "api-resources",
        "dependencies",
        "capacity",
    }
    assert set(filters.FILTERS) == tested


def test_registering_a_name_twice_is_an_error() -> None:
    registry: Registry[int] = Registry("filter")
    registry.add("cordon", 1)
    with pytest.raises(ValueError, match="filter 'cordon' is already registered"):
        registry.add("cordon", 2)
    with pytest.raises(ValueError, match="already registered"):
        filters.register("taints")(filters.taints)
    with pytest.raises(ValueError, match="score 'stability' is already registered"):
        scores.SCORES.add("stability", scores.SCORES["stability"])
    with pytest.raises(ValueError, match="strategy 'split' is already registered"):
        strategies.STRATEGIES.add("split", strategies.split)
