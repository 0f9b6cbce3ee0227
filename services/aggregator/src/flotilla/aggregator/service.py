"""The status aggregator service: member reports in, one status on the hub object.

Handlers (one `Router`, partitioned by key, so one object's events come in order):

* ``PlacementDecided`` — record the object's placement (reports of clusters it
  left are dropped); a deleted object's record is removed.
* ``MemberStatusObserved`` — record the member's latest report; flush only if the
  placement names its cluster (a fold reads no other: the removed copy of a
  released cluster reports its end after the decision that dropped it, and a
  report that comes before its decision is folded when the decision comes).
* ``ClusterObserved`` — record whether the cluster is Ready in a bucket every
  replica follows (a cluster event reaches one replica only); a change re-folds
  every object placed there, so a dead cluster's members turn stale at once.

Both object records live in the ``aggregator-reports`` bucket, written by
compare-and-set, so a restarted aggregator forgets nothing: at start it loads
them and folds each object once more (writes that change nothing are skipped).

**Writing.** The handler only records and marks the object dirty; one flush per
object runs `coalesce_window` seconds later and folds whatever arrived meanwhile
(`flotilla.aggregator.aggregation.fold`), so nine member reports of a 3/3/3
Deployment become one hub write. A busy aggregator (more than `BUSY_FLUSHES` flushes
waiting) stretches the window in proportion, up to `BUSY_WINDOW`: in a drain of a
thousand objects each one's reports (its new copy created, then ready, its old copy
released) come a second or so apart, and every flush is two hub writes that the hub,
its watchers and this replica pay for while the drain itself waits for CPU; the hub
then shows a status up to that much later, and an idle aggregator writes as soon as
before. One flush per object writes at a time (what arrives meanwhile is folded by
the next), so an older fold never lands last. A flush starts from the hub object as
this replica last wrote it (else it reads it), writes the ``flotilla.io/placement``
and ``flotilla.io/cluster-status`` annotations with a merge patch and then the
status through the status subresource (a merge patch of what changed; the breakdown
first, so whoever reads a status finds beside it the per-cluster entries it was
folded from, a dead member already marked stale), each only when it differs and each
with that ``resourceVersion`` as precondition: a 409 is retried from the latest
object, and a fold that the remembered object already shows is checked against a
fresh read before nothing is written. A flush that fails (hub unreachable) is
retried with backoff; the record is durable, so nothing is lost meanwhile. Records
are written by compare-and-set from the record this replica last wrote, without
reading it first (a record changed meanwhile costs a `Conflict` and a read).

**Interpreters.** The built-in ones, plus the hub's ResourceInterpreters, listed
at start and every `interpreter_refresh` seconds (invalid ones are skipped: the
dependency detector reports them to their authors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from pydantic import BaseModel, ConfigDict, Field

from flotilla.aggregator import aggregation
from flotilla.aggregator.aggregation import MemberReport, ObjectReports
from flotilla.common import api, events, kube
from flotilla.common.api import (
    CLUSTER_STATUS_ANNOTATION,
    PLACEMENT_ANNOTATION,
    ClusterConditionType,
    ConditionStatus,
    Strategy,
)
from flotilla.common.bus import Bus
from flotilla.common.config import Settings
from flotilla.common.dispatch import Received
from flotilla.common.errors import ConfigError, FlotillaError, InvalidObject, Unavailable
from flotilla.common.interpreters import (
    DuplicateInterpreterError,
    InvalidInterpreterError,
    Registry,
)
from flotilla.common.router import Router
from flotilla.common.service import Runtime, cancel_and_wait
from flotilla.common.store import Conflict, Entry, Follower, Recent, Store

log = logging.getLogger(__name__)

SERVICE = "aggregator"
COMPONENT = "flotilla-aggregator"
WRITE_ATTEMPTS = 5
CAS_ATTEMPTS = 8
BUSY_FLUSHES = 64
"""Flushes waiting to start beyond which a new one waits longer than the window."""
BUSY_WINDOW = 2.0
"""The longest a busy aggregator's flush waits (seconds; never less than the window)."""
FLUSH_CONCURRENCY = 32
"""Flushes writing to the hub at once. Unbounded, a burst of a thousand objects
opened a connection per flush (up to the client's pool of 100) in one go: TLS
handshakes piled up on a busy API server and connects timed out (retried, but
late). A few dozen writes at a time keep a hub busy without the storm."""
REMEMBERED = 10_000
"""Objects whose record and hub object a replica remembers (the least recently
used are forgotten: they are read again when next needed)."""
JsonObject = dict[str, Any]


class ClusterReadiness(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ready: bool
    revision: int = 0


class AggregatorSettings(Settings):
    coalesce_window: float = Field(
        default=0.2, ge=0, description="seconds a flush waits to fold more member reports in"
    )
    interpreter_refresh: float = Field(
        default=30.0, gt=0, description="seconds between reloads of the hub's ResourceInterpreters"
    )


def cluster_ready(obj: JsonObject) -> bool:
    """Whether a Cluster's Ready condition is True (a Cluster Flotilla cannot read is not)."""
    try:
        cluster = api.parse_as(api.Cluster, obj)
    except api.InvalidObjectError:
        return False
    ready = cluster.status.condition(ClusterConditionType.READY)
    return ready is not None and ready.status is ConditionStatus.TRUE


class Aggregator:
    """One replica's handlers, flushes and the views they share."""

    def __init__(
        self,
        dyn: DynamicClient,
        reports: Store[ObjectReports],
        clusters: Store[ClusterReadiness],
        *,
        window: float = 0.2,
    ) -> None:
        self.dyn = dyn
        self.reports = reports
        self.clusters_view: Follower[ClusterReadiness] = Follower(clusters, self._cluster_changed)
        self.window = window
        self.registry = Registry.with_builtins()
        self.by_cluster: defaultdict[str, set[str]] = defaultdict(set)
        """cluster → keys of objects placed there (what a readiness change re-folds)."""
        self._pending: dict[str, asyncio.Task[None]] = {}
        """key → its flush that has not started writing yet (what new reports join)."""
        self._writing: set[str] = set()
        """Keys whose flush is writing now: a report meanwhile waits for it (`_again`)."""
        self._flush_slots = asyncio.Semaphore(FLUSH_CONCURRENCY)
        """Flushes writing to the hub at once (`FLUSH_CONCURRENCY`)."""
        self._again: set[str] = set()
        """Keys to flush once more when their current flush is done."""
        self._flushes: set[asyncio.Task[None]] = set()
        self._records: Recent[Entry[ObjectReports]] = Recent(REMEMBERED)
        """key → its record as this replica last wrote it (`_update` starts from it)."""
        self._hub: Recent[JsonObject] = Recent(REMEMBERED)
        """key → the hub object as this replica last wrote or read it (`flush`)."""
        self.status_writes = 0
        self.annotation_writes = 0
        self.conflicts = 0

    def router(self) -> Router:
        router = Router(SERVICE)
        router.on(events.PlacementDecided)(self.on_placement_decided)
        router.on(events.MemberStatusObserved)(self.on_member_status_observed)
        router.on(events.ClusterObserved)(self.on_cluster_observed)
        return router

    # --- views ------------------------------------------------------------------------

    @property
    def not_ready(self) -> set[str]:
        return {k for k, e in self.clusters_view.entries.items() if not e.value.ready}

    def _cluster_changed(self, name: str, _value: ClusterReadiness | None, _revision: int) -> None:
        for key in list(self.by_cluster.get(name, ())):
            self.schedule(key)

    def _index(self, record: ObjectReports) -> None:
        placement = record.placement
        for keys in self.by_cluster.values():
            keys.discard(record.key)
        if placement is not None and not placement.deleted:
            for placed in placement.clusters:
                self.by_cluster[placed.cluster].add(record.key)

    async def resume(self) -> None:
        """Fold every recorded object once (a restarted replica forgets nothing)."""
        for key, entry in (await self.reports.load()).items():
            self._index(entry.value)
            self.schedule(key)

    async def load_interpreters(self) -> None:
        resource = await kube.resource_for(self.dyn, api.API_VERSION, "ResourceInterpreter")
        try:
            listed = kube.checked(await self.dyn.get(resource))
        except Exception as exc:
            raise kube.translate(exc) from exc
        registry = Registry.with_builtins()
        for item in listed.get("items") or []:
            item.setdefault("apiVersion", api.API_VERSION)
            item.setdefault("kind", "ResourceInterpreter")
            try:
                registry.register(api.parse_as(api.ResourceInterpreter, item))
            except (
                api.InvalidObjectError,
                InvalidInterpreterError,
                DuplicateInterpreterError,
            ) as exc:
                log.info("ResourceInterpreter skipped: %s", exc)
        self.registry = registry

    async def refresh_interpreters(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.load_interpreters()
            except FlotillaError as exc:
                log.warning("could not refresh interpreters: %s", exc)

    # --- handlers -------------------------------------------------------------------

    async def _update(
        self, key: str, change: Callable[[ObjectReports], ObjectReports | None]
    ) -> ObjectReports | None:
        """Apply `change(record)` by compare-and-set (None from `change`: delete).

        The first attempt starts from the record as this replica last wrote or read
        it, without reading the bucket: a write from it is a compare-and-set, so a
        record changed meanwhile (another replica) only costs a `Conflict` and a read.
        A change that writes nothing is only trusted on a record read just now."""
        known = self._records.pop(key, None)
        for _ in range(CAS_ATTEMPTS):
            stored = known if known is not None else await self.reports.get(key)
            current = stored.value if stored else ObjectReports(key=key)
            updated: ObjectReports | None = change(current)
            if known is not None and updated == current:
                known = None  # nothing to write: make sure against the bucket
                continue
            known = None
            try:
                if updated is None:
                    if stored is not None:
                        await self.reports.delete(key, stored.revision)
                elif updated != current or stored is None:
                    revision = await self.reports.write(
                        key, updated, stored.revision if stored else 0
                    )
                    stored = Entry(updated, revision)
            except Conflict:
                continue
            if updated is not None and stored is not None:
                self._records.put(key, stored)
            return updated
        raise Unavailable(f"{key}: the aggregator record kept changing")

    async def on_placement_decided(self, event: Received[events.PlacementDecided]) -> None:
        decided = event.payload
        key = decided.ref.key
        if decided.deleted:
            await self._update(key, lambda _: None)
            self._hub.pop(key)
            self._index(ObjectReports(key=key))
            return
        record = await self._update(key, lambda r: r.with_placement(decided))
        if record is not None:
            self._index(record)
            self.schedule(key)

    async def on_member_status_observed(self, event: Received[events.MemberStatusObserved]) -> None:
        observed = event.payload
        report = MemberReport.of(observed, event.envelope.produced_at)
        record = await self._update(observed.ref.key, lambda r: r.with_report(report))
        placement = record.placement if record is not None else None
        if placement is not None and any(p.cluster == observed.cluster for p in placement.clusters):
            self.schedule(observed.ref.key)

    async def on_cluster_observed(self, event: Received[events.ClusterObserved]) -> None:
        observed, revision = event.payload, event.envelope.revision
        ready = not observed.deleted and cluster_ready(observed.object)
        store = self.clusters_view.store
        for _ in range(CAS_ATTEMPTS):
            stored = await store.get(observed.cluster)
            if stored is not None and (
                stored.value.ready == ready or 0 < revision < stored.value.revision
            ):
                return
            record = ClusterReadiness(name=observed.cluster, ready=ready, revision=revision)
            try:
                await store.write(observed.cluster, record, stored.revision if stored else 0)
            except Conflict:
                continue
            return
        raise Unavailable(f"cluster {observed.cluster}: readiness record kept changing")

    # --- flushing -------------------------------------------------------------------

    def schedule(self, key: str, delay: float | None = None) -> None:
        """Fold and write `key` once the window has passed (one pending flush per key).

        One flush per key writes at a time: a flush still writing folded the record
        as it was when it started, so a second one running beside it could be
        overtaken by it and the hub left showing the older reports for good. A report
        arriving while a flush writes is folded by the next flush, started when that
        one is done."""
        if key in self._writing:
            self._again.add(key)
        elif key not in self._pending:
            wait = self.flush_delay() if delay is None else delay
            task = asyncio.create_task(self._flush_later(key, wait))
            self._pending[key] = task
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    def flush_delay(self) -> float:
        """How long a new flush waits: the window, stretched in proportion to the
        flushes already waiting beyond `BUSY_FLUSHES` (at most `BUSY_WINDOW`)."""
        waiting = len(self._pending)
        if waiting <= BUSY_FLUSHES:
            return self.window
        return max(self.window, min(self.window * waiting / BUSY_FLUSHES, BUSY_WINDOW))

    async def _flush_later(self, key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        # Reports arriving from here on schedule the next flush.
        self._pending.pop(key, None)
        self._writing.add(key)
        retry: float | None = None
        try:
            async with self._flush_slots:
                await self.flush(key)
        except FlotillaError as exc:
            log.warning("status of %s not written (retrying): %s", key, exc)
            retry = min(max(delay * 2, 0.5), 30.0)
        finally:
            self._writing.discard(key)
        if retry is not None:
            self._again.discard(key)  # the retry folds whatever arrived meanwhile
            self.schedule(key, retry)
        elif key in self._again:
            self._again.discard(key)
            self.schedule(key)

    async def close(self) -> None:
        tasks = list(self._flushes)  # pending ones and those writing right now
        self._pending.clear()
        self._again.clear()
        await cancel_and_wait(tasks)

    async def flush(self, key: str) -> None:
        """Fold the recorded reports into the hub object (module docstring).

        The hub object this replica last wrote (or read) stands in for a fresh read
        when the fold differs from it: each write names its ``resourceVersion``, so
        an object changed meanwhile answers 409 and is read again. A fold that the
        remembered object already shows is checked against a fresh read before
        nothing is written (another replica may have written since)."""
        stored = await self.reports.get(key)
        obj = self._hub.pop(key, None)
        if stored is None or stored.value.placement is None:
            return
        record = stored.value
        placement = record.placement
        assert placement is not None
        ref = placement.ref
        interpreter = self.registry.lookup(
            api.GroupVersionKind.from_api_version(ref.api_version, ref.kind)
        )
        try:
            resource = await kube.resource_for(self.dyn, ref.api_version, ref.kind)
        except InvalidObject:
            return  # the hub no longer serves the type: nothing to write to
        for _ in range(WRITE_ATTEMPTS):
            remembered = obj is not None
            if obj is None:
                obj = await kube.get_or_none(self.dyn, resource, ref.name, ref.namespace)
                if obj is None:
                    return
            metadata = obj.get("metadata") or {}
            found = obj.get("status")
            current_status: JsonObject = found if isinstance(found, dict) else {}
            previous = current_status.get("observedGeneration")
            folded = aggregation.fold(
                placement,
                record.members,
                interpreter.status_rules,
                whole=interpreter.spec.strategy is Strategy.ANY,
                not_ready=self.not_ready,
                hub_generation=metadata.get("generation"),
                previous_observed=previous if isinstance(previous, int) else None,
            )
            write_status = current_status != folded.status and bool(
                resource.subresources.get("status")
            )
            annotations = metadata.get("annotations") or {}
            wanted = {
                PLACEMENT_ANNOTATION: folded.placement,
                CLUSTER_STATUS_ANNOTATION: folded.cluster_status,
            }
            write_annotations = any(annotations.get(k) != v for k, v in wanted.items())
            if remembered and not (write_status or write_annotations):
                obj = None  # nothing to write by the remembered object: read the hub's
                continue
            try:
                # The breakdown first, then the sums: whoever reads a status already
                # finds the per-cluster entries (a stale member marked) it was folded from.
                if write_annotations:
                    patch = {
                        "metadata": {
                            "annotations": wanted,
                            "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion"),
                        }
                    }
                    obj = await kube.merge_patch(self.dyn, resource, patch, ref.name, ref.namespace)
                    self.annotation_writes += 1
                if write_status:
                    obj = await self._write_status(resource, ref, obj, folded.status)
                    self.status_writes += 1
                self._hub.put(key, _essentials(obj))
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise kube.translate(exc) from exc
                self.conflicts += 1
                obj = None
            except FlotillaError:
                raise
            except Exception as exc:
                raise kube.translate(exc) from exc
        raise Unavailable(f"{key}: the hub object kept changing under the status write")

    async def _write_status(
        self, resource: Any, ref: events.ObjectRef, obj: JsonObject, status: JsonObject
    ) -> JsonObject:
        """`status` on the status subresource, preconditioned on `obj`'s resourceVersion:
        a merge patch of what changed (a small body, not the whole object), or the
        whole object when a merge patch cannot say it."""
        found = obj.get("status")
        patch = aggregation.merge_patch_for(found if isinstance(found, dict) else {}, status)
        subresource = resource.subresources["status"]
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if patch is not None:
            body = {"metadata": {"resourceVersion": version}, "status": patch}
            return await kube.merge_patch(self.dyn, subresource, body, ref.name, ref.namespace)
        if "kind" not in obj:  # remembered in part (`_essentials`): the whole one is needed
            whole = await kube.get_or_none(self.dyn, resource, ref.name, ref.namespace)
            if whole is None:
                raise ApiException(status=404, reason="NotFound")
            if (whole.get("metadata") or {}).get("resourceVersion") != version:
                raise ApiException(status=409, reason="Conflict")
            obj = whole
        return await kube.as_json(
            await self.dyn.replace(
                subresource,
                body={**obj, "status": status},
                name=ref.name,
                namespace=ref.namespace,
                serialize=False,
            )
        )


def _essentials(obj: JsonObject) -> JsonObject:
    """What the next flush reads of a hub object it remembers: the precondition, the
    generation, the two annotations and the status (not the spec nor managedFields,
    which would make a replica's memory grow with the size of every object)."""
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    ours = (PLACEMENT_ANNOTATION, CLUSTER_STATUS_ANNOTATION)
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "generation": metadata.get("generation"),
            "annotations": {k: annotations[k] for k in ours if k in annotations},
        },
        "status": obj.get("status"),
    }


async def setup(rt: Runtime) -> Aggregator:
    """Compose one replica: the hub client, the buckets, the handlers and the flushes."""
    settings = rt.settings_as(AggregatorSettings)
    if not isinstance(rt.bus, Bus):
        raise ConfigError("the aggregator keeps its records in JetStream KV")
    hub, dyn = await kube.hub_dynamic(settings)
    rt.on_close(hub.close)
    topology = rt.bus.topology
    aggregator = Aggregator(
        dyn,
        await rt.bus.store(topology.bucket("aggregator-reports"), ObjectReports, memo=REMEMBERED),
        await rt.bus.store(topology.bucket("aggregator-clusters"), ClusterReadiness),
        window=settings.coalesce_window,
    )
    rt.on_close(aggregator.close)  # runs before the hub client closes (last registered first)
    with contextlib.suppress(FlotillaError):
        await aggregator.load_interpreters()
    rt.spawn("clusters", aggregator.clusters_view.run)
    await aggregator.clusters_view.caught_up(30.0)
    await aggregator.resume()
    rt.serve(aggregator.router(), reporter=kube.EventRecorder(hub, COMPONENT))
    rt.spawn("interpreters", lambda: aggregator.refresh_interpreters(settings.interpreter_refresh))
    return aggregator
