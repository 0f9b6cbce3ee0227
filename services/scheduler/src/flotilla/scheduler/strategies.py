"""Strategies: how an object maps onto the clusters that passed the filters.

Each strategy (``split``, ``copy``, ``any``, ``as-needed``; see
docs/architecture.md) is a function registered by name in `STRATEGIES`. It receives the ranked
candidates, *selects* among them (`select`: ``maxClusters`` and ``spread``) and
*assigns* replicas, returning an `Assignment` — the placements, one readable
reason, and a `Verdict` for every eligible cluster it left out.

``split`` divides replicas with the Sainte-Laguë (Webster) highest-averages method,
continued from the replicas each chosen cluster already runs:

* weights are the room each cluster has for the object (``splitBy: capacity``,
  the default — free fit plus the object's own replicas there) or the policy's
  static ``weights`` (the first rule whose selector matches gives the weight; a
  cluster no rule selects, or with weight 0, gets nothing);
* scaling up only adds: the next replica goes to the cluster with the highest
  ``weight / (replicas + 0.5)``, so no cluster ever loses replicas to a scale-up;
* scaling down only removes: the replica to go is the one on the cluster with the
  lowest ``weight / (replicas - 0.5)`` — the most loaded relative to its weight;
* no cluster gets more replicas than fit there; when the chosen clusters together
  fit fewer than requested, split places what fits and reports the rest as
  pending in the reason (the object runs degraded rather than not at all, and the
  next capacity change re-decides);
* a Deployment scaled to 0 keeps one copy (0 replicas) on the best-ranked cluster,
  so the object still exists in the fleet;
* ties go to the better-ranked cluster (see `flotilla.scheduler.scores`).

Handing replicas out one at a time from a heap is exact but O(replicas · log
clusters), and a replica count is user input (10,000,000 is one typo away), so
`apportion` first jumps: it bisects for the quotient threshold above which at
most the wanted number of seats lie, gives every cluster its seats above it at
once (O(clusters) per step, ~100 steps), and leaves only the few seats at the
threshold (at most one per cluster) to the heap. Both halves compare the same
floating-point quotients, so the result is the one-at-a-time result exactly, and
when the caps leave less room than is wanted every open cluster is simply filled.
It is hand-written because the PyPI apportionment packages (``apportionment``,
``apportionpy``; last released 2021-2022) apportion from scratch only: none caps a
party's seats or continues from a current allocation, which is what monotonic
scaling needs.

``any`` places the whole object on one cluster — the current one while it stays
eligible (the stability score ranks it first). A multi-component object goes,
all-or-nothing, to one cluster where a whole set of its components fits, whatever
its strategy says except ``copy`` (where every chosen cluster needs a whole set) and
``as-needed``: its parts cannot be split across clusters.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import add, and_, attrgetter, eq, gt, is_, is_not, lt, methodcaller, truediv

from flotilla.common.api import SplitBy
from flotilla.scheduler.model import (
    MAX_SETS_ESTIMATE,
    UNBOUNDED,
    ClusterView,
    Code,
    Context,
    Registry,
    Rejections,
    Verdict,
)

LISTED = 8
"""Clusters named in a reason before it says "and N more"."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a strategy decided: placements (cluster, replicas) in rank order, and why."""

    placements: Sequence[tuple[str, int | None]]
    reason: str
    rejections: Rejections = field(default_factory=dict)
    schedulable: bool = True
    pending: int = 0


Strategy = Callable[[Context, Sequence[ClusterView]], Assignment]

STRATEGIES: Registry[Strategy] = Registry("strategy")


_NAME = attrgetter("name")
_LABELS = attrgetter("labels")
_not_none = partial(is_not, None)


def listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown if len(items) <= LISTED else f"{shown} and {len(items) - LISTED} more"


# --- select ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    chosen: list[ClusterView]
    """In rank order."""
    rejections: Rejections
    problem: str = ""
    """Why nothing can be chosen at all (an unschedulable spread), else empty."""


def select(
    ctx: Context, ranked: Sequence[ClusterView], limit: int | None, *, one: bool = False
) -> Selection:
    """Keep at most ``limit`` clusters, spread over the policy's groups, best first.

    With ``spread``, groups are ordered by their best cluster; the first
    ``maxGroups`` are used, each group's best cluster is taken before any group's
    second, so a ``maxClusters`` limit still covers ``minGroups`` groups.
    """
    spread = ctx.spread
    if spread is None:
        if limit is None or len(ranked) <= limit:
            return Selection(list(ranked), {})
        return Selection(list(ranked[:limit]), _left_out(ranked[limit:], limit, one))
    key = spread.label_key
    rejections: Rejections = {}
    # Each candidate's label value (None: unlabelled) in rank order, and groups as
    # positions in `ranked`, found by C-level passes rather than a Python loop per
    # candidate. The rejections are inserted in the order one loop grouping cluster
    # by cluster gave: the unlabelled ones, then each left-out group's.
    values = list(map(methodcaller("get", key), map(_LABELS, ranked)))
    positions = range(len(values))
    if None in values:
        missing = Verdict(Code.UNRESOLVABLE, "spread", f"no {key} label to spread by")
        unlabelled = compress(positions, map(is_, values, repeat(None)))
        rejections.update(dict.fromkeys(map(_NAME, map(ranked.__getitem__, unlabelled)), missing))
    # The groups, ordered by their best cluster.
    names = list(dict.fromkeys(filter(_not_none, values)))
    if len(names) < spread.min_groups:
        found = f" ({listing(sorted(names))})" if names else ""
        return Selection(
            [],
            rejections,
            f"spread by {key} needs at least {spread.min_groups} groups; "
            f"eligible clusters are in {len(names)}{found}",
        )
    if limit is not None and limit < spread.min_groups:
        return Selection(
            [],
            rejections,
            f"spread by {key} needs {spread.min_groups} groups but only {limit} "
            f"cluster{'s' if limit != 1 else ''} may be chosen",
        )
    used = names[: spread.max_groups] if spread.max_groups is not None else names
    for value in names[len(used) :]:
        verdict = Verdict(
            Code.UNSCHEDULABLE,
            "spread",
            f"group {key}={value} not among the best {spread.max_groups} (maxGroups)",
        )
        members = compress(positions, map(eq, values, repeat(value)))
        rejections.update(dict.fromkeys(map(_NAME, map(ranked.__getitem__, members)), verdict))
    # Every used group's best cluster comes before any group's second, each part in
    # rank order (groups are ordered by their best cluster: the leaders ascend too).
    leaders = list(map(values.index, used))
    rest = list(map(frozenset(used).__contains__, values))
    for i in leaders:
        rest[i] = False
    order = leaders + list(compress(positions, rest))
    if limit is not None and len(order) > limit:
        rejections.update(_left_out(list(map(ranked.__getitem__, order[limit:])), limit, one))
        order = order[:limit]
    order.sort()
    return Selection(list(map(ranked.__getitem__, order)), rejections)


def _left_out(clusters: Sequence[ClusterView], limit: int, one: bool) -> Rejections:
    return dict.fromkeys(map(_NAME, clusters), _left_out_verdict(limit, one))


_left_out_verdicts: dict[tuple[int, bool], Verdict] = {}
"""`_left_out_verdict` per (limit, one): a verdict is a value, and every ``any`` decision
turns all candidates but one down with the same one."""


def _left_out_verdict(limit: int, one: bool) -> Verdict:
    key = (limit, one)
    verdict = _left_out_verdicts.get(key)
    if verdict is None:
        if one:
            verdict = Verdict(
                Code.UNSCHEDULABLE,
                "select",
                "another cluster ranked higher; the object goes to one",
            )
        else:
            verdict = Verdict(
                Code.UNSCHEDULABLE,
                "max-clusters",
                f"ranked below the {limit} chosen cluster{'s' if limit != 1 else ''} (maxClusters)",
            )
        if len(_left_out_verdicts) >= 1024:  # limits come from policies: bounded anyway
            _left_out_verdicts.clear()
        _left_out_verdicts[key] = verdict
    return verdict


# --- split ------------------------------------------------------------------------


BULK_AFTER = 64
"""Seats beyond the clusters' count that the heap hands out one by one; more go in bulk."""

_BISECTIONS = 160
"""Enough halvings for the bisection's ends to become adjacent floats."""


def apportion(
    total: int, weights: Sequence[int], caps: Sequence[int], start: Sequence[int]
) -> list[int]:
    """Sainte-Laguë seats for ``total``, continued from ``start`` (see the module doc).

    Entries are in rank order; equal quotients go to the earlier entry. ``start``
    must not exceed ``caps``. The result sums to ``total`` unless the caps (or zero
    weights) leave no room, in which case every cluster with room is full.
    O(clusters) however large ``total`` is.
    """
    counts = list(start)
    placed = sum(counts)
    if placed < total:
        if total - placed <= BULK_AFTER:
            # A few seats (a Deployment of a few replicas over many clusters): only
            # the open clusters first in line can get one, and the heap runs over
            # those alone (see `_first_in_line`). No bulk step: it would hand out
            # nothing, or every open seat, which the heap then does just as well.
            grow = [
                (-weights[i] / (counts[i] + 0.5), i)
                for i in _first_in_line(total - placed, weights, caps, counts)
            ]
        else:
            counts = _grow_in_bulk(total - placed, weights, caps, counts)
            placed = sum(counts)
            grow = [
                (-weights[i] / (counts[i] + 0.5), i)
                for i in range(len(counts))
                if counts[i] < caps[i] and weights[i] > 0
            ]
        heapq.heapify(grow)
        while placed < total and grow:
            _, i = heapq.heappop(grow)
            counts[i] += 1
            placed += 1
            if counts[i] < caps[i]:
                heapq.heappush(grow, (-weights[i] / (counts[i] + 0.5), i))
    elif placed > total:
        counts = _shrink_in_bulk(placed - total, weights, counts)
        placed = sum(counts)
        # Later-ranked entries lose first on equal quotients, hence -i.
        shrink = [(weights[i] / (counts[i] - 0.5), -i) for i in range(len(counts)) if counts[i] > 0]
        heapq.heapify(shrink)
        while placed > total:
            _, negative = heapq.heappop(shrink)
            i = -negative
            counts[i] -= 1
            placed -= 1
            if counts[i] > 0:
                heapq.heappush(shrink, (weights[i] / (counts[i] - 0.5), -i))
    return counts


def _first_in_line(
    seats: int, weights: Sequence[int], caps: Sequence[int], counts: Sequence[int]
) -> list[int]:
    """The open entries (room left, a weight) that may get one of the next `seats`
    seats: the `seats` best by next quotient ``weight / (count + 0.5)``, equal ones
    by position, as the heap orders them.

    A cluster gets a seat only after every open cluster ahead of it in that order
    got one: their quotients were in the heap before its own and are higher (a
    seat given only lowers the taker's next quotient, and never below what it
    beat). So the clusters that get any of `seats` seats are a prefix of that
    order no longer than `seats`, and the heap over this prefix gives each seat
    where the heap over every open cluster would. Quotients and the order are
    computed by C-level passes (``nlargest`` keeps equal keys in input order)."""
    quotients = list(map(truediv, weights, map(add, counts, repeat(0.5))))
    open_ = map(and_, map(lt, counts, caps), map(gt, weights, repeat(0)))
    return heapq.nlargest(seats, compress(range(len(quotients)), open_), quotients.__getitem__)


def _grow_in_bulk(
    seats: int, weights: Sequence[int], caps: Sequence[int], counts: list[int]
) -> list[int]:
    """`counts` plus every seat whose quotient lies above a threshold that leaves at
    most `seats` of them: the first seats the heap would hand out, in one step."""
    open_ = {i for i in range(len(counts)) if counts[i] < caps[i] and weights[i] > 0}
    if sum(caps[i] - counts[i] for i in open_) <= seats:
        return [caps[i] if i in open_ else n for i, n in enumerate(counts)]
    if seats <= BULK_AFTER + len(open_):
        return counts

    def above(threshold: float) -> list[int]:
        return [
            _seats_above(weights[i], counts[i], caps[i], threshold) if i in open_ else 0
            for i in range(len(counts))
        ]

    _, high = _boundary(lambda threshold: sum(above(threshold)) <= seats, 2.0 * max(weights) + 1.0)
    return [n + extra for n, extra in zip(counts, above(high), strict=True)]


def _boundary(crossed: Callable[[float], bool], high: float) -> tuple[float, float]:
    """Bisect ``(0, high]`` down to two adjacent floats ``low < high`` with
    ``crossed(high)`` and not ``crossed(low)``; `crossed` is monotonic."""
    low = 0.0
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        if not low < middle < high:
            break
        if crossed(middle):
            high = middle
        else:
            low = middle
    return low, high


def _seats_above(weight: int, count: int, cap: int, threshold: float) -> int:
    """How many seats from `count` up to `cap` have ``weight / (c + 0.5) > threshold``."""
    bound = weight / threshold - 0.5
    upper = cap if bound >= cap else min(cap, max(count, math.ceil(bound)))
    # The division above may round the other way than the heap's: settle on its test.
    while upper > count and not weight / ((upper - 1) + 0.5) > threshold:
        upper -= 1
    while upper < cap and weight / (upper + 0.5) > threshold:
        upper += 1
    return upper - count


def _shrink_in_bulk(removals: int, weights: Sequence[int], counts: list[int]) -> list[int]:
    """`counts` less every seat whose quotient lies below a threshold that leaves at
    most `removals` of them: the first seats the heap would take back, in one step."""
    holding = sum(1 for n in counts if n > 0)
    if removals <= BULK_AFTER + holding:
        return counts

    def below(threshold: float) -> list[int]:
        return [_seats_below(w, n, threshold) for w, n in zip(weights, counts, strict=True)]

    low, _ = _boundary(lambda threshold: sum(below(threshold)) > removals, 2.0 * max(weights) + 1.0)
    return [n - gone for n, gone in zip(counts, below(low), strict=True)]


def _seats_below(weight: int, count: int, threshold: float) -> int:
    """How many of the seats 1..`count` have ``weight / (c - 0.5) < threshold``."""
    if threshold <= 0 or count == 0:
        return 0
    if weight == 0:
        return count
    bound = weight / threshold + 0.5
    lower = 1 if bound < 1 else min(count + 1, math.floor(bound) + 1)
    # As above: settle on the heap's own comparison.
    while lower > 1 and weight / ((lower - 1) - 0.5) < threshold:
        lower -= 1
    while lower <= count and not weight / (lower - 0.5) < threshold:
        lower += 1
    return count - lower + 1


def _static_weights(
    ctx: Context, ranked: Sequence[ClusterView]
) -> tuple[list[ClusterView], dict[str, int], Rejections]:
    selected = [ctx.fleet.selected_by(rule.cluster_selector) for rule in ctx.weights]
    weights: dict[str, int] = {}
    rejections: Rejections = {}
    kept = []
    for cluster in ranked:
        weight = next(
            (
                rule.weight
                for rule, names in zip(ctx.weights, selected, strict=True)
                if cluster.name in names
            ),
            None,
        )
        if not weight:
            reason = "no weight rule selects this cluster" if weight is None else "its weight is 0"
            rejections[cluster.name] = Verdict(Code.UNRESOLVABLE, "weights", reason)
        else:
            weights[cluster.name] = weight
            kept.append(cluster)
    return kept, weights, rejections


@STRATEGIES.register("split")
def split(ctx: Context, ranked: Sequence[ClusterView]) -> Assignment:
    if ctx.components:
        return whole(ctx, ranked)
    total = ctx.replicas if ctx.replicas is not None else 1
    rejections: Rejections = {}
    static: dict[str, int] = {}
    candidates: Sequence[ClusterView] = ranked
    if ctx.split_by is SplitBy.WEIGHTS:
        candidates, static, rejections = _static_weights(ctx, ranked)
    selection = select(ctx, candidates, ctx.max_clusters)
    rejections.update(selection.rejections)
    if selection.problem or not selection.chosen:
        return Assignment([], selection.problem, rejections, schedulable=False)
    chosen = selection.chosen
    if total == 0:
        return Assignment(
            [(chosen[0].name, 0)],
            f"0 replicas requested; the object stays on {chosen[0].name} with none",
            rejections,
        )
    held = ctx.held
    if not ctx.required:
        caps = [UNBOUNDED] * len(chosen)
    elif held:
        caps = []
        for cluster in chosen:
            room = ctx.capacity_of(cluster.name)
            caps.append(held.get(cluster.name, 0) if room is None else room)
    else:
        # `Context.capacity_of` without a call per cluster: nothing is held, and a
        # cluster without a record has no room. (C-level passes, as below; a fit is
        # never above UNBOUNDED, so no ``min`` with it per cluster.)
        caps = list(map(ctx.fits.get, map(_NAME, chosen), repeat(0)))
    if static:
        weights = [static[c.name] for c in chosen]
        basis = "weights"
    else:
        # At least 1 each; usually every cap is already (the capacity filter turned
        # down the clusters without room): then one ``min`` over them, not a ``max``
        # call per cluster.
        weights = list(caps) if min(caps) >= 1 else list(map(max, caps, repeat(1)))
        basis = "capacity"
    if held:
        start = [min(held.get(c.name, 0), cap) for c, cap in zip(chosen, caps, strict=True)]
    else:
        start = [0] * len(chosen)
    counts = apportion(total, weights, caps, start)
    # The clusters that got replicas, in rank order (counts are never negative).
    placements = [(chosen[i].name, counts[i]) for i in compress(range(len(counts)), counts)]
    placed = sum(counts)
    shares = listing([f"{name}={n}" for name, n in placements])
    reason = (
        f"split {placed} replica{'s' if placed != 1 else ''} over {len(placements)} "
        f"cluster{'s' if len(placements) != 1 else ''} by {basis}: {shares}"
    )
    pending = total - placed
    if pending:
        reason += f"; {pending} of {total} pending: the chosen clusters fit no more"
    if not placements:
        return Assignment([], f"no room for any of {total} replicas", rejections, False, pending)
    return Assignment(placements, reason, rejections, pending=pending)


# --- copy, any, as-needed ------------------------------------------------------------


@STRATEGIES.register("copy")
def copy(ctx: Context, ranked: Sequence[ClusterView]) -> Assignment:
    selection = select(ctx, ranked, ctx.max_clusters)
    if selection.problem or not selection.chosen:
        return Assignment([], selection.problem, selection.rejections, schedulable=False)
    names = list(map(_NAME, selection.chosen))
    replicas = None if ctx.components else ctx.replicas
    reason = f"copied to {len(names)} cluster{'s' if len(names) != 1 else ''}: {listing(names)}"
    return Assignment(list(zip(names, repeat(replicas))), reason, selection.rejections)


def _one(ctx: Context, ranked: Sequence[ClusterView]) -> tuple[ClusterView | None, Selection]:
    limit = 1 if ctx.max_clusters is None else min(ctx.max_clusters, 1)
    selection = select(ctx, ranked, limit, one=True)
    return (selection.chosen[0] if selection.chosen else None), selection


@STRATEGIES.register("any")
def any_(ctx: Context, ranked: Sequence[ClusterView]) -> Assignment:
    if ctx.components:
        return whole(ctx, ranked)
    chosen, selection = _one(ctx, ranked)
    if chosen is None:
        return Assignment([], selection.problem, selection.rejections, schedulable=False)
    why = "stays where it runs" if chosen.name in ctx.held else f"best of {len(ranked)} eligible"
    return Assignment(
        [(chosen.name, ctx.replicas)], f"on {chosen.name} ({why})", selection.rejections
    )


def whole(ctx: Context, ranked: Sequence[ClusterView]) -> Assignment:
    """A multi-component object: every component on one cluster, all or nothing."""
    chosen, selection = _one(ctx, ranked)
    if chosen is None:
        return Assignment([], selection.problem, selection.rejections, schedulable=False)
    sets = ctx.capacity_of(chosen.name)
    if sets is None or chosen.name in ctx.held:
        room = ""
    else:
        at_least = "at least " if sets >= MAX_SETS_ESTIMATE else ""
        room = f"; room for {at_least}{sets} whole set{'s' if sets != 1 else ''}"
    why = "stays where it runs" if chosen.name in ctx.held else f"best of {len(ranked)} eligible"
    names = listing([c.name for c in ctx.components])
    return Assignment(
        [(chosen.name, None)],
        f"all {len(ctx.components)} components ({names}) on {chosen.name} ({why}{room})",
        selection.rejections,
    )


@STRATEGIES.register("as-needed")
def as_needed(ctx: Context, ranked: Sequence[ClusterView]) -> Assignment:
    return Assignment(
        [], "as-needed: not placed by itself; it goes where the objects that depend on it run"
    )
