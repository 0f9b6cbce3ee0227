"""Scores: an order over the clusters that passed the filters.

Each score is a small function registered by name in `SCORES` with a weight; it
returns 0-100 per candidate (higher is better). `rank` sums the weighted scores and
orders the candidates, best first. Strategies read that order: ``any`` takes the
first cluster, ``maxClusters`` and ``spread`` keep the best ones, and ``split``
gives remainder replicas to better-ranked clusters first.

* ``stability`` (weight 3) — 100 where the object already runs. Its weight is
  larger than the other scores' combined maximum, so an object never moves to a
  merely better cluster; only a filter (drain, policy change) makes it move.
* ``capacity`` (weight 1) — room for this object: replicas (or component sets)
  that fit, relative to the roomiest candidate. For objects whose requests the core
  cannot judge, the free share of CPU and memory instead.
* ``balance`` (weight 1) — fewer objects already placed on the cluster
  (``status.placements``), relative to the busiest candidate.

Ties are broken by ``Context.tiebreaks`` (a stable hash of the object's uid and the
cluster name), then by name: deterministic everywhere, yet different objects with equal
scores do not all pile onto the same cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, islice, repeat
from operator import add, attrgetter, eq, mul

from flotilla.scheduler.model import UNBOUNDED, CapacityRecord, ClusterView, Context, Registry

ScoreFn = Callable[[Context, Sequence[ClusterView]], Sequence[float] | None]
"""Returns one value per candidate, in the candidates' order; ``None`` when the score
has no preference this time (every candidate would get the same value)."""


@dataclass(frozen=True, slots=True)
class Score:
    weight: int
    fn: ScoreFn


SCORES: Registry[Score] = Registry("score")

MAX = 100.0

_NAME = attrgetter("name")
_PLACEMENTS = attrgetter("placements")

# The scores and `totals` run once per decision over every candidate: their
# per-candidate arithmetic is written as ``map`` over `operator` functions (or
# lookups in a per-fleet memo), one C loop each instead of a Python-level
# comprehension, computing the same floats in the same order.


def score(name: str, weight: int) -> Callable[[ScoreFn], ScoreFn]:
    """Register ``fn`` as the score ``name`` with ``weight``."""

    def decorate(fn: ScoreFn) -> ScoreFn:
        SCORES.add(name, Score(weight, fn))
        return fn

    return decorate


@score("stability", weight=3)
def stability(ctx: Context, candidates: Sequence[ClusterView]) -> Sequence[float] | None:
    held = ctx.held
    if not held:
        return None
    return [MAX if c.name in held else 0.0 for c in candidates]


def _free_share(record: CapacityRecord | None) -> float:
    if record is None:
        return 0.0
    shares = []
    for resource in ("cpu", "memory"):
        allocatable = record.allocatable.get(resource, 0)
        if allocatable > 0:
            free = record.available.get(resource, 0) - record.reserved.get(resource, 0)
            shares.append(max(free, 0) / allocatable)
    return sum(shares) / len(shares) if shares else 0.0


@score("capacity", weight=1)
def capacity(ctx: Context, candidates: Sequence[ClusterView]) -> Sequence[float] | None:
    if ctx.required == 0 or not (ctx.per_replica or ctx.components):
        # Pod slots alone rank every roomy cluster alike; a pod that asks for
        # nothing still runs best where CPU and memory are free.
        records = ctx.fleet.records
        return [MAX * min(_free_share(records.get(c.name)), 1.0) for c in candidates]
    fits = ctx.fits
    held = ctx.held
    if held:
        room = [min(fits.get(c.name, 0) + held.get(c.name, 0), UNBOUNDED) for c in candidates]
    else:
        room = list(map(fits.get, map(_NAME, candidates), repeat(0)))
    if not room:
        return None
    largest = max(room)
    most = largest if largest < UNBOUNDED else max((r for r in room if r < UNBOUNDED), default=0)
    if most == 0:
        return None
    scale = MAX / most
    if largest == most:
        return list(map(mul, room, repeat(scale)))
    return list(map(mul, map(min, room, repeat(most)), repeat(scale)))


@score("balance", weight=1)
def balance(ctx: Context, candidates: Sequence[ClusterView]) -> Sequence[float] | None:
    busiest = max(map(_PLACEMENTS, candidates))
    if busiest == 0:
        return None
    # Placements are the clusters' own (not capacity): every cluster's score relative
    # to one busiest count is computed once per fleet, and candidates look it up.
    memo = ctx.fleet.memo
    scored = memo.get(("balance", busiest))
    if scored is None:
        scored = memo[("balance", busiest)] = {
            v.name: MAX - MAX * v.placements / busiest for v in ctx.fleet.views
        }
    return list(map(scored.__getitem__, map(_NAME, candidates)))


def totals(ctx: Context, candidates: Sequence[ClusterView]) -> list[float]:
    """The weighted sum of every registered score, per candidate in order."""
    total: list[float] | None = None
    for _, unit in SCORES.items():
        values = unit.fn(ctx, candidates)
        if values is None:
            continue
        if len(values) != len(candidates):
            raise ValueError(f"a score gave {len(values)} values for {len(candidates)} clusters")
        weight = unit.weight
        # The first score is taken as it is (0.0 + x is x) and a weight of 1 is not
        # multiplied by: two passes fewer over the candidates, the same sums.
        weighted = values if weight == 1 else list(map(mul, repeat(weight), values))
        # (Both have as many values as there are candidates, checked above.)
        total = list(weighted) if total is None else list(map(add, total, weighted))
    return [0.0] * len(candidates) if total is None else total


def rank(ctx: Context, candidates: Sequence[ClusterView]) -> list[ClusterView]:
    """The candidates, best first (highest total, then tie-break, then name).

    Sorted by total alone first; only runs of equal totals are then ordered by
    tie-break and name, so tie-breaks are computed for the tied candidates alone
    (none, usually, once capacity and balance have spoken). The order is the one
    the full key gives."""
    count = len(candidates)
    if count <= 1:
        return list(candidates)
    total = totals(ctx, candidates)
    order = sorted(range(count), key=total.__getitem__, reverse=True)
    if len(set(total)) < count:
        ordered = list(map(total.__getitem__, order))
        # Positions p where the p-th and the next total are equal (C-level passes).
        tied = list(compress(range(count - 1), map(eq, ordered, islice(ordered, 1, None))))
        start = 0
        while start < len(tied):
            end = start
            while end + 1 < len(tied) and tied[end + 1] == tied[end] + 1:
                end += 1
            first, last = tied[start], tied[end] + 1  # one run of equal totals
            run = order[first : last + 1]
            views = [candidates[i] for i in run]
            keyed = sorted(zip(ctx.tiebreaks(views), [v.name for v in views], run, strict=True))
            order[first : last + 1] = [k[2] for k in keyed]
            start = end + 1
    return list(map(candidates.__getitem__, order))
