"""The scheduler core: one input, one snapshot, ``filter → score → select → assign``.

`schedule` is the entry point the scheduler service calls for every object it
(re)considers: it builds a `model.SchedulingInput` from the ``ResourceAnalyzed``
event, the effective policy, a `model.Fleet` (built once per capacity snapshot and
shared by all decisions against it), the durable previous placement and the
placements of the object's dependencies, then stores and publishes the `Decision`
(compare-and-set on the placement record, reservations, ``PlacementDecided``).
Nothing here does I/O, reads a clock or draws a random number: the same input gives
the same decision, ``decision_id`` included, which is what makes replay useful.

Steps (after Karmada's ``generic_scheduler``):

1. **strategy** — `flotilla.common.api.effective_strategy`: the object's
   ``flotilla.io/strategy`` annotation wins, then the policy's ``strategy``, then
   the interpreter's default carried by the event;
2. **filter** — every registered filter (`flotilla.scheduler.filters`) in order;
   verdicts that depend only on the fleet and the policy are memoised per snapshot
   (`run_filters`);
3. **score** — rank what is left (`flotilla.scheduler.scores`);
4. **select and assign** — the strategy (`flotilla.scheduler.strategies`);
5. **retire** — clusters that held the object and are not chosen any more stay in
   the decision as ``Retiring`` with their replicas: moves are make-before-break
   (docs/architecture.md, "Cordon, drain and failover"), and the drain
   coordinator removes that work once the new placement is ready. A Retiring
   cluster that is chosen again becomes Active; one that left the fleet is dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from operator import itemgetter

from flotilla.common import api
from flotilla.common.api import GroupVersionKind, PlacementState, Strategy
from flotilla.common.events import PlacementDecided
from flotilla.scheduler import filters, scores, strategies
from flotilla.scheduler.model import (
    ClusterView,
    Context,
    Decision,
    Rejections,
    SchedulingInput,
    aware,
    hash64,
)


def effective_strategy(inp: SchedulingInput) -> Strategy:
    """The strategy of `inp` (``ValueError`` for an invalid annotation)."""
    analyzed = inp.analyzed
    return api.effective_strategy(analyzed.object, inp.policy, analyzed.default_strategy)


def context(inp: SchedulingInput, strategy: Strategy) -> Context:
    """The facts every unit of this decision reads, derived once."""
    analyzed = inp.analyzed
    policy = inp.policy
    components = tuple(analyzed.components)
    replicas = analyzed.replicas
    # An object without requests still needs a pod slot per replica (``pods`` is
    # part of every shape, as in the reservations), so every object is judged on
    # capacity: a Deployment asking for nothing is bounded by the clusters' pods.
    if components:
        required = 1
    elif strategy is Strategy.SPLIT:
        required = 1 if (replicas is None or replicas > 0) else 0
    else:
        required = 1 if replicas is None else replicas
    if required == 0:
        fits: Mapping[str, int] = {}
    elif components:
        fits = inp.fleet.set_fits(components)
    else:
        fits = inp.fleet.fits(analyzed.requests)
    held = {p.cluster: p.replicas or 0 for p in inp.previous if p.state is PlacementState.ACTIVE}
    return Context(
        input=inp,
        strategy=strategy,
        gvk=GroupVersionKind.from_api_version(analyzed.ref.api_version, analyzed.ref.kind),
        per_replica=analyzed.requests,
        components=components,
        replicas=replicas,
        required=required,
        held=held,
        cluster_selector=policy.cluster_selector if policy else None,
        cluster_names=(
            frozenset(policy.cluster_names)
            if policy is not None and policy.cluster_names is not None
            else None
        ),
        tolerations=tuple(policy.tolerations) if policy else (),
        max_clusters=policy.max_clusters if policy else None,
        spread=policy.spread if policy else None,
        split_by=policy.split_by if policy else api.SplitBy.CAPACITY,
        weights=tuple(policy.weights) if policy else (),
        seed=hash64(inp.uid),
        fits=fits,
    )


def _chain(
    ctx: Context, units: Sequence[filters.Filter], candidates: Sequence[ClusterView]
) -> tuple[list[ClusterView], Rejections]:
    passing = list(candidates)
    rejections: Rejections = {}
    for unit in units:
        if not passing:
            break
        rejected = unit.check(ctx, passing)
        if rejected:
            rejections.update(rejected)
            passing = [c for c in passing if c.name not in rejected]
    return passing, rejections


@dataclasses.dataclass(frozen=True, slots=True)
class _FilterPlan:
    """How `run_filters` runs the registered filters, derived from the registry once."""

    size: int
    """Filters registered when derived (the registry only grows: a new size, a new plan)."""
    memoised: list[filters.Filter]
    per_decision: list[filters.Filter]
    keys: list[tuple[str, Callable[[Context], Hashable]]]
    reads_capacity: frozenset[str]
    first: int
    """A cluster judged again after a patch passed every memoised filter before the
    first one that reads capacity (it passed them all, or one that reads capacity
    turned it down), and a patch changes nothing those read: they are not run again."""


_plans: list[_FilterPlan] = []


def _filter_plan() -> _FilterPlan:
    size = len(filters.FILTERS)
    if _plans and _plans[0].size == size:
        return _plans[0]
    units = filters.FILTERS.items()
    memoised = [unit for _, unit in units if unit.key is not None]
    plan = _FilterPlan(
        size=size,
        memoised=memoised,
        per_decision=[unit for _, unit in units if unit.key is None],
        keys=[(name, unit.key) for name, unit in units if unit.key is not None],
        reads_capacity=frozenset(
            name for name, unit in units if unit.key is not None and unit.reads_capacity
        ),
        first=next((i for i, unit in enumerate(memoised) if unit.reads_capacity), len(memoised)),
    )
    _plans[:] = [plan]
    return plan


def run_filters(ctx: Context) -> tuple[list[ClusterView], Rejections]:
    """The clusters every filter passes, and a verdict for each one rejected.

    Memoised filters (`filters.Filter.key`) are run once per fleet and combined key
    with no cluster counted as holding the object; the clusters that do hold it
    are then checked on their own, and the per-decision filters run last.
    """
    passing, rejections, _ = _run_filters(ctx)
    return passing, rejections


def _run_filters(ctx: Context) -> tuple[list[ClusterView], Rejections, int]:
    """`run_filters`, and the `Fleet.rejections_mark` of its rejections: the memoised
    verdicts' share from their memo, the rest added up here."""
    fleet = ctx.fleet
    plan = _filter_plan()
    memoised, per_decision, reads_capacity, first = (
        plan.memoised,
        plan.per_decision,
        plan.reads_capacity,
        plan.first,
    )
    key = ("filters", *[(name, keyed(ctx)) for name, keyed in plan.keys])
    # The memoised verdicts are those of a decision holding nothing (most decisions
    # hold nothing already: no copy of the context then).
    unheld = dataclasses.replace(ctx, held={}) if ctx.held else ctx
    passing, rejections = fleet.verdicts(
        key,
        lambda views: _chain(unheld, memoised, views),
        stands=lambda verdict: verdict.unit not in reads_capacity,
        again=lambda views: _chain(unheld, memoised[first:], views),
    )
    mark = fleet.verdicts_mark(key, rejections)
    held = ctx.held
    if held:
        holders = [fleet.by_name[name] for name in sorted(held) if name in fleet.by_name]
        held_passing, held_rejections = _chain(ctx, memoised, holders)
        passing = [c for c in passing if c.name not in held]
        passing.extend(held_passing)
        mark -= fleet.rejections_mark({n: rejections[n] for n in held if n in rejections})
        mark += fleet.rejections_mark(held_rejections)
        rejections = {name: v for name, v in rejections.items() if name not in held}
        rejections.update(held_rejections)
    else:
        rejections = dict(rejections)
    if per_decision:
        passing, late = _chain(ctx, per_decision, passing)
        if late:
            rejections.update(late)
            mark += fleet.rejections_mark(late)
    return passing, rejections, mark


def unschedulable_reason(rejections: Rejections, clusters: int) -> str:
    """``no cluster can take it: 3 rejected (cordon 1, taints 2)`` — one line."""
    if clusters == 0:
        return "no cluster can take it: no clusters are registered"
    counts = Counter(v.unit for v in rejections.values())
    parts = ", ".join(f"{unit} {n}" for unit, n in sorted(counts.items()))
    return f"no cluster can take it: {len(rejections)} of {clusters} rejected ({parts})"


def schedule(inp: SchedulingInput) -> Decision:
    """Decide where one object runs; pure and deterministic."""
    analyzed = inp.analyzed
    inp = _normalised(inp)
    try:
        strategy = effective_strategy(inp)
    except ValueError as error:
        # A typo in the annotation must not evict a running object: keep it where it
        # is and say why nothing was decided.
        kept = [(p.cluster, p.replicas) for p in inp.previous if p.state is PlacementState.ACTIVE]
        reason = f"{error}; placement left unchanged"
        return _finish(inp, analyzed.strategy, kept, reason, {}, 0, schedulable=False)
    if analyzed.deleted:
        return _finish(
            inp, strategy, [], "object deleted; removed from every cluster", {}, 0, deleted=True
        )
    if strategy is Strategy.AS_NEEDED:
        outcome = strategies.STRATEGIES[strategy.value](context(inp, strategy), [])
        return _finish(inp, strategy, [], outcome.reason, {}, 0, retire=False)
    ctx = context(inp, strategy)
    candidates, rejections, mark = _run_filters(ctx)
    ranked = scores.rank(ctx, candidates)
    outcome = strategies.STRATEGIES[strategy.value](ctx, ranked)
    if outcome.rejections:
        # A strategy turns down candidates, which no filter rejected: its verdicts
        # add to the rejections (and their mark), replacing none (were one to, its
        # filter verdict's term is taken out first).
        if not rejections.keys().isdisjoint(outcome.rejections):
            replaced = {n: rejections[n] for n in outcome.rejections if n in rejections}
            mark -= inp.fleet.rejections_mark(replaced)
        rejections.update(outcome.rejections)
        mark += inp.fleet.rejections_mark(outcome.rejections)
    reason = outcome.reason or unschedulable_reason(rejections, len(ctx.fleet.views))
    return _finish(
        inp,
        strategy,
        outcome.placements,
        reason,
        rejections,
        mark,
        schedulable=outcome.schedulable,
        pending=outcome.pending,
    )


def _normalised(inp: SchedulingInput) -> SchedulingInput:
    if inp.now.tzinfo is not None:
        return inp
    return dataclasses.replace(inp, now=aware(inp.now))


def _finish(
    inp: SchedulingInput,
    strategy: Strategy,
    placements: Sequence[tuple[str, int | None]],
    reason: str,
    rejections: Rejections,
    mark: int,
    *,
    schedulable: bool = True,
    pending: int = 0,
    deleted: bool = False,
    retire: bool = True,
) -> Decision:
    """The `Decision`; `mark` is the `Fleet.rejections_mark` of `rejections`."""
    fleet = inp.fleet
    found = fleet.active_entries(placements)
    active = list(map(_ENTRY, found))
    lines = list(map(_LINE, found))
    retiring = []
    if retire and not deleted and inp.previous:
        known = fleet.by_name
        seen = {name for name, _ in placements}
        for previous in inp.previous:
            if previous.cluster in seen or previous.cluster not in known:
                continue
            seen.add(previous.cluster)
            entry = fleet.placement(previous.cluster, previous.replicas, PlacementState.RETIRING)
            retiring.append(entry)
            lines.append(fleet.placement_line(entry))
    clusters = (*active, *retiring)
    schedulable = schedulable and (bool(active) or strategy is Strategy.AS_NEEDED or deleted)
    return Decision(
        ref=inp.analyzed.ref,
        decision_id=decision_id(
            inp, strategy, lines, reason, len(rejections), mark, schedulable, pending, deleted
        ),
        strategy=strategy,
        clusters=clusters,
        reason=reason,
        rejections=rejections,
        schedulable=schedulable,
        pending=pending,
        deleted=deleted,
    )


def decision_id(
    inp: SchedulingInput,
    strategy: Strategy,
    lines: list[str],
    reason: str,
    rejected: int,
    mark: int,
    schedulable: bool,
    pending: int,
    deleted: bool,
) -> str:
    """sha256 of the input's digest (`SchedulingInput.digest`) and the decision's
    content: the strategy, reason and flags, the placement lines (`Fleet.placement_line`
    of each entry, in any order: sorted here, since the same placement listed in
    another score order is the same), and the rejections as their count and
    `Fleet.rejections_mark` (`rejected`, `mark`); 32 hex digits.

    The rejections are a function of the input, already in the digest; they are
    hashed as a sum memoised per filter memo rather than line by line, which cost
    time in proportion to the fleet on every decision."""
    lines.sort()
    result = "\x1f".join(
        [
            strategy.value,
            reason,
            str(schedulable),
            str(pending),
            str(deleted),
            *lines,
            f"{rejected}:{mark:x}",
        ]
    )
    return hashlib.sha256(f"{inp.digest()}\x1e{result}".encode()).hexdigest()[:32]


_ENTRY = itemgetter(0)
_LINE = itemgetter(1)


def release_retiring(decided: PlacementDecided, released: Collection[str]) -> PlacementDecided:
    """`decided` without the Retiring entries of `released` (the drain coordinator saw
    the new copies ready); nothing else changes. The decision id is derived from the
    one released from, so the same release gives the same id; the input itself is
    returned when there is nothing to release."""
    kept = [
        p
        for p in decided.clusters
        if not (p.state is PlacementState.RETIRING and p.cluster in released)
    ]
    if len(kept) == len(decided.clusters):
        return decided
    gone = sorted({p.cluster for p in decided.clusters} - {p.cluster for p in kept})
    digest = hashlib.sha256(f"{decided.decision_id}\x1erelease\x1f{','.join(gone)}".encode())
    return decided.model_copy(
        update={
            "decision_id": digest.hexdigest()[:32],
            "clusters": kept,
            "previous": list(decided.clusters),
            "reason": f"{decided.reason}; released the retiring copy on {', '.join(gone)}",
        }
    )
