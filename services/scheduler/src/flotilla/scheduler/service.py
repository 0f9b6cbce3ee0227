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

One decision (`Scheduler.decide`), its parts in their own modules:

1. the placement record from the local index (which follows the bucket); an index
   miss is not looked up: the compare-and-set that creates the record fails if
   one exists, and the decision is made again from it. An event older than the
   record's hub revision is dropped;
2. decisions are made a **batch** at a time (`Scheduler._choose_batches`): a
   batch is every decision asked while the previous batch was being decided, at
   most one per key (a second decision of a key waits for the next batch, so one
   key's decisions keep their order). Per batch: wait until this replica has taken
   in every cluster written so far (one bucket round trip, `readmodel.SyncPoint`),
   take the fleet from the read model once (`flotilla.scheduler.readmodel`: patched,
   never rebuilt for capacity changes), then one decision after another run
   ``core.schedule`` and, when the placement changed, apply its claims to the read
   model at once, so the next decision already counts them. Each handler then goes
   on with its own decision; the batch's handlers resume together, so their claims
   leave in one Redis pipeline (`flotilla.common.rediscapacity`) and their record
   writes and publishes in the same few NATS writes. Batching here, not in the
   consumer: the bus hands a service one event at a time;
3. outside the batch, send the claims (`flotilla.scheduler.claims`) as one atomic,
   all-or-nothing script: reserve on every cluster whose replicas changed, release
   the clusters the object left (reservation id = object key, replaced on every
   change, so a retry or a second replica never counts twice). A refusal means
   someone else took the room: the clusters are re-read and the object decided
   again (the same placement refused twice is kept back, below);
4. write the record by compare-and-set; a conflict undoes the claims and decides
   again from the record that won — a replica that loses never publishes;
5. publish ``PlacementDecided`` with a deterministic message id; the event is
   acknowledged only after the handler returns, so after both are durable.
   A Warning Event for an object left (partly) unplaced is noted for
   `flotilla.scheduler.notices`, which writes it later, aggregated per object.

Only a changed placement is published. A redelivered event whose decision is
already recorded (the service died between writing and acking) re-publishes the
recorded ``PlacementDecided`` unchanged, which JetStream deduplicates. An object
nothing can take is recorded as Pending and decided again only when a change that
can help it arrives (`flotilla.scheduler.requeue`), never on a timer.

Reservations hold every replica placed on a cluster until they expire
(``reservation_ttl``); until then the member's own capacity report may count the
same pods too. That errs on the side of not overcommitting; the syncer may release
a reservation early once it has reported the pods.

A replica that dies between claiming (step 3) and recording (step 4) leaves
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from flotilla.common import api, events, kube
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
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.common.store import Conflict, Follower, Store
from flotilla.scheduler import claims, core, state
from flotilla.scheduler.model import Decision, Fleet, SchedulingInput
from flotilla.scheduler.notices import Notices
from flotilla.scheduler.readmodel import ReadModel, SyncPoint
from flotilla.scheduler.records import ClusterRecord, PlacementRecord
from flotilla.scheduler.requeue import Requeue

log = logging.getLogger(__name__)

SERVICE = "scheduler"

CACHE_CONCURRENCY = 48
"""Capacity cache calls in flight at once per replica."""

MAX_ATTEMPTS = 8
"""Decisions of one event before it is handed back to the bus (nak) to try later."""


class SchedulerSettings(Settings):
    """The scheduler's own settings (``FLOTILLA_RESERVATION_TTL`` …) on top of the common ones."""

    max_concurrency: int = Field(
        default=256,
        ge=1,
        description="events one replica handles at once; the scheduler's handlers mostly "
        "wait, for the batch their decision is made in and for acknowledgements, so more in "
        "flight makes larger batches and leaves the process less idle between round trips",
    )
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


@dataclass(frozen=True, slots=True)
class _Ask:
    """One decision asked of the next batch, and where its answer goes."""

    key: str
    analyzed: ResourceAnalyzed
    cause: Cause
    current: PlacementRecord | None
    refused: set[tuple[ClusterPlacement, ...]]
    answer: asyncio.Future[_Choice]


@dataclass(frozen=True, slots=True)
class _Choice:
    """What a batch decided for one ask: the decision, whether it changes the
    placement, its claims (already counted into the read model when not empty),
    the cluster view it was made at, and the batch it was made in (`Scheduler.batches`)."""

    view: int
    decision: Decision
    changed: bool
    plan: claims.Plan
    held_back: str
    batch: int


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
        # Fan-out (snapshot reads, reservation checks, many keys at once) must stay
        # below the capacity cache's connection pool (redis-py: 100), or calls fail
        # outright. Claims need no slot: the cache sends them one pipeline at a time.
        self._cache_slots = asyncio.Semaphore(CACHE_CONCURRENCY)
        self._deciding = asyncio.Lock()
        self.index = state.Index()
        self.clusters = state.Clusters()
        self.placements_view = Follower(placements, on_change=self.index.apply)
        self.clusters_view = Follower(clusters, on_change=self.clusters.apply)
        self.read_model = ReadModel(
            cache, self.clusters, max_age=snapshot_max_age, slots=self._cache_slots
        )
        self.claims = claims.Claims(cache, reservation_ttl)
        self.requeue = Requeue(bus, self.index)
        self.notices = Notices(reporter)
        self._cluster_sync = SyncPoint(self._sync_cluster_view)
        self._asks: list[_Ask] = []
        """Decisions asked for and not yet taken into a batch (`_choose_batches`)."""
        self._chooser: asyncio.Task[None] | None = None
        self.batches = 0
        """Batches of decisions made (for the benchmark and tests)."""
        self._policies = state.Interned[api.PlacementPolicySpec]()
        self._capacity_seen: dict[str, tuple[object, frozenset[str]]] = {}
        """Cluster → its capacity record (observed_at, headroom) as last reported, and
        the Pending objects already asked to retry against it."""
        self.decisions = 0
        """Decisions made (for the benchmark and tests); published or not."""

    @property
    def snapshot_max_age(self) -> float:
        """Seconds between whole capacity reads (`readmodel.ReadModel.max_age`)."""
        return self.read_model.max_age

    @snapshot_max_age.setter
    def snapshot_max_age(self, seconds: float) -> None:
        self.read_model.max_age = seconds

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
        await self._cluster_sync()
        return self.clusters.version

    async def _sync_cluster_view(self) -> None:
        await self.ready(self.sync_timeout)
        await self.clusters_view.sync(self.sync_timeout)

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

    # --- handlers --------------------------------------------------------------------

    def _interned(self, analyzed: ResourceAnalyzed) -> ResourceAnalyzed:
        """`analyzed` with its policy the one object kept for that value, so that the
        core's memos keyed by the policy serve every decision under it (`state.Interned`)."""
        if analyzed.policy_spec is None:
            return analyzed
        policy = self._policies.intern(analyzed.policy_spec)
        if policy is analyzed.policy_spec:
            return analyzed
        return analyzed.model_copy(update={"policy_spec": policy})

    async def on_resource_analyzed(self, event: Received[ResourceAnalyzed]) -> None:
        envelope, analyzed = event.envelope, self._interned(event.payload)
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
                    await self._release_reservations(
                        claims.plan(key, record.analyzed, record.clusters, decided.clusters)
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
        await self.decide(key, self._interned(record.analyzed), cause, reschedule=True)

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
        self.read_model.mark_stale([name])
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
        if self.placements_view.is_caught_up:
            return  # every decision asks: no timeout scope once loaded
        await self.placements_view.caught_up(self.sync_timeout)

    async def _request(
        self, keys: Iterable[str], reason: str, *, dedupe: tuple[object, ...]
    ) -> None:
        await self.requeue.request(keys, reason, dedupe=dedupe)

    # --- one decision ----------------------------------------------------------------

    async def decide(
        self, key: str, analyzed: ResourceAnalyzed, cause: Cause, *, reschedule: bool = False
    ) -> None:
        """Decide `key`, claim, record it by compare-and-set, publish (module docstring)."""
        await self.index_ready()
        entry = self.index.get(key)
        stored: tuple[PlacementRecord, int] | None = (
            (entry.record, entry.version) if entry is not None else None
        )
        refused: set[tuple[ClusterPlacement, ...]] = set()
        for _attempt in range(MAX_ATTEMPTS):
            current, version = stored if stored is not None else (None, 0)
            if current is not None:
                if current.cause == cause.event_id:
                    # Redelivered after the record was written: publish what was decided.
                    await self._publish(current)
                    return
                if not reschedule and cause.revision < current.revision:
                    log.info("stale %s (%d < %d) dropped", key, cause.revision, current.revision)
                    return
            # Decided in a batch with whatever else is waiting (`_choose_batches`);
            # claims, records, publishing and acks stay concurrent.
            choice = await self._choose(key, analyzed, cause, current, refused)
            decision, changed, plan = choice.decision, choice.changed, choice.plan
            if plan:
                try:
                    refusing = await self.claims.submit(plan)
                except BaseException:
                    # No answer: whether it was applied is unknown; re-read.
                    self.read_model.settled(plan, applied=False)
                    raise
                self.read_model.settled(plan, applied=not refusing)
                if refusing:
                    refused.add(decision.clusters)
                    continue
            record = self._record(
                key, analyzed, cause, current, decision, changed, choice.held_back
            )
            if record is None:
                return
            try:
                written = await self.placements.write(key, record, last=version)
            except Conflict:
                if plan:
                    await self.claims.undo(plan)
                    self.read_model.mark_stale(plan.clusters)
                stored = await self.placements.get(key)
                continue
            self.index.apply(key, record, written)
            if not changed:
                return
            await self._publish(record)
            self._report(key, analyzed, record)
            followers = self.index.dependents(key)
            if self.clusters.version != choice.view:
                followers.add(key)  # the fleet changed while deciding: look again
            if followers:
                await self._request(
                    followers, f"placement of {key} changed", dedupe=("placement", key, written)
                )
            return
        raise TemporaryError(f"{key}: no decision held after {MAX_ATTEMPTS} attempts", delay=1.0)

    async def _choose(
        self,
        key: str,
        analyzed: ResourceAnalyzed,
        cause: Cause,
        current: PlacementRecord | None,
        refused: set[tuple[ClusterPlacement, ...]],
    ) -> _Choice:
        """This decision, made in the next batch (see `_choose_batches`)."""
        answer: asyncio.Future[_Choice] = asyncio.get_running_loop().create_future()
        ask = _Ask(key, analyzed, cause, current, refused, answer)
        self._asks.append(ask)
        if self._chooser is None:
            self._chooser = asyncio.create_task(self._choose_batches(), name="scheduler-batches")
        try:
            return await ask.answer
        except asyncio.CancelledError:
            # Cancelled (the handler's deadline) after the batch counted the plan in:
            # nothing will claim it, so the read model must not keep counting it.
            answered = answer.done() and not answer.cancelled() and answer.exception() is None
            if answered and answer.result().plan:
                self.read_model.settled(answer.result().plan, applied=False)
            raise

    async def _choose_batches(self) -> None:
        """Decide what is asked, a batch at a time, until nothing is left.

        A batch is everything asked while the previous one was being decided, at
        most one decision per key (a second one of a key waits for the next batch,
        so one key's decisions keep their order). The batch shares one cluster sync
        and one read of the fleet, and is decided one decision after another under
        the decision lock, each plan counted into the read model at once, so the next
        decision sees it. The callers then claim, record and publish concurrently
        (their claims go out in one Redis pipeline, `rediscapacity`)."""
        try:
            while self._asks:
                batch: list[_Ask] = []
                later: list[_Ask] = []
                keys: set[str] = set()
                for ask in self._asks:
                    if ask.answer.done():
                        continue  # its caller gave up
                    if ask.key in keys:
                        later.append(ask)
                        continue
                    keys.add(ask.key)
                    batch.append(ask)
                self._asks = later
                if batch:
                    self.batches += 1
                    await self._choose_batch(batch)
        except BaseException as error:
            for ask in self._asks:
                if not ask.answer.done():
                    ask.answer.set_exception(Unavailable(f"decisions stopped: {error!r}"))
            self._asks = []
            raise
        finally:
            self._chooser = None

    async def _choose_batch(self, batch: list[_Ask]) -> None:
        try:
            view = await self._sync_clusters()
            fresh_after = max(ask.cause.fresh_after for ask in batch)
            async with self._deciding:
                fleet = await self.read_model.fleet(view, fresh_after=fresh_after)
                now = datetime.now(UTC)
                for ask in batch:
                    if ask.answer.done():
                        continue
                    try:
                        choice = self._choose_one(ask, fleet, view, now)
                    except Exception as error:
                        ask.answer.set_exception(error)
                    else:
                        ask.answer.set_result(choice)
        except BaseException as error:
            for ask in batch:
                if not ask.answer.done():
                    if isinstance(error, Exception):
                        ask.answer.set_exception(error)
                    else:
                        ask.answer.set_exception(Unavailable(f"decisions stopped: {error!r}"))
            if not isinstance(error, Exception):
                raise

    def _choose_one(self, ask: _Ask, fleet: Fleet, view: int, now: datetime) -> _Choice:
        """One decision of a batch, its plan counted into the read model."""
        analyzed, current = ask.analyzed, ask.current
        previous = current.clusters if current is not None else ()
        decision = core.schedule(
            SchedulingInput(
                analyzed=analyzed,
                policy=analyzed.policy_spec,
                fleet=fleet,
                now=now,
                previous=previous,
                dependency_placements=self.index.dependency_placements(
                    state.dependency_keys(analyzed)
                ),
                avoid_clusters=ask.cause.avoid,
            )
        )
        self.decisions += 1
        changed = current is None or _placement_changed(current, decision)
        plan = claims.Plan()
        held_back = ""
        if changed and current is not None and decision.clusters in ask.refused:
            # Refused again after re-reading the clusters that refused, so it cannot
            # fit: the core keeps an object where it runs without re-checking room
            # (an `any` Pod scaled up in place). Keep what runs and wait as Pending.
            changed = False
            held_back = f"{decision.reason}; does not fit now, placement kept"
        elif changed:
            plan = claims.plan(
                ask.key,
                analyzed,
                previous,
                decision.clusters,
                held_for=current.analyzed if current is not None else None,
            )
            if plan:
                self.read_model.apply(plan)
        return _Choice(view, decision, changed, plan, held_back, self.batches)

    @staticmethod
    def _record(
        key: str,
        analyzed: ResourceAnalyzed,
        cause: Cause,
        current: PlacementRecord | None,
        decision: Decision,
        changed: bool,
        held_back: str,
    ) -> PlacementRecord | None:
        """The record to write for `decision`; None when the stored one says it all."""
        previous = current.clusters if current is not None else ()
        if changed or current is None:
            return PlacementRecord(
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
        return None if record == current else record

    def _report(self, key: str, analyzed: ResourceAnalyzed, record: PlacementRecord) -> None:
        """Note a Warning Event when the new placement leaves the object (partly)
        unplaced; `notices` writes it off the decision path."""
        if analyzed.deleted or (record.schedulable and not record.pending):
            self.notices.clear(key)
            return
        reason = UNSCHEDULABLE_REASON if not record.schedulable else PARTIALLY_SCHEDULED_REASON
        self.notices.note(key, analyzed.object, reason, record.decided.reason)

    async def _release_reservations(self, plan: claims.Plan) -> None:
        """Carry out a plan that only releases (a Retiring copy dropped)."""
        if not plan:
            return
        self.read_model.apply(plan)
        try:
            await self.claims.submit(plan)
        except BaseException:
            self.read_model.settled(plan, applied=False)
            raise
        self.read_model.settled(plan, applied=True)

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
                self.read_model.mark_stale([cluster])
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


def _unplaced(analyzed: ResourceAnalyzed, placed: Sequence[ClusterPlacement]) -> int:
    """Replicas of `analyzed` not running anywhere under `placed` (at least 1)."""
    wanted = analyzed.replicas if analyzed.replicas is not None else 1
    return max(wanted - sum(p.replicas or 0 for p in claims.active(placed).values()), 1)


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
    rt.spawn("notices", scheduler.notices.run)
    rt.health.add_readiness_check("placements", scheduler.readiness)
    rt.serve(scheduler.router(), reporter=reporter)
    return scheduler


async def sees_ready(bus: Bus, names: Iterable[str]) -> bool:
    """Whether the scheduler's own view of the clusters (its clusters bucket, what it
    decides against) has every one of `names` Ready: what a test or a benchmark waits
    for before it creates work, since the hub's status reaches it through the watcher."""
    records = await bus.store(bus.topology.bucket("scheduler-clusters"), ClusterRecord)
    for name in names:
        entry = await records.get(name)
        cluster = entry.value.cluster if entry else None
        ready = cluster.status.condition("Ready") if cluster else None
        if ready is None or ready.status != "True":
            return False
    return True
