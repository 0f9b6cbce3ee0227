"""The drain coordinator service: the pure core (`flotilla.drain.draining`) wired to
the bus, the hub and two durable buckets.

Handlers (one `Router`, partitioned by key) only *record*:

* ``ResourceAnalyzed`` — the facts that bound a move: replicas, split or whole,
  the policy's failover, tolerations and drain timeout, and the floor (the
  Deployment's ``maxUnavailable`` and any PodDisruptionBudget in its namespace
  selecting its pods, read from the hub here).
* ``PlacementDecided`` — where the object is (Active and Retiring); a deleted
  object's record is removed.
* ``MemberStatusObserved`` — whether each copy is ready and how many replicas it
  has available.
* ``ClusterObserved`` — cordon, ``evictAfter``, taints, readiness and since when,
  and this coordinator's own conditions as the hub shows them.

Object records live in ``drain-objects``, cluster records in ``drain-clusters``;
every replica follows both. One loop per replica (`Coordinator.run`) plans
every object whose record changed, or whose clusters changed in what a plan reads
(`plan_facts`: not the conditions and count this coordinator writes back), and
every object with something due, then sleeps until the next due moment or the next
change: a drain starts at
``evictAfter``, a failover at the end of the toleration, whatever else arrives or
not. A plan that changes the record is written by compare-and-set *before* its
commands (``RescheduleRequested``) are sent, so of two replicas planning the
same object only one sends; the command ids are derived from the move, so a
resend after a crash is deduplicated by JetStream. Progress is in the records,
so a restarted coordinator carries on where it was.

Hub writes: Warning Events (``DrainTimeout``); the object's
``flotilla.io/failover-history`` annotation when its history grows; each
cluster's ``Cordoned``/``Draining``/``Drained`` conditions and ``placements``
through server-side apply on the status subresource with field manager
``flotilla-drain``, only when they differ from what the hub shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from pydantic import Field

from flotilla.common import api, events, kube
from flotilla.common.api import (
    FAILOVER_HISTORY_ANNOTATION,
    ClusterConditionType,
    ConditionStatus,
    Failover,
    Strategy,
    compact_json,
)
from flotilla.common.bus import Bus
from flotilla.common.config import Settings
from flotilla.common.dispatch import EventBus, Received
from flotilla.common.errors import ConfigError, FlotillaError, InvalidObject, Unavailable
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.common.store import Conflict, Entry, Follower, Store
from flotilla.drain import draining
from flotilla.drain.draining import ClusterRecord, Command, Member, ObjectRecord, Timing

log = logging.getLogger(__name__)

SERVICE = "drain"
FIELD_MANAGER = "flotilla-drain"
CAS_ATTEMPTS = 8
PLAN_CONCURRENCY = 64
OWN_CONDITIONS = frozenset(
    {ClusterConditionType.CORDONED, ClusterConditionType.DRAINING, ClusterConditionType.DRAINED}
)
JsonObject = dict[str, Any]
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class DrainSettings(Settings):
    settle_seconds: float = Field(
        default=60.0, ge=0, description="how long a failed cluster stays Ready before failback"
    )
    drain_timeout: float = Field(
        default=600.0, ge=0, description="seconds a drained copy waits for its replacement"
    )
    stuck_after: float = Field(
        default=5.0,
        ge=0,
        description="seconds before an object no other cluster takes is named in Draining",
    )
    retry_interval: float = Field(
        default=30.0, gt=0, description="seconds before an unanswered move is asked again"
    )
    max_sleep: float = Field(
        default=5.0, gt=0, description="the loop looks again at least this often"
    )


def cluster_record(
    name: str, obj: JsonObject, revision: int, before: ClusterRecord | None, now: datetime
) -> ClusterRecord:
    """A `ClusterRecord` from an observed Cluster (`InvalidObject` if unreadable)."""
    try:
        cluster = api.parse_as(api.Cluster, obj)
    except api.InvalidObjectError as error:
        raise InvalidObject(str(error), reason="InvalidCluster") from error
    ready_condition = cluster.status.condition(ClusterConditionType.READY)
    ready = ready_condition is not None and ready_condition.status is ConditionStatus.TRUE
    since = ready_condition.last_transition_time if ready_condition else None
    if since is None:
        since = before.since if before is not None and before.ready == ready else now
    return ClusterRecord(
        name=name,
        revision=revision,
        unschedulable=cluster.spec.unschedulable,
        evict_after=cluster.spec.evict_after,
        ready=ready,
        since=since,
        taints=cluster.spec.taints,
        conditions=[c for c in cluster.status.conditions if c.type in OWN_CONDITIONS],
        placements=cluster.status.placements,
    )


def plan_facts(cluster: ClusterRecord | None) -> tuple[Any, ...] | None:
    """What `draining.plan` reads of a cluster record: the conditions and placement
    count it also holds (as the hub shows them) are only for `_write_conditions`."""
    if cluster is None:
        return None
    return (
        cluster.unschedulable,
        cluster.evict_after,
        cluster.ready,
        cluster.since,
        tuple(cluster.taints),
    )


def member(observed: events.MemberStatusObserved) -> Member:
    available = observed.status.get("availableReplicas")
    if not isinstance(available, int) or isinstance(available, bool):
        available = None
    return Member(ready=bool(observed.ready) and observed.exists, available=available)


class Coordinator:
    """One replica's handlers, its loop and the views they share."""

    def __init__(
        self,
        bus: EventBus,
        dyn: DynamicClient,
        objects: Store[ObjectRecord],
        clusters: Store[ClusterRecord],
        *,
        recorder: kube.EventRecorder | None = None,
        timing: Timing = draining.DEFAULT_TIMING,
        clock: Clock = _now,
        max_sleep: float = 5.0,
    ) -> None:
        self.bus = bus
        self.dyn = dyn
        self.recorder = recorder
        self.timing = timing
        self.clock = clock
        self.max_sleep = max_sleep
        self.objects_view: Follower[ObjectRecord] = Follower(objects, self._object_changed)
        self.clusters_view: Follower[ClusterRecord] = Follower(clusters, self._cluster_changed)
        self.by_cluster: defaultdict[str, set[str]] = defaultdict(set)
        self._placed: dict[str, set[str]] = {}
        self.stuck: defaultdict[str, dict[str, str]] = defaultdict(dict)
        self._due: dict[str, datetime] = {}
        self._dirty: set[str] = set()
        self._dirty_clusters: set[str] = set()
        self._written: dict[str, tuple[list[tuple[str, str, str, str]], int]] = {}
        self._cluster_facts: dict[str, tuple[Any, ...] | None] = {}
        """cluster → its `plan_facts` when its objects were last marked for planning."""
        self._known: dict[str, Entry[ObjectRecord]] = {}
        """key → the record as this replica last wrote it, until the follower has it."""
        self._wake = asyncio.Event()
        self.commands_sent = 0

    @property
    def objects(self) -> Store[ObjectRecord]:
        return self.objects_view.store

    @property
    def clusters(self) -> Store[ClusterRecord]:
        return self.clusters_view.store

    def router(self) -> Router:
        router = Router(SERVICE)
        router.on(events.ResourceAnalyzed)(self.on_resource_analyzed)
        router.on(events.PlacementDecided)(self.on_placement_decided)
        router.on(events.MemberStatusObserved)(self.on_member_status_observed)
        router.on(events.ClusterObserved)(self.on_cluster_observed)
        return router

    # --- views ------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def _object_changed(self, key: str, value: ObjectRecord | None, revision: int) -> None:
        known = self._known.get(key)
        if known is not None and known.revision <= revision:
            del self._known[key]
        before = self._placed.pop(key, set())
        now = {p.cluster for p in value.clusters} if value is not None else set()
        for cluster in before - now:
            self.by_cluster[cluster].discard(key)
        for cluster in now:
            self.by_cluster[cluster].add(key)
        if now:
            self._placed[key] = now
        self._dirty.add(key)
        self._dirty_clusters |= before | now
        self.wake()

    def _cluster_changed(self, name: str, value: ClusterRecord | None, _revision: int) -> None:
        self._dirty_clusters.add(name)
        self.wake()
        facts = plan_facts(value)
        if self._cluster_facts.get(name) == facts:
            # Only what this coordinator wrote back (conditions, the placement
            # count) changed: no plan reads those, so nothing is planned again.
            return
        self._cluster_facts[name] = facts
        self._dirty |= self.by_cluster.get(name, set())
        # Objects that failed over from it may fail back (rare: a scan is fine).
        self._dirty |= {
            k for k, e in self.objects_view.entries.items() if name in e.value.failed_from
        }

    # --- handlers -------------------------------------------------------------------

    async def _update(
        self,
        key: str,
        ref: events.ObjectRef,
        change: Callable[[ObjectRecord], ObjectRecord | None],
    ) -> None:
        """Apply `change(record)` by compare-and-set (None from `change`: delete).

        The first attempt starts from the newest record this replica knows (its
        follower's, or its own write the follower has not brought back yet) without
        reading the bucket: a write is a compare-and-set, so a record changed
        meanwhile costs a `Conflict` and a read. A change that writes nothing is
        only trusted on a record read just now."""
        latest = self.latest(key)
        for _ in range(CAS_ATTEMPTS):
            stored = latest if latest is not None else await self.objects.get(key)
            current = stored.value if stored else ObjectRecord(key=key, ref=ref)
            updated = change(current)
            if latest is not None and updated == current:
                latest = None  # nothing to write: make sure against the bucket
                continue
            latest = None
            try:
                if updated is None:
                    if stored is not None:
                        await self.objects.delete(key, stored.revision)
                elif stored is None or updated != current:
                    await self._write(key, updated, stored.revision if stored else 0)
            except Conflict:
                continue
            return
        raise Unavailable(f"{key}: the drain record kept changing")

    def latest(self, key: str) -> Entry[ObjectRecord] | None:
        """The newest record of `key` this replica has seen or written (None: none)."""
        seen, written = self.objects_view.get(key), self._known.get(key)
        if written is None or (seen is not None and seen.revision >= written.revision):
            return seen
        return written

    async def _write(self, key: str, record: ObjectRecord, last: int) -> None:
        revision = await self.objects.write(key, record, last)
        seen = self.objects_view.get(key)
        if seen is None or seen.revision < revision:
            self._known[key] = Entry(record, revision)

    async def on_resource_analyzed(self, event: Received[events.ResourceAnalyzed]) -> None:
        analyzed = event.payload
        if analyzed.deleted:
            return  # the scheduler's PlacementDecided(deleted) removes the record
        policy = analyzed.policy_spec
        obj = analyzed.object
        split = analyzed.strategy is Strategy.SPLIT
        replicas = analyzed.replicas
        pdbs = await self._disruption_budgets(analyzed.ref) if split else []
        least = draining.floor(obj, replicas, pdbs) if split else 1
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        facts = {
            "uid": uid,
            "replicas": replicas,
            "split": split,
            "floor": least,
            "failover": (policy.failover if policy and policy.failover else Failover()),
            "tolerations": list(policy.tolerations) if policy else [],
            "timeout": (
                float(policy.drain_timeout_seconds)
                if policy and policy.drain_timeout_seconds is not None
                else None
            ),
        }
        await self._update(
            analyzed.ref.key,
            analyzed.ref,
            lambda r: r.model_copy(update={"ref": analyzed.ref, **facts}),
        )

    async def on_placement_decided(self, event: Received[events.PlacementDecided]) -> None:
        decided = event.payload
        if decided.deleted:
            await self._update(decided.ref.key, decided.ref, lambda _: None)
            return

        def placed(record: ObjectRecord) -> ObjectRecord:
            names = {p.cluster for p in decided.clusters}
            return record.model_copy(
                update={
                    "ref": decided.ref,
                    "clusters": list(decided.clusters),
                    "decision_id": decided.decision_id,
                    "rejections": {c: decided.reasons_for(c) for c in decided.rejected_clusters()},
                    "members": {c: m for c, m in record.members.items() if c in names},
                }
            )

        await self._update(decided.ref.key, decided.ref, placed)

    async def on_member_status_observed(self, event: Received[events.MemberStatusObserved]) -> None:
        observed = event.payload
        report = member(observed)

        def reported(record: ObjectRecord) -> ObjectRecord:
            members = dict(record.members)
            if observed.exists:
                members[observed.cluster] = report
            else:
                members.pop(observed.cluster, None)
            return record.model_copy(update={"members": members})

        await self._update(observed.ref.key, observed.ref, reported)

    async def on_cluster_observed(self, event: Received[events.ClusterObserved]) -> None:
        observed, revision = event.payload, event.envelope.revision
        for _ in range(CAS_ATTEMPTS):
            stored = await self.clusters.get(observed.cluster)
            before = stored.value if stored else None
            if before is not None and 0 < revision < before.revision:
                return  # an older observation than the one recorded
            try:
                if observed.deleted:
                    if stored is not None:
                        await self.clusters.delete(observed.cluster, stored.revision)
                    return
                record = cluster_record(
                    observed.cluster, observed.object, revision, before, self.clock()
                )
                if record != before:
                    await self.clusters.write(
                        observed.cluster, record, stored.revision if stored else 0
                    )
            except Conflict:
                continue
            return
        raise Unavailable(f"cluster {observed.cluster}: its record kept changing")

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        """Plan and act until cancelled (run it under `Runtime.spawn`)."""
        await self.objects_view.caught_up()
        await self.clusters_view.caught_up()
        self._dirty |= set(self.objects_view.entries)
        self._dirty_clusters |= set(self.clusters_view.entries)
        while True:
            self._wake.clear()
            now = self.clock()
            await self.tick(now)
            due = min(self._due.values(), default=None)
            delay = self.max_sleep
            if due is not None:
                delay = min(delay, max((due - now).total_seconds(), 0.0))
            if self._dirty:
                # Lost compare-and-sets: give the follower a moment to bring the news.
                delay = min(delay, 0.02)
            if delay > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a
                # cancellation that coincides with the wake-up, and the loop never ends.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def tick(self, now: datetime) -> None:
        """One round: plan what changed or is due, act, then write cluster conditions.

        Planning is pure and runs inline; only the plans that change a record (a
        write, then commands) are awaited, `PLAN_CONCURRENCY` at a time."""
        keys = self._dirty | {k for k, t in self._due.items() if t <= now}
        self._dirty = set()
        clusters = {name: entry.value for name, entry in self.clusters_view.entries.items()}
        acts = [
            planned
            for key in sorted(keys)
            if (planned := self._plan_one(key, clusters, now)) is not None
        ]
        for start in range(0, len(acts), PLAN_CONCURRENCY):
            chunk = acts[start : start + PLAN_CONCURRENCY]
            await asyncio.gather(*(self._act(key, entry, result) for key, entry, result in chunk))
        dirty_clusters, self._dirty_clusters = self._dirty_clusters, set()
        for name in sorted(dirty_clusters):
            # Read the record now, not from the snapshot planning used: a change that
            # arrived while planning was awaited has marked this cluster dirty, and
            # that mark is consumed here.
            current = self.clusters_view.entries.get(name)
            cluster = current.value if current is not None else None
            if cluster is not None:
                try:
                    await self._write_conditions(cluster, now)
                except FlotillaError as exc:
                    log.warning("conditions of cluster %s not written: %s", name, exc)
                    self._dirty_clusters.add(name)

    def _plan_one(
        self, key: str, clusters: Mapping[str, ClusterRecord], now: datetime
    ) -> tuple[str, Entry[ObjectRecord], draining.Plan] | None:
        """Plan `key` from the newest record known; what `_act` must carry out, if
        the plan changes the record."""
        entry = self.latest(key)
        for stuck in self.stuck.values():
            if stuck.pop(key, None) is not None:
                self._dirty_clusters |= self._placed.get(key, set())
        if entry is None:
            self._due.pop(key, None)
            return None
        result = draining.plan(entry.value, clusters, now, self.timing)
        for cluster, why in result.stuck.items():
            self.stuck[cluster][key] = why
            self._dirty_clusters.add(cluster)
        if result.next_at is not None:
            self._due[key] = result.next_at
        else:
            self._due.pop(key, None)
        if result.record is entry.value or result.record == entry.value:
            return None
        return key, entry, result

    async def _act(self, key: str, entry: Entry[ObjectRecord], result: draining.Plan) -> None:
        """Record the plan by compare-and-set, then send its commands (module docstring)."""
        try:
            await self._write(key, result.record, entry.revision)
        except Conflict:
            self._dirty.add(key)  # someone else moved it on: plan again on the news
            return
        except FlotillaError as exc:
            log.warning("drain progress of %s not recorded: %s", key, exc)
            self._dirty.add(key)
            return
        record = result.record
        for command in result.commands:
            await self._send(record, command)
        for reason, message in result.warnings:
            if self.recorder is not None:
                await self.recorder.warning(_stub(record), reason, message)
        if record.history != entry.value.history:
            await self._write_history(record)

    async def _send(self, record: ObjectRecord, command: Command) -> None:
        move = record.moves.get(command.cluster)
        started = move.started.isoformat() if move else ""
        payload = events.RescheduleRequested(
            ref=record.ref,
            reason=command.reason,
            avoid_clusters=([command.cluster] if command.kind == "avoid" else list(command.avoid)),
            release_retiring=[command.cluster] if command.kind == "release" else [],
        )
        try:
            await self.bus.publish(
                events.envelope(
                    payload,
                    key=record.key,
                    producer=self.bus.producer,
                    uid=record.uid,
                    dedupe=(command.kind, command.cluster, command.attempt, started),
                )
            )
            self.commands_sent += 1
        except FlotillaError as exc:
            # The move is recorded; its retry (`Timing.retry`) sends the command again.
            log.warning(
                "%s of %s from %s not sent: %s", command.kind, record.key, command.cluster, exc
            )

    # --- hub writes -----------------------------------------------------------------

    async def _write_history(self, record: ObjectRecord) -> None:
        value = compact_json([h.model_dump(mode="json", by_alias=True) for h in record.history])
        patch = {"metadata": {"annotations": {FAILOVER_HISTORY_ANNOTATION: value}}}
        ref = record.ref
        try:
            resource = await kube.resource_for(self.dyn, ref.api_version, ref.kind)
            await kube.merge_patch(self.dyn, resource, patch, ref.name, ref.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("failover history of %s not written: %s", ref.key, kube.translate(exc))
        except Exception as exc:
            log.warning("failover history of %s not written: %s", ref.key, kube.translate(exc))

    async def _write_conditions(self, cluster: ClusterRecord, now: datetime) -> None:
        placed = [
            entry.value
            for key in sorted(self.by_cluster.get(cluster.name, ()))
            if (entry := self.objects_view.get(key)) is not None
        ]
        conditions, count = draining.cluster_conditions(
            cluster, placed, self.stuck.get(cluster.name, {}), now
        )
        signature = sorted((c.type, c.status.value, c.reason, c.message) for c in conditions)
        if self._written.get(cluster.name) == (signature, count):
            return
        if cluster.placements == count and draining.same_conditions(conditions, cluster.conditions):
            self._written[cluster.name] = (signature, count)
            return
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "Cluster",
            "metadata": {"name": cluster.name},
            "status": {
                "conditions": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions
                ],
                "placements": count,
            },
        }
        try:
            resource = await kube.resource_for(self.dyn, api.API_VERSION, "Cluster")
            await kube.as_json(
                await self.dyn.server_side_apply(
                    resource.subresources["status"],
                    body=body,
                    name=cluster.name,
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                    serialize=False,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return  # removed meanwhile
            raise kube.translate(exc) from exc
        except FlotillaError:
            raise
        except Exception as exc:
            raise kube.translate(exc) from exc
        self._written[cluster.name] = (signature, count)

    async def _disruption_budgets(self, ref: events.ObjectRef) -> list[JsonObject]:
        """The namespace's PodDisruptionBudgets (best effort: none when unreadable)."""
        if ref.namespace is None:
            return []
        try:
            resource = await kube.resource_for(self.dyn, "policy/v1", "PodDisruptionBudget")
            listed = kube.checked(await self.dyn.get(resource, namespace=ref.namespace))
        except Exception as exc:
            log.warning("PodDisruptionBudgets of %s not read: %s", ref.namespace, exc)
            return []
        items = listed.get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _stub(record: ObjectRecord) -> JsonObject:
    """Enough of the hub object to hang an Event on."""
    ref = record.ref
    metadata: JsonObject = {"name": ref.name, "uid": record.uid}
    if ref.namespace:
        metadata["namespace"] = ref.namespace
    return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": metadata}


async def setup(rt: Runtime) -> Coordinator:
    """Compose one replica: hub client, buckets and followers, handlers, the loop."""
    settings = rt.settings_as(DrainSettings)
    if not isinstance(rt.bus, Bus):
        raise ConfigError("the drain coordinator keeps its records in JetStream KV")
    hub, dyn = await kube.hub_dynamic(settings)
    rt.on_close(hub.close)
    topology = rt.bus.topology
    recorder = kube.EventRecorder(hub, FIELD_MANAGER)
    coordinator = Coordinator(
        rt.bus,
        dyn,
        await rt.bus.store(topology.bucket("drain-objects"), ObjectRecord),
        await rt.bus.store(topology.bucket("drain-clusters"), ClusterRecord),
        recorder=recorder,
        timing=Timing(
            settle=settings.settle_seconds,
            timeout=settings.drain_timeout,
            stuck_after=settings.stuck_after,
            retry=settings.retry_interval,
        ),
        max_sleep=settings.max_sleep,
    )
    rt.spawn("objects", coordinator.objects_view.run)
    rt.spawn("clusters", coordinator.clusters_view.run)
    rt.serve(coordinator.router(), reporter=recorder)
    rt.spawn("coordinator", coordinator.run)
    return coordinator
