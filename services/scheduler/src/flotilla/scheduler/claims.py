"""Claims: what one decision reserves and releases in the capacity cache, as one unit.

A decision that changes a placement claims room on every Active cluster whose
replicas changed and releases what it held on the clusters it left. `plan` turns
(previous placement, new placement) into a `Plan`; `Claims.submit` sends the whole
plan as one atomic, all-or-nothing claim (`capacity.CapacityCache.claim`): either
every claim fits and everything is applied, or nothing changes and the clusters
that refused are named. Reservation ids are the object's key (``key#component``
for each component of a multi-component object), so a retried or redelivered
claim replaces itself and never counts twice.

Claims are not held back by the replica's bound on capacity cache calls in flight
(the service's cache slots): the cache coalesces concurrent claims itself
(`flotilla.common.rediscapacity`: one pipeline at a time, on one connection), so a
batch of decisions claims in one round trip however large it is, where a bound
below the batch size split it into two.

`Plan.delta` is what the plan changes in each cluster's reserved totals, so the
read model can apply the replica's own claims locally instead of re-reading them.
`Claims.undo` puts back what a plan changed when the record it was for lost its
compare-and-set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flotilla.common import capacity
from flotilla.common.api import PlacementState
from flotilla.common.capacity import CapacityCache, Claim, Requests
from flotilla.common.events import ClusterPlacement, ResourceAnalyzed


@dataclass(frozen=True, slots=True)
class Plan:
    """One decision's reservations: claims and releases, and how to undo them."""

    claims: tuple[Claim, ...] = ()
    releases: tuple[tuple[str, str], ...] = ()
    """(cluster, reservation id) held on clusters the object left."""
    undo_claims: tuple[Claim, ...] = ()
    undo_releases: tuple[tuple[str, str], ...] = ()
    delta: dict[str, Requests] = field(default_factory=dict)
    """Cluster → change of its reserved totals once the plan is applied."""

    @property
    def clusters(self) -> set[str]:
        return {c.cluster for c in self.claims} | {cluster for cluster, _ in self.releases}

    def __bool__(self) -> bool:
        return bool(self.claims or self.releases)


def shapes(
    key: str,
    analyzed: ResourceAnalyzed,
    placement: ClusterPlacement,
    requests: Requests | None = None,
) -> list[Claim]:
    """The reservations one placement holds.

    A multi-component object reserves each component under its own id: one
    reservation of the summed set would be judged against single nodes, where a
    set that spans nodes never fits. `requests` is ``dict(analyzed.requests)``
    when the caller already made it (every claim of a plan shares it; nothing
    changes a claim's requests).
    """
    cluster = placement.cluster
    if analyzed.components:
        return [
            Claim(cluster, f"{key}#{c.name}", dict(c.requests), c.replicas)
            for c in analyzed.components
            if c.replicas > 0
        ]
    replicas = placement.replicas if placement.replicas is not None else 1
    if replicas <= 0:
        return []
    return [
        Claim(cluster, key, requests if requests is not None else dict(analyzed.requests), replicas)
    ]


def reservation_ids(key: str, analyzed: ResourceAnalyzed) -> list[str]:
    """Every id the object may hold a reservation under on one cluster."""
    return [key] + [f"{key}#{c.name}" for c in analyzed.components]


ACTIVE = PlacementState.ACTIVE
"""(An enum member read through its class costs a descriptor call; plans test it per cluster.)"""


def active(placements: Iterable[ClusterPlacement]) -> dict[str, ClusterPlacement]:
    return {p.cluster: p for p in placements if p.state is ACTIVE}


def _total(claims: Iterable[Claim], known: dict[tuple[int, int], Requests]) -> Requests:
    """What `claims` hold together, pod slots included. `known` remembers the total of
    one claim by (its requests' identity, replicas) for the length of one plan, whose
    claims share their requests: a copy object claims the same on every cluster."""
    total: Requests = {}
    for claim in claims:
        slot = (id(claim.per_replica), claim.replicas)
        one = known.get(slot)
        if one is None:
            one = known[slot] = capacity.scale(
                capacity.pod_shape(claim.per_replica), claim.replicas
            )
        for resource, amount in one.items():
            total[resource] = total.get(resource, 0) + amount
    return total


def _by_cluster(claims: Iterable[Claim]) -> dict[str, list[Claim]]:
    grouped: dict[str, list[Claim]] = {}
    for claim in claims:
        grouped.setdefault(claim.cluster, []).append(claim)
    return grouped


def plan(
    key: str,
    analyzed: ResourceAnalyzed,
    previous: Sequence[ClusterPlacement],
    chosen: Sequence[ClusterPlacement],
    *,
    held_for: ResourceAnalyzed | None = None,
) -> Plan:
    """The reservations that take `key` from `previous` to `chosen`.

    `held_for` is the object as it was when `previous` was claimed (its requests
    then); it defaults to `analyzed`. A cluster whose Active replicas did not change
    is not claimed again: its reservation (or its reported pods) already count.
    """
    before = active(previous)
    was = held_for if held_for is not None else analyzed
    requests = dict(analyzed.requests)
    claims: list[Claim] = []
    # Grouped by cluster as they are made: a copy object claims on every eligible
    # cluster, and scanning every claim per touched cluster made a plan quadratic
    # in the fleet.
    claimed: dict[str, list[Claim]] = {}
    for placement in chosen:
        if placement.state is not ACTIVE:
            continue
        cluster = placement.cluster
        old = before.get(cluster)
        if old is not None and (old.replicas or 0) == (placement.replicas or 0):
            continue
        made = shapes(key, analyzed, placement, requests)
        if made:
            claims += made
            if cluster in claimed:
                claimed[cluster] += made
            else:
                claimed[cluster] = made
    kept = {p.cluster for p in chosen}
    left = list(dict.fromkeys(p.cluster for p in previous if p.cluster not in kept))
    releases = [(cluster, rid) for cluster in left for rid in reservation_ids(key, analyzed)]
    touched = list(dict.fromkeys([*claimed, *left])) if left else list(claimed)
    held_requests = dict(was.requests)
    undo_claims = [
        c
        for name in touched
        if name in before
        for c in shapes(key, was, before[name], held_requests)
    ]
    if before:
        undo_releases = [(c.cluster, c.reservation_id) for c in claims if c.cluster not in before]
    else:
        undo_releases = [(c.cluster, c.reservation_id) for c in claims]
    held_before = _by_cluster(undo_claims)
    known: dict[tuple[int, int], Requests] = {}
    delta: dict[str, Requests] = {}
    added: dict[tuple[int, int], Requests] = {}
    for name in touched:
        new_claims = claimed.get(name, ())
        held = held_before.get(name)
        if held is None and len(new_claims) == 1:
            # The usual cluster of a plan: one claim, nothing held before. Its change
            # is that claim's total without zeros, the same for every such cluster of
            # the plan (a copy object's claims share their requests): made once, copied.
            claim = new_claims[0]
            slot = (id(claim.per_replica), claim.replicas)
            change = added.get(slot)
            if change is None:
                one = _total(new_claims, known)
                change = added[slot] = {r: amount for r, amount in one.items() if amount}
            delta[name] = dict(change)
            continue
        new = _total(new_claims, known)
        if held is None:
            delta[name] = {r: amount for r, amount in new.items() if amount}
            continue
        old_total = _total(held, known)
        change = {r: new.get(r, 0) - old_total.get(r, 0) for r in new.keys() | old_total.keys()}
        delta[name] = {r: amount for r, amount in change.items() if amount}
    return Plan(
        claims=tuple(claims),
        releases=tuple(releases),
        undo_claims=tuple(undo_claims),
        undo_releases=tuple(undo_releases),
        delta=delta,
    )


class Claims:
    """Sends plans to the capacity cache (see the module docstring on why unbounded)."""

    def __init__(self, cache: CapacityCache, ttl: float) -> None:
        self.cache = cache
        self.ttl = ttl

    async def submit(self, plan: Plan) -> set[str]:
        """Apply `plan` all or nothing; the clusters that refused (empty: applied)."""
        if not plan:
            return set()
        return await self.cache.claim(plan.claims, self.ttl, releases=plan.releases)

    async def undo(self, plan: Plan) -> None:
        """Put back what an applied `plan` changed (nothing is refused)."""
        if not (plan.undo_claims or plan.undo_releases):
            return
        await self.cache.claim(plan.undo_claims, self.ttl, releases=plan.undo_releases, check=False)
