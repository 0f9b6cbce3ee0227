"""The scheduler service: the pure core (`flotilla.scheduler.core`) wired to the bus,
the capacity cache and the durable placement records.

Handlers (one `Router`, partitioned, so one key's events arrive in order):

* ``ResourceAnalyzed`` — decide the object (or, when deleted, remove it).
* ``RescheduleRequested`` — decide the object again from its stored record.
* ``ClusterObserved`` — write the cluster to the clusters bucket (every replica
  follows it), then send a ``RescheduleRequested`` to each object the change can
  affect (`flotilla.scheduler.state`). Cluster events have the cluster's key, so
  deciding the objects right here would break their per-key order and race their
  partition owners; the command goes through the bus under each object's key
  instead, and is handled in that object's order. Its id is derived from the
  cluster revision, so a redelivered cluster event sends nothing new. A Cluster
  Flotilla cannot read gets an ``InvalidCluster`` Warning Event and is
  dead-lettered. (Policies arrive validated: the watcher refuses invalid ones.)
* ``CapacityChanged`` — read the cluster's capacity record as it is now and send
  ``RescheduleRequested`` to the Pending objects it could help
  (`flotilla.scheduler.state.helped_by`: one replica of theirs fits there, and no
  filter other than capacity turned the cluster down). Growth is not required: a
  record rebuilt after Redis lost its data has the same figures but no
  reservations, and Pending objects decided meanwhile saw no record at all. An
  object is asked once per record (same ``observed_at`` and headroom), so
  repeated reports do not loop. The cluster is marked stale in this replica's
  shared snapshot, and a ``RescheduleRequested`` is always decided on a snapshot
  read after it was sent (`Scheduler._fleet`), so the retry sees the change that
  triggered it, on whichever replica decides it.

One decision (`Scheduler.decide`):

1. read the placement record (the local index, which follows the bucket; after a
   lost compare-and-set, the bucket itself); drop the event if the record has
   acted on a newer hub revision;
2. wait until this replica has taken in every cluster written so far; then, one
   decision at a time per replica, take the capacity snapshot (`Scheduler._fleet`:
   read whole every ``snapshot_max_age``, patched in between) and run
   ``core.schedule``;
3. if the placement changed, reserve the capacity of the new replicas atomically
   in Redis (one reservation per object and cluster, id = object key, replaced on
   every change, so a retry or a second replica never counts twice); a refused
   reservation means someone else took the room: undo, re-read the clusters that
   refused, decide again (the same placement refused twice is kept back, below);
4. write the record by compare-and-set; a conflict undoes the reservations and
   decides again from the record that won;
5. release the reservations on clusters the object left, and publish
   ``PlacementDecided`` with a deterministic message id.

Only a changed placement is published. A redelivered event whose decision is
already recorded (the service died between writing and acking) re-publishes the
recorded ``PlacementDecided`` unchanged, which JetStream deduplicates. An object
nothing can take is recorded as Pending and decided again only when a change that
can help it arrives, never on a timer.

Reservations hold every replica placed on a cluster until they expire
(``reservation_ttl``); until then the member's own capacity report may count the
same pods too. That errs on the side of not overcommitting; the syncer may release
a reservation early once it has reported the pods.

A replica that dies between reserving (step 3) and recording (step 4) leaves
reservations no record backs, and the redelivered event may well decide
differently. Every replica therefore reconciles (`Scheduler.reconcile_reservations`,
at start and every ``reservation_grace`` seconds): a reservation older than
``reservation_grace`` on a cluster its object's record does not hold is released.
The grace leaves alone the claims of decisions still in flight, which write
their record within seconds. Work in flight on a dead replica comes back within
the consumers' ack wait (`flotilla.common.topology.ConsumerSpec`, 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from flotilla.common import api, capacity, events, kube
from flotilla.common.api import PlacementState
from flotilla.common.bus import Bus
from flotilla.common.capacity import CapacityCache
from flotilla.common.config import Settings
from flotilla.common.dispatch import Received
from flotilla.common.errors import (
    ConfigError,
    FlotillaError,
    InvalidObject,
    TemporaryError,
    Unavailable,
)
from flotilla.common.events import (
    CapacityChanged,
    ClusterObserved,
    ClusterPlacement,
    RescheduleRequested,
    ResourceAnalyzed,
)
from flotilla.common.middleware import Reporter
from flotilla.common.rediscapacity import DEFAULT_PREFIX, RedisCapacityCache
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.common.store import Conflict, Follower, Store
from flotilla.scheduler import core, state
from flotilla.scheduler.model import Decision, Fleet, SchedulingInput
from flotilla.scheduler.records import ClusterRecord, PlacementRecord

log = logging.getLogger(__name__)

SERVICE = "scheduler"

CACHE_CONCURRENCY = 48
"""Capacity cache calls in flight at once per replica."""

MAX_ATTEMPTS = 8
"""Decisions of one event before it is handed back to the bus (nak) to try later."""


class SchedulerSettings(Settings):
    """The scheduler's own settings (``FLOTILLA_RESERVATION_TTL`` …) on top of the common ones."""

    reservation_ttl: float = Field(
        default=300.0,
        gt=0,
        description="seconds a reservation holds capacity for replicas not yet reported",
    )
    sync_timeout: float = Field(
        default=5.0,
        gt=0,
        description="how long a decision waits for this replica to see the newest clusters",
    )
    snapshot_max_age: float = Field(
        default=0.5,
        ge=0,
        description="seconds between whole capacity snapshot reads (patched between; 0: always)",
    )
    reservation_grace: float = Field(
        default=30.0,
        gt=0,
        description="seconds before a reservation no placement record backs is released "
        "(and between those checks)",
    )
    capacity_prefix: str = Field(
        default=DEFAULT_PREFIX,
        min_length=1,
        description="Redis key prefix of the capacity cache (the syncer's must match)",
    )


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a decision is being made: the event, and what it asks for."""

    event_id: str
    uid: str
    generation: int
    revision: int
    avoid: frozenset[str] = frozenset()
    fresh_after: float = 0.0
    """Epoch seconds; the capacity snapshot must have been read after this (a
    ``RescheduleRequested`` must see the change that sent it)."""


JsonObject = dict[str, Any]


UNSCHEDULABLE_REASON = "Unschedulable"
PARTIALLY_SCHEDULED_REASON = "PartiallyScheduled"


class Scheduler:
    """One replica's handlers and the state they share."""

    def __init__(
        self,
        *,
        bus: Bus,
        cache: CapacityCache,
        placements: Store[PlacementRecord],
        clusters: Store[ClusterRecord],
        reservation_ttl: float = 300.0,
        sync_timeout: float = 5.0,
        snapshot_max_age: float = 0.5,
        reporter: Reporter | None = None,
        reservation_grace: float = 30.0,
    ) -> None:
        self.bus = bus
        self.reservation_grace = reservation_grace
        self.reporter = reporter
        self.cache = cache
        self.placements = placements
        self.clusters_store = clusters
        self.reservation_ttl = reservation_ttl
        self.sync_timeout = sync_timeout
        self.snapshot_max_age = snapshot_max_age
        self._shared: tuple[Fleet, capacity.Snapshot, int, float, float] | None = None
        """Fleet, snapshot, cluster view, and when it was read whole (monotonic, epoch)."""
        # Fan-out (claims on many clusters, many keys at once) must stay below the
        # capacity cache's connection pool (redis-py: 100), or calls fail outright.
        self._cache_slots = asyncio.Semaphore(CACHE_CONCURRENCY)
        self._deciding = asyncio.Lock()
        self._dirty: set[str] = set()
        """Clusters whose reservations this replica changed since the shared snapshot."""
        self.index = state.Index()
        self.clusters = state.Clusters()
        self.placements_view = Follower(placements, on_change=self.index.apply)
        self.clusters_view = Follower(clusters, on_change=self.clusters.apply)
        self._capacity_seen: dict[str, tuple[object, frozenset[str]]] = {}
        """Cluster → its capacity record (observed_at, headroom) as last reported, and
        the Pending objects already asked to retry against it."""
        self.decisions = 0
        """Decisions made (for the benchmark and tests); published or not."""

    @classmethod
    async def open(
        cls,
        bus: Bus,
        cache: CapacityCache,
        *,
        reservation_ttl: float = 300.0,
        sync_timeout: float = 5.0,
        snapshot_max_age: float = 0.5,
        reporter: Reporter | None = None,
        reservation_grace: float = 30.0,
    ) -> Scheduler:
        return cls(
            bus=bus,
            cache=cache,
            placements=await bus.store(bus.topology.bucket("placements"), PlacementRecord),
            clusters=await bus.store(bus.topology.bucket("scheduler-clusters"), ClusterRecord),
            reservation_ttl=reservation_ttl,
            sync_timeout=sync_timeout,
            snapshot_max_age=snapshot_max_age,
            reporter=reporter,
            reservation_grace=reservation_grace,
        )

    def router(self) -> Router:
        router = Router(SERVICE)
        router.on(ResourceAnalyzed)(self.on_resource_analyzed)
        router.on(RescheduleRequested)(self.on_reschedule_requested)
        router.on(ClusterObserved)(self.on_cluster_observed)
        router.on(CapacityChanged)(self.on_capacity_changed)
        return router

    # --- following the buckets ------------------------------------------------------

    async def follow_placements(self) -> None:
        """Keep the index equal to the placements bucket (run under `Runtime.spawn`)."""
        await self.placements_view.run()

    async def follow_clusters(self) -> None:
        """Keep the cluster view equal to the clusters bucket (run under `Runtime.spawn`)."""
        await self.clusters_view.run()

    async def ready(self, timeout: float | None = None) -> None:
        """Until both buckets have been read once."""
        try:
            async with asyncio.timeout(timeout):
                await self.placements_view.caught_up()
                await self.clusters_view.caught_up()
        except TimeoutError:
            raise Unavailable("placement records or clusters not loaded yet") from None

    async def _sync_clusters(self) -> int:
        """Wait until every cluster written so far is in the local view; its revision."""
        await self.ready(self.sync_timeout)
        await self.clusters_view.sync(self.sync_timeout)
        return self.clusters.version

    async def forget_deleted(self, retention: float) -> None:
        """Forget deleted objects and removed clusters after `retention` seconds, for
        good (run under `Runtime.spawn`): the records are tombstoned, which drops
        them from every replica's memory, and the tombstones are purged from the
        buckets once every follower has had `retention` to see them."""
        while True:
            await asyncio.sleep(max(retention / 4, 0.05))
            await self.forget_deleted_once(retention)

    async def forget_deleted_once(self, retention: float) -> int:
        """One round of `forget_deleted`; how many records were tombstoned."""
        cutoff = time.monotonic() - retention

        async def forget(key: str) -> bool:
            entry = self.index.get(key)
            if entry is None or not entry.record.deleted:
                return False
            try:
                self.index.apply(key, None, await self.placements.delete(key, entry.version))
            except Conflict:  # re-created, or another replica was first
                return False
            return True

        keys = self.index.deleted_before(cutoff)
        forgotten = 0
        for start in range(0, len(keys), CACHE_CONCURRENCY):
            done = await asyncio.gather(*map(forget, keys[start : start + CACHE_CONCURRENCY]))
            forgotten += sum(done)
        for name in self.clusters.removed_before(cutoff):
            found = self.clusters.entries.get(name)
            if found is not None and found.record.cluster is None:
                with contextlib.suppress(Conflict):
                    self.clusters.apply(
                        name, None, await self.clusters_store.delete(name, found.version)
                    )
                    self._capacity_seen.pop(name, None)
                    forgotten += 1
        await self.placements.purge_tombstones(retention)
        await self.clusters_store.purge_tombstones(retention)
        return forgotten

    async def _fleet(
        self, view: int, *, refreshed: Collection[str] = (), fresh_after: float = 0.0
    ) -> Fleet:
        """The clusters and a capacity snapshot, kept up to date cheaply.

        Reading every cluster's record and reservations (and building the fleet, and
        filling the core's per-fleet memos) for each decision would make every
        decision pay for the whole fleet. The snapshot is read whole at most every
        `snapshot_max_age` seconds (or when the cluster view changed); in between,
        only the clusters this replica claimed or released on since (`_dirty`) and
        those that just refused a claim (`refreshed`) are re-read and patched in.
        What other replicas claimed meanwhile is caught by the claim itself, which
        is the atomic check: a refusal re-reads that cluster. A snapshot read before
        `fresh_after` (epoch seconds) is read whole again.
        """
        now = time.monotonic()
        wall = time.time()
        cached = self._shared
        if (
            cached is not None
            and cached[2] == view
            and now - cached[3] <= self.snapshot_max_age
            and cached[4] >= fresh_after
        ):
            fleet, snapshot, _, read_at, read_wall = cached
            stale = set(refreshed) | self._dirty
            if not stale:
                return fleet
            self._dirty.clear()
            async with self._cache_slots:
                part = await self.cache.snapshot(sorted(stale))
            records = {**snapshot.clusters, **part.clusters}
            for name in stale - part.clusters.keys():
                records.pop(name, None)
            patched = capacity.Snapshot(clusters=records, taken_at=part.taken_at)
            fleet = Fleet(self.clusters.live(), patched)
            self._shared = (fleet, patched, view, read_at, read_wall)
            return fleet
        self._dirty.clear()
        async with self._cache_slots:
            snapshot = await self.cache.snapshot()
        fleet = Fleet(self.clusters.live(), snapshot)
        self._shared = (fleet, snapshot, view, now, wall)
        return fleet

    # --- handlers --------------------------------------------------------------------

    async def on_resource_analyzed(self, event: Received[ResourceAnalyzed]) -> None:
        envelope, analyzed = event.envelope, event.payload
        metadata = analyzed.object.get("metadata") or {}
        cause = Cause(
            event_id=envelope.id,
            uid=envelope.uid or str(metadata.get("uid") or ""),
            generation=envelope.generation,
            revision=envelope.revision,
        )
        await self.decide(analyzed.ref.key, analyzed, cause)

    async def on_reschedule_requested(self, event: Received[RescheduleRequested]) -> None:
        envelope, command = event.envelope, event.payload
        key = command.ref.key
        await self.ready(self.sync_timeout)
        entry = self.index.get(key)
        stored = (entry.record, entry.version) if entry else await self.placements.get(key)
        if stored is None or stored[0].deleted:
            log.info("reschedule of %s ignored: nothing recorded for it", key)
            return
        record = stored[0]
        if command.release_retiring:
            # Make-before-break done: drop the Retiring entries, change nothing else.
            decided = core.release_retiring(record.decided, command.release_retiring)
            if record.cause == envelope.id or decided is not record.decided:
                released = record.model_copy(update={"decided": decided, "cause": envelope.id})
                if decided is not record.decided:  # Conflict: the bus retries on the new record
                    self.index.apply(
                        key, released, await self.placements.write(key, released, last=stored[1])
                    )
                    await self._release_left(
                        key, record.analyzed, record.clusters, decided.clusters
                    )
                await self._publish(released)
            if not command.avoid_clusters:
                return
        cause = Cause(
            event_id=envelope.id,
            uid=record.uid,
            generation=record.generation,
            revision=record.revision,
            avoid=frozenset(command.avoid_clusters),
            fresh_after=envelope.produced_at.timestamp(),
        )
        await self.decide(key, record.analyzed, cause, reschedule=True)

    async def on_cluster_observed(self, event: Received[ClusterObserved]) -> None:
        envelope, observed = event.envelope, event.payload
        name = observed.cluster
        new: api.Cluster | None = None
        if not observed.deleted:
            try:
                new = api.parse_as(api.Cluster, observed.object)
            except api.InvalidObjectError as error:
                raise InvalidObject(str(error), reason="InvalidCluster") from error
        stored = await self.clusters_store.get(name)
        old_record: ClusterRecord | None = stored[0] if stored else None
        if old_record is not None and old_record.cause == envelope.id:
            # Redelivered after the write: send the same requests again (same ids).
            old, version = old_record.previous, stored[1] if stored else 0
        else:
            if old_record is not None and 0 < envelope.revision < old_record.revision:
                log.info("stale ClusterObserved for %s dropped", name)
                return
            old = old_record.cluster if old_record else None
            if not state.relevant(old, new):
                return
            record = ClusterRecord(
                name=name, revision=envelope.revision, cluster=new, previous=old, cause=envelope.id
            )
            version = await self.clusters_store.write(name, record, last=stored[1] if stored else 0)
            self.clusters.apply(name, record, version)
        if observed.deleted:
            # Whatever was reserved there can never be used; the records follow below.
            with contextlib.suppress(Unavailable):
                await self.cache.remove(name)
        change = state.impact(old, new)
        await self.index_ready()
        keys = state.affected(self.index, name, change)
        await self._request(keys, f"cluster {name} changed", dedupe=("cluster", name, version))

    async def on_capacity_changed(self, event: Received[CapacityChanged]) -> None:
        envelope, changed = event.envelope, event.payload
        name = changed.cluster
        # Whatever decides next on this replica re-reads the cluster.
        self._dirty.add(name)
        async with self._cache_slots:
            room = (await self.cache.snapshot([name])).get(name)
        if room is None:
            return
        seen = (room.observed_at, tuple(sorted(room.headroom.items())))
        last, asked = self._capacity_seen.get(name, (None, frozenset()))
        if last != seen:
            asked = frozenset()
        await self.index_ready()
        helped = set()
        for key in self.index.waiting() - asked:
            entry = self.index.get(key)
            if entry is not None and state.helped_by(entry.record, name, room):
                helped.add(key)
        await self._request(
            helped, f"more capacity on {name}", dedupe=("capacity", name, envelope.id)
        )
        # Only once the requests are out, so a failed attempt is retried in full.
        self._capacity_seen[name] = (seen, asked | helped)

    async def readiness(self) -> bool | str:
        """For ``/readyz``: ready once both buckets have been read."""
        if self.placements_view.is_caught_up and self.clusters_view.is_caught_up:
            return True
        return "placement records or clusters not loaded yet"

    async def index_ready(self) -> None:
        await self.placements_view.caught_up(self.sync_timeout)

    async def _request(
        self, keys: Iterable[str], reason: str, *, dedupe: tuple[object, ...]
    ) -> None:
        batch = []
        for key in sorted(keys):
            entry = self.index.get(key)
            if entry is None:
                continue
            command = RescheduleRequested(ref=entry.record.analyzed.ref, reason=reason)
            batch.append(
                events.envelope(
                    command,
                    key=key,
                    producer=self.bus.producer,
                    uid=entry.record.uid,
                    dedupe=dedupe,
                )
            )
        if batch:
            log.info("%s: re-evaluating %d objects", reason, len(batch))
            await self.bus.publish_batch(batch)

    # --- one decision ----------------------------------------------------------------

    async def decide(
        self, key: str, analyzed: ResourceAnalyzed, cause: Cause, *, reschedule: bool = False
    ) -> None:
        """Decide `key`, record it by compare-and-set, reserve, publish (module docstring)."""
        policy = analyzed.policy_spec
        await self.index_ready()
        entry = self.index.get(key)
        stored: tuple[PlacementRecord, int] | None = (
            (entry.record, entry.version) if entry is not None else None
        )
        fresh_read = False
        refused: set[tuple[ClusterPlacement, ...]] = set()
        refusing: set[str] = set()
        for _attempt in range(MAX_ATTEMPTS):
            if stored is None and not fresh_read:
                stored = await self.placements.get(key)
                fresh_read = True
            current, version = stored if stored is not None else (None, 0)
            if current is not None:
                if current.cause == cause.event_id:
                    # Redelivered after the record was written: publish what was decided.
                    await self._publish(current)
                    return
                if not reschedule and cause.revision < current.revision:
                    log.info("stale %s (%d < %d) dropped", key, cause.revision, current.revision)
                    return
            view = await self._sync_clusters()
            previous = current.clusters if current is not None else ()
            # One decision at a time per replica, from choosing to claiming: the next
            # one then sees this one's claims (the clusters it touched are re-read),
            # so a replica's own decisions never race each other for the same room.
            # Records, publishing and acks stay concurrent.
            async with self._deciding:
                fleet = await self._fleet(view, refreshed=refusing, fresh_after=cause.fresh_after)
                refusing = set()
                decision = core.schedule(
                    SchedulingInput(
                        analyzed=analyzed,
                        policy=policy,
                        fleet=fleet,
                        now=datetime.now(UTC),
                        previous=previous,
                        dependency_placements=self.index.dependency_placements(
                            state.dependency_keys(analyzed)
                        ),
                        avoid_clusters=cause.avoid,
                    )
                )
                self.decisions += 1
                changed = current is None or _placement_changed(current, decision)
                reserved: list[str] = []
                held_back = ""
                if changed and current is not None and decision.clusters in refused:
                    # Refused again after re-reading the clusters that refused, so it
                    # cannot fit: the core keeps an object where it runs without
                    # re-checking room (an `any` Pod scaled up in place). Keep what
                    # runs and wait as Pending for room.
                    changed = False
                    held_back = f"{decision.reason}; does not fit now, placement kept"
                elif changed:
                    reserved, refusing = await self._reserve(
                        key, analyzed, previous, decision.clusters
                    )
                    self._dirty.update(reserved)
                    if refusing:
                        await self._undo(key, analyzed, previous, reserved)
                        refused.add(decision.clusters)
            if refusing:
                continue
            if changed or current is None:
                record = PlacementRecord(
                    key=key,
                    uid=cause.uid,
                    generation=cause.generation,
                    revision=max(cause.revision, current.revision if current else 0),
                    analyzed=analyzed,
                    decided=decision.to_event(previous),
                    schedulable=decision.schedulable,
                    pending=decision.pending,
                    cause=cause.event_id,
                )
            else:
                record = current.model_copy(
                    update={
                        "uid": cause.uid,
                        "generation": cause.generation,
                        "revision": max(cause.revision, current.revision),
                        "analyzed": analyzed,
                        "pending": _unplaced(analyzed, previous) if held_back else current.pending,
                        "held_back": held_back,
                    }
                )
                if record == current:
                    return
            try:
                written = await self.placements.write(key, record, last=version)
            except Conflict:
                await self._undo(key, analyzed, previous, reserved)
                self._dirty.update(reserved)
                stored = await self.placements.get(key)
                fresh_read = True
                continue
            self.index.apply(key, record, written)
            if not changed:
                return
            await self._release_left(key, analyzed, previous, decision.clusters)
            self._dirty.update(p.cluster for p in previous)
            await self._publish(record)
            await self._report(analyzed, record)
            followers = self.index.dependents(key)
            if self.clusters.version != view:
                followers.add(key)  # the fleet changed while deciding: look again
            await self._request(
                followers, f"placement of {key} changed", dedupe=("placement", key, written)
            )
            return
        raise TemporaryError(f"{key}: no decision held after {MAX_ATTEMPTS} attempts", delay=1.0)

    async def _report(self, analyzed: ResourceAnalyzed, record: PlacementRecord) -> None:
        """A Warning Event when the new placement leaves the object (partly) unplaced.

        Best effort: the decision is already durable and published, and a hub that
        does not answer must not hold placements back."""
        if self.reporter is None or analyzed.deleted:
            return
        if not record.schedulable:
            reason = UNSCHEDULABLE_REASON
        elif record.pending:
            reason = PARTIALLY_SCHEDULED_REASON
        else:
            return
        await self._warn(analyzed.object, reason, record.decided.reason)

    async def _warn(self, obj: JsonObject, reason: str, message: str) -> None:
        """A Warning Event on `obj`, best effort: a hub that does not answer must not
        hold placements back or keep a bad message from being dead-lettered."""
        if self.reporter is None:
            return
        try:
            await self.reporter.warning(obj, reason, message)
        except FlotillaError as error:
            name = (obj.get("metadata") or {}).get("name")
            log.warning("could not report %s for %s %s: %s", reason, obj.get("kind"), name, error)

    async def _publish(self, record: PlacementRecord) -> None:
        await self.bus.publish(
            events.envelope(
                record.decided,
                key=record.key,
                producer=self.bus.producer,
                uid=record.uid,
                generation=record.generation,
                revision=record.revision,
                dedupe=(record.decided.decision_id,),
            )
        )

    # --- reservations ---------------------------------------------------------------

    async def _reserve(
        self,
        key: str,
        analyzed: ResourceAnalyzed,
        previous: Sequence[ClusterPlacement],
        chosen: Sequence[ClusterPlacement],
    ) -> tuple[list[str], set[str]]:
        """Claim room on every Active cluster whose replicas changed, all at once.

        Returns the clusters touched (to undo) and those that refused. The
        claims go out concurrently: a ``copy`` over a hundred clusters would
        otherwise pay a hundred round trips, during which the room it saw fills up.
        """
        before = _active(previous)
        claims = [
            (placement.cluster, reservation_id, per_replica, count)
            for placement in chosen
            if placement.state is PlacementState.ACTIVE
            # Unchanged there: its reservation (or its reported pods) already count.
            and before.get(placement.cluster, -1) != (placement.replicas or 0)
            for reservation_id, per_replica, count in _shapes(key, analyzed, placement)
        ]
        held = await asyncio.gather(
            *(self._claim(cluster, rid, shape, count) for cluster, rid, shape, count in claims)
        )
        touched = [claim[0] for claim in claims]
        return touched, {cluster for cluster, ok in zip(touched, held, strict=True) if not ok}

    async def _undo(
        self,
        key: str,
        analyzed: ResourceAnalyzed,
        previous: Sequence[ClusterPlacement],
        touched: Iterable[str],
    ) -> None:
        """Put the reservations touched by a decision that did not hold back as they were."""
        before = {p.cluster: p for p in previous if p.state is PlacementState.ACTIVE}
        steps: list[Awaitable[object]] = []
        for cluster in dict.fromkeys(touched):
            placement = before.get(cluster)
            if placement is None:
                steps.append(self._release(key, analyzed, cluster))
                continue
            steps.extend(
                self._claim(cluster, rid, shape, count)
                for rid, shape, count in _shapes(key, analyzed, placement)
            )
        await asyncio.gather(*steps)

    async def _release_left(
        self,
        key: str,
        analyzed: ResourceAnalyzed,
        previous: Sequence[ClusterPlacement],
        chosen: Sequence[ClusterPlacement],
    ) -> None:
        kept = {p.cluster for p in chosen}
        await asyncio.gather(
            *(self._release(key, analyzed, p.cluster) for p in previous if p.cluster not in kept)
        )

    async def reconcile_reservations(self) -> int:
        """Release reservations that no placement record backs (see the module
        docstring) and are older than `reservation_grace`; how many were released."""
        await self.index_ready()
        names = sorted(c.metadata.name for c in self.clusters.live())
        if not names:
            return 0
        async with self._cache_slots:
            now = (await self.cache.snapshot(names)).taken_at  # the cache's own clock
        released = 0
        for cluster in names:
            async with self._cache_slots:
                held = await self.cache.reservations(cluster)
            for reservation in held:
                if now - (reservation.expires_at - self.reservation_ttl) < self.reservation_grace:
                    continue  # a decision in flight may not have written its record yet
                entry = self.index.get(reservation.id.split("#", 1)[0])
                if entry is not None and not entry.record.deleted and cluster in entry.clusters:
                    continue
                log.warning(
                    "releasing reservation %s on %s: no placement record holds it there",
                    reservation.id,
                    cluster,
                )
                async with self._cache_slots:
                    await self.cache.release(cluster, reservation.id)
                self._dirty.add(cluster)
                released += 1
        return released

    async def reconcile_forever(self) -> None:
        """`reconcile_reservations` now and every `reservation_grace` seconds (run
        under `Runtime.spawn`); a failed round is logged and tried again."""
        while True:
            try:
                await self.reconcile_reservations()
            except FlotillaError as error:
                log.warning("reservation reconciliation failed: %s", error)
            await asyncio.sleep(self.reservation_grace)

    async def _claim(self, cluster: str, rid: str, shape: dict[str, int], count: int) -> bool:
        async with self._cache_slots:
            return await self.cache.reserve(cluster, rid, shape, count, self.reservation_ttl)

    async def _release(self, key: str, analyzed: ResourceAnalyzed, cluster: str) -> None:
        ids = [key] + [f"{key}#{c.name}" for c in analyzed.components]
        for reservation_id in ids:
            async with self._cache_slots:
                await self.cache.release(cluster, reservation_id)


def _active(placements: Iterable[ClusterPlacement]) -> dict[str, int]:
    return {p.cluster: p.replicas or 0 for p in placements if p.state is PlacementState.ACTIVE}


def _shapes(
    key: str, analyzed: ResourceAnalyzed, placement: ClusterPlacement
) -> list[tuple[str, dict[str, int], int]]:
    """(reservation id, per-replica requests, replicas) to hold for one placement.

    A multi-component object reserves each component under its own id: one
    reservation of the summed set would be judged against single nodes, where a
    set that spans nodes never fits.
    """
    if analyzed.components:
        return [
            (f"{key}#{c.name}", dict(c.requests), c.replicas)
            for c in analyzed.components
            if c.replicas > 0
        ]
    replicas = placement.replicas if placement.replicas is not None else 1
    if replicas <= 0:
        return []
    return [(key, dict(analyzed.requests), replicas)]


def _unplaced(analyzed: ResourceAnalyzed, placed: Sequence[ClusterPlacement]) -> int:
    """Replicas of `analyzed` not running anywhere under `placed` (at least 1)."""
    wanted = analyzed.replicas if analyzed.replicas is not None else 1
    return max(wanted - sum(_active(placed).values()), 1)


def placement_identity(clusters: Iterable[ClusterPlacement]) -> frozenset[ClusterPlacement]:
    """What a placement *is*: which clusters hold how many replicas in which state.

    Strategies list clusters in score order, and scores move with capacity and
    load; two decisions that put the same replicas on the same clusters are the
    same placement, whatever order they list them in.
    """
    return frozenset(clusters)


def _placement_changed(current: PlacementRecord, decision: Decision) -> bool:
    return (
        placement_identity(current.decided.clusters) != placement_identity(decision.clusters)
        or current.deleted != decision.deleted
        or current.schedulable != decision.schedulable
        or current.pending != decision.pending
    )


async def setup(rt: Runtime) -> Scheduler:
    """Compose one replica: capacity cache, buckets, bucket followers, the consumer."""
    settings = rt.settings_as(SchedulerSettings)
    if not isinstance(rt.bus, Bus):
        raise ConfigError("the scheduler keeps its placement records in JetStream KV")
    cache = RedisCapacityCache.from_url(settings.redis_url, prefix=settings.capacity_prefix)
    rt.on_close(cache.aclose)
    reporter: Reporter | None = None
    if settings.hub_kubeconfig is not None:
        hub = await kube.hub_client(settings)
        rt.on_close(hub.close)
        reporter = kube.EventRecorder(hub, "flotilla-scheduler")
    else:
        log.warning("FLOTILLA_HUB_KUBECONFIG is not set: unschedulable objects get no Events")
    scheduler = await Scheduler.open(
        rt.bus,
        cache,
        reservation_ttl=settings.reservation_ttl,
        sync_timeout=settings.sync_timeout,
        snapshot_max_age=settings.snapshot_max_age,
        reporter=reporter,
        reservation_grace=settings.reservation_grace,
    )

    rt.spawn("follow-placements", scheduler.follow_placements)
    rt.spawn("follow-clusters", scheduler.follow_clusters)
    rt.spawn("forget-deleted", lambda: scheduler.forget_deleted(settings.tombstone_retention))
    rt.spawn("reconcile-reservations", scheduler.reconcile_forever)
    rt.health.add_readiness_check("placements", scheduler.readiness)
    rt.serve(scheduler.router(), reporter=reporter)
    return scheduler
