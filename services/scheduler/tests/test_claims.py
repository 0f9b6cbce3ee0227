"""`claims.plan`: what a decision reserves and releases, and its change per cluster."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.common import capacity
from flotilla.common.api import PlacementState
from flotilla.common.events import ClusterPlacement
from flotilla.scheduler import claims

from .builders import make_deployment

CLUSTERS = ["a", "b", "c", "d"]

placements = st.lists(
    st.tuples(
        st.sampled_from(CLUSTERS),
        st.integers(0, 4),
        st.sampled_from([PlacementState.ACTIVE, PlacementState.ACTIVE, PlacementState.RETIRING]),
    ),
    max_size=4,
    unique_by=lambda entry: entry[0],
)


def _entries(drawn: list[tuple[str, int, PlacementState]]) -> list[ClusterPlacement]:
    return [ClusterPlacement(cluster=c, replicas=n, state=s) for c, n, s in drawn]


@settings(max_examples=80, deadline=None)
@given(
    previous=placements,
    chosen=placements,
    cpu=st.integers(0, 3),
    components=st.integers(0, 2),
)
def test_delta_is_what_the_claims_add_less_what_was_held(
    previous: list[tuple[str, int, PlacementState]],
    chosen: list[tuple[str, int, PlacementState]],
    cpu: int,
    components: int,
) -> None:
    """Each touched cluster's reserved totals change by its claims' pods less what the
    object held there (pod slots included, zeros left out), whatever shortcut the
    plan takes for the usual one-claim cluster; no two clusters share a delta."""
    obj = make_deployment(replicas=3).with_requests(cpu=cpu)
    for i in range(components):
        obj.with_component(f"part{i}", replicas=i + 1, cpu=1)
    analyzed = obj.build()
    plan = claims.plan("default/web", analyzed, _entries(previous), _entries(chosen))

    def held(of: tuple[capacity.Claim, ...], cluster: str) -> dict[str, int]:
        return capacity.add(
            *(
                capacity.scale(capacity.pod_shape(c.per_replica), c.replicas)
                for c in of
                if c.cluster == cluster
            )
        )

    touched = {c.cluster for c in plan.claims} | {c for c, _ in plan.releases}
    assert set(plan.delta) == touched
    for cluster in touched:
        new, old = held(plan.claims, cluster), held(plan.undo_claims, cluster)
        change = {r: new.get(r, 0) - old.get(r, 0) for r in new.keys() | old.keys()}
        assert plan.delta[cluster] == {r: n for r, n in change.items() if n}
    assert len({id(d) for d in plan.delta.values()}) == len(plan.delta)
