"""The read model: the clusters and their capacity as one replica decides against them.

Building a `model.Fleet` (views, fingerprint, memos) costs far more than a decision,
so the read model keeps one and patches it:

* its **own claims** are applied locally the moment they are decided
  (`ReadModel.apply`, from `claims.Plan.delta`), before the claim is even sent, so
  the next decision already sees them and nothing is re-read;
* clusters marked stale (a refused or undone claim, a ``CapacityChanged``, the
  reservation janitor) are re-read alone before the next decision;
* every `max_age` seconds, or when a decision must see capacity read after some
  moment (``fresh_after``), every record is read again and only the clusters whose
  record differs are patched in;
* only a change of the clusters themselves (the cluster view's version) builds a
  new fleet.

Other replicas' claims are not seen until one of these reads: the claim itself is
the atomic check, and a refusal marks the clusters it touched stale.

A read never runs while one of this replica's claims is in flight (counted in
locally, not yet answered by the cache): it could not tell whether the claim is in
what it read, and would either lose it (the next decisions claim room that is
taken, and are refused) or count it twice (objects wrongly Pending). Reads wait
for the claims in flight to be answered; no new claim starts meanwhile, since
both happen under the decision lock.

`SyncPoint` coalesces the "have I seen every cluster written so far" check: one
bucket round trip serves every decision that asked while it was not yet sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

from flotilla.common import capacity
from flotilla.common.capacity import CapacityCache, ClusterCapacity
from flotilla.scheduler import state
from flotilla.scheduler.claims import Plan
from flotilla.scheduler.model import Fleet

T = TypeVar("T")


class ReadModel:
    """One replica's fleet, patched as it and others change capacity."""

    def __init__(
        self,
        cache: CapacityCache,
        clusters: state.Clusters,
        *,
        max_age: float,
        slots: asyncio.Semaphore,
    ) -> None:
        self.cache = cache
        self.clusters = clusters
        self.max_age = max_age
        self._slots = slots
        self._fleet: Fleet | None = None
        self._records: dict[str, ClusterCapacity] = {}
        self._view = -1
        self._read_at = 0.0
        self._read_wall = 0.0
        self._stale: set[str] = set()
        self._in_flight = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.whole_reads = 0
        self.partial_reads = 0

    def mark_stale(self, names: Iterable[str]) -> None:
        """Re-read these clusters' records before the next decision."""
        self._stale.update(names)

    async def fleet(self, view: int, *, fresh_after: float = 0.0) -> Fleet:
        """The fleet at cluster view `view`, its capacity read after `fresh_after`
        (epoch seconds) and no older than `max_age` (see the module docstring)."""
        now, wall = time.monotonic(), time.time()
        fleet = self._fleet
        if fleet is None or self._view != view:
            self._stale.clear()
            snapshot = await self._read(None)
            self._records = dict(snapshot.clusters)
            fleet = Fleet(self.clusters.live(), snapshot)
            self._fleet, self._view, self._read_at, self._read_wall = fleet, view, now, wall
            return fleet
        if now - self._read_at > self.max_age or self._read_wall < fresh_after:
            self._stale.clear()
            snapshot = await self._read(None)
            self._patch(fleet, snapshot.clusters, self._records.keys() | snapshot.clusters.keys())
            self._read_at, self._read_wall = now, wall
        elif self._stale:
            names = sorted(self._stale)
            self._stale.clear()
            snapshot = await self._read(names)
            self._patch(fleet, snapshot.clusters, names)
        return fleet

    async def _read(self, names: list[str] | None) -> capacity.Snapshot:
        await self._quiet.wait()
        if names is None:
            self.whole_reads += 1
        else:
            self.partial_reads += 1
        async with self._slots:
            return await self.cache.snapshot(names)

    def _patch(self, fleet: Fleet, read: dict[str, ClusterCapacity], names: Iterable[str]) -> None:
        changed: dict[str, ClusterCapacity | None] = {}
        for name in names:
            record = read.get(name)
            if self._records.get(name) != record:
                changed[name] = record
                if record is None:
                    self._records.pop(name, None)
                else:
                    self._records[name] = record
        fleet.patch(changed)

    def apply(self, plan: Plan) -> None:
        """Count this replica's own claims in, as the cache will once they are sent;
        `settled` must follow once the cache answered (applied or refused)."""
        self._in_flight += 1
        self._quiet.clear()
        fleet = self._fleet
        if fleet is None or not plan.delta:
            return
        changed: dict[str, ClusterCapacity | None] = {}
        records = self._records
        for name, delta in plan.delta.items():
            record = records.get(name)
            if record is None or not delta:
                continue
            totals = record.reserved.copy()
            for resource, amount in delta.items():
                totals[resource] = totals.get(resource, 0) + amount
            # In no particular order: whatever reads the totals (the fleet's
            # fingerprint, record equality) does not depend on it. Usually every
            # total is positive and there is nothing to leave out.
            if min(totals.values()) <= 0:
                totals = {r: amount for r, amount in totals.items() if amount > 0}
            changed[name] = records[name] = with_reserved(record, totals)
        fleet.patch(changed)

    def settled(self, plan: Plan, *, applied: bool) -> None:
        """The cache answered `plan`'s claim; when it was not applied, what `apply`
        counted in is wrong, and its clusters are read again."""
        if not applied:
            self.mark_stale(plan.clusters)
        self._in_flight -= 1
        if not self._in_flight:
            self._quiet.set()


def with_reserved(record: ClusterCapacity, reserved: dict[str, int]) -> ClusterCapacity:
    """`record` with other reserved totals: ``model_copy(update={"reserved": …})``
    without its generic copying (a third of the cost). A copy ``DaemonSet`` claims on
    every cluster, so one decision patches a hundred records."""
    new = _new_record(ClusterCapacity)
    fields = record.__dict__.copy()
    fields["reserved"] = reserved
    _set(new, "__dict__", fields)
    fields_set = record.__pydantic_fields_set__
    if "reserved" not in fields_set:
        fields_set = fields_set | {"reserved"}
    _set(new, "__pydantic_fields_set__", fields_set)  # never changed: shared
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


_new_record = ClusterCapacity.__new__
_set = object.__setattr__


class SyncPoint(Generic[T]):
    """Coalesces calls of `fn`: each caller gets the result of a call that started
    after it asked, and callers that ask while none has started yet share one."""

    def __init__(self, fn: Callable[[], Awaitable[T]]) -> None:
        self._fn = fn
        self._current: asyncio.Future[T] | None = None
        self._next: asyncio.Future[T] | None = None

    async def __call__(self) -> T:
        upcoming = self._next
        if upcoming is None:
            upcoming = self._next = asyncio.ensure_future(self._run(self._current))
        return await asyncio.shield(upcoming)

    async def _run(self, running: asyncio.Future[T] | None) -> T:
        if running is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
        this = self._next
        self._current, self._next = this, None
        try:
            return await self._fn()
        finally:
            if self._current is this:
                self._current = None
