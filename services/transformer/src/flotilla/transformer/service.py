"""The transformer service: analyses and decisions in, one `WorkRendered` per work out.

Handlers (one `Router`, partitioned by the object's key, so an object's analyses
and decisions arrive in the order they were published):

* ``ResourceAnalyzed`` and ``PlacementDecided`` — store what the event says about
  the object in its `ObjectRecord`, then reconcile the object's works
  (`Transformer.reconcile`) from the record: level-triggered, so either event, a
  redelivery or a replay converges to the same works.
* ``ResourceAnalyzed`` of an ``as-needed`` object a policy selects (a ConfigMap
  that changed) also refreshes its works on the clusters where objects need it.
* ``ConfigChanged`` — forget the cached transformations (a changed Transformation
  applies from the next render of each object it names).

One reconciliation (`Transformer.reconcile`):

1. read the record (a placed object needs both its analysis and its decision;
   until it has both, or once either says deleted, it wants no works at all);
2. read what rendering needs from the hub: the Clusters' labels and reported API
   resources, the transformations the object names, its dependencies and its own
   Namespace (only ``as-needed`` ones that exist are synced along; the dependency
   detector has already warned about missing ones); Clusters and transformations
   are cached briefly (`HUB_CACHE_TTL`);
3. render (`flotilla.transformer.rendering`, pure); a work that fails (a failing
   transformation, a cluster that does not serve the type) gets a Warning Event
   naming the cluster and the reason and is skipped: the other clusters' works go
   out, and what that cluster already has stays until a render succeeds or the
   object leaves it;
4. move this object in and out of each dependency's `DependentsRecord` by
   compare-and-set, which says who needs it where;
5. publish, in one batch, dependencies first (Namespace first) on the clusters
   where their content is not what was last published there (the first dependent
   arrives, or the dependency renders differently now: a further dependent alone
   publishes nothing, so a namespace of n objects is not n Namespace works), then
   the object's own works where they differ from what was last published there
   (`own_digest`: the manifest without the decision annotation),
   then removals (``manifest: None``): the object's own on
   clusters that left the decision, and each dependency's on clusters where
   nobody needs it now; then record in the dependents records what was published;
6. write the record (compare-and-set; a lost race reconciles again).

Publishing before recording keeps a crash harmless: the redelivered event renders
the same works again (deterministic event ids, deduplicated by JetStream); a
dependency's digest is recorded only after its work is published, so a crash in
between publishes it again rather than never.
A dependency removal races a dependent arriving on the same cluster through
another object (another key, maybe another replica): after publishing a removal,
the dependents record is read again and, if someone needs the dependency there
by now, its work is published once more, after the removal.

Decisions where the brief is silent:

* A decision that kept the object off clusters because they do not serve its type
  (its rejected clusters, checked against the clusters' reported ``apiResources``)
  gets one ``IncompatibleCluster`` Warning naming them; the scheduler's
  ``api-resources`` filter is what keeps the object off.
* Clusters are read from the hub (not followed from ``ClusterObserved``): a
  decision naming a cluster the cache does not know reads them again at once.
  A changed Cluster label or Transformation takes effect at each object's next
  render (its next analysis or decision), not by itself.
* A dependency's work carries the decision id of the render that sent it; the
  hub generation annotation is the dependency's own.
* Likewise an own work is sent only where the decision changed its manifest (its
  share, the object, its transformations), not for a new decision id or a new
  state alone: a drain's two decisions per object (the share moved off a cluster
  that turns Retiring and keeps its copy, then that cluster released) would
  otherwise re-send, re-apply and re-report every copy that stays as it was. Such
  a copy keeps the decision annotation of the decision that last changed it, and
  its last work event the state it was sent with (the syncer acts on manifests only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes_asyncio.dynamic import DynamicClient
from pydantic import Field, ValidationError

from flotilla.common import api, events, kube
from flotilla.common.api import GroupVersionKind, Strategy
from flotilla.common.bus import Bus
from flotilla.common.config import Settings
from flotilla.common.dispatch import EventBus, Received
from flotilla.common.errors import ConfigError, FlotillaError, InvalidObject
from flotilla.common.events import (
    ConfigChanged,
    Envelope,
    ObjectRef,
    PlacementDecided,
    ResourceAnalyzed,
    WorkRendered,
)
from flotilla.common.middleware import Reporter
from flotilla.common.queueing import KeyedLocks
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.common.store import Conflict, Store
from flotilla.transformer import rendering, transformations
from flotilla.transformer.records import DependentsRecord, ObjectRecord
from flotilla.transformer.rendering import Rendered, needed_clusters
from flotilla.transformer.steps import ClusterFacts
from flotilla.transformer.transformations import Catalog

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

SERVICE = "transformer"
COMPONENT = "flotilla-transformer"
HUB_CACHE_TTL = 2.0
"""Seconds the Clusters and transformations read from the hub are reused."""
MAX_ATTEMPTS = 8
"""Reconciliations of one event after lost compare-and-sets before it is retried later."""
DEPENDENTS_MEMO = 256
"""Dependents records kept parsed (`flotilla.common.store.Store` memo)."""
OBJECTS_MEMO = 1024
"""Object records kept parsed: each event of an object reads its record, which
holds the whole object, and this replica wrote most of them last."""
DEPENDENCY_OF_SHOWN = 8
"""Dependents a dependency's work names at most (the first by key): enough to see
why it is there, and a work event stays small whatever the fan-in."""
TRANSFORMATION_KINDS = frozenset(
    {transformations.TRANSFORMATION, transformations.CLUSTER_TRANSFORMATION}
)


class TransformerSettings(Settings):
    """The transformer's own settings on top of the common ones."""

    hub_cache_ttl: float = Field(
        default=HUB_CACHE_TTL,
        ge=0,
        description="seconds Clusters and transformations read from the hub are reused",
    )


class Hub(Protocol):
    """What the transformer reads from the hub (`KubeHub`; a fake in unit tests)."""

    async def clusters(self, *, fresh: bool = False) -> dict[str, ClusterFacts]:
        """The hub's Clusters; `fresh` reads them now rather than from the cache."""
        ...

    async def transformations(self) -> Catalog: ...

    async def get(self, ref: ObjectRef) -> JsonObject | None: ...

    def forget(self) -> None:
        """Drop cached transformations (one changed)."""


class _Cached:
    def __init__(self, ttl: float, load: Callable[[], Awaitable[Any]]) -> None:
        self.ttl = ttl
        self.load = load
        self.value: Any = None
        self.at = -1.0
        self.lock = asyncio.Lock()

    async def get(self) -> Any:
        async with self.lock:
            if self.at < 0 or time.monotonic() - self.at > self.ttl:
                self.value = await self.load()
                self.at = time.monotonic()
            return self.value

    def forget(self) -> None:
        self.at = -1.0


class KubeHub:
    """`Hub` over the hub's API server."""

    def __init__(self, dyn: DynamicClient, ttl: float = HUB_CACHE_TTL) -> None:
        self.dyn = dyn
        self._resources: dict[tuple[str, str], Any] = {}
        """(apiVersion, kind) → its discovered resource: the DynamicClient's lookup
        walks every group it knows, and each render reads its Namespace at least."""
        self._facts: dict[tuple[str, str], ClusterFacts] = {}
        """(Cluster name, resourceVersion) → its facts, from the last list."""
        self._clusters = _Cached(ttl, self._list_clusters)
        self._transformations = _Cached(ttl, self._list_transformations)

    async def clusters(self, *, fresh: bool = False) -> dict[str, ClusterFacts]:
        if fresh:
            self._clusters.forget()
        found: dict[str, ClusterFacts] = await self._clusters.get()
        return found

    async def transformations(self) -> Catalog:
        found: Catalog = await self._transformations.get()
        return found

    def forget(self) -> None:
        self._transformations.forget()

    async def _resource(self, api_version: str, kind: str) -> Any:
        """The discovered resource of a type (`InvalidObject` when nothing serves it,
        which is not remembered: a CRD may be installed later)."""
        found = self._resources.get((api_version, kind))
        if found is None:
            found = await kube.resource_for(self.dyn, api_version, kind)
            self._resources[(api_version, kind)] = found
        return found

    async def _list(self, kind: str) -> list[JsonObject]:
        resource = await self._resource(api.API_VERSION, kind)
        listed = await kube.get_or_none(self.dyn, resource)
        items: list[JsonObject] = (listed or {}).get("items") or []
        return items

    async def _list_clusters(self) -> dict[str, ClusterFacts]:
        found = {}
        known: dict[tuple[str, str], ClusterFacts] = {}
        for item in await self._list("Cluster"):
            metadata = item.get("metadata") or {}
            name = str(metadata.get("name"))
            version = (name, str(metadata.get("resourceVersion") or ""))
            facts = self._facts.get(version) if version[1] else None
            found[name] = known[version] = facts or cluster_facts(item)
        # What the Clusters were at the versions just read: a Cluster's status (its
        # apiResources, a few hundred entries) is written far less often than read.
        self._facts = known
        return found

    async def _list_transformations(self) -> Catalog:
        catalog: dict[tuple[str, str | None, str], api.TransformationSpec] = {}
        models: tuple[type[api.Transformation] | type[api.ClusterTransformation], ...] = (
            api.Transformation,
            api.ClusterTransformation,
        )
        for model in models:
            kind = model.model_fields["kind"].default
            for item in await self._list(kind):
                item.setdefault("apiVersion", api.API_VERSION)
                item.setdefault("kind", kind)
                try:
                    parsed = api.parse_as(model, item)
                except api.InvalidObjectError as exc:
                    log.warning("skipping %s: %s", kind, exc)
                    continue
                namespace = parsed.metadata.namespace or None
                catalog[(kind, namespace, parsed.metadata.name)] = parsed.spec
        return catalog

    async def get(self, ref: ObjectRef) -> JsonObject | None:
        try:
            resource = await self._resource(ref.api_version, ref.kind)
        except InvalidObject:
            return None
        return await kube.get_or_none(self.dyn, resource, ref.name, ref.namespace)


def cluster_facts(obj: Mapping[str, Any]) -> ClusterFacts:
    """What rendering needs of a hub `Cluster` object (read leniently: a Cluster
    the scheduler placed on is rendered for even if its status is odd)."""
    metadata = obj.get("metadata") or {}
    raw_labels = metadata.get("labels") or {}
    status = obj.get("status") or {}
    served = set()
    for resource in status.get("apiResources") or []:
        try:
            served.add(api.ApiResource.model_validate(resource).gvk)
        except ValidationError:
            continue
    return ClusterFacts(
        name=str(metadata.get("name")),
        labels={str(k): str(v) for k, v in raw_labels.items()},
        api_resources=frozenset(served),
    )


@dataclass
class _Outgoing:
    """What one reconciliation publishes, in order."""

    dependencies: list[Envelope]
    own: list[Envelope]
    removals: list[Envelope]
    dependency_removals: list[tuple[ObjectRef, str, int]]
    """(dependency, cluster, dependents revision) of each dependency removal."""
    published: list[tuple[ObjectRef, str, str]] = field(default_factory=list)
    """(dependency, cluster, content digest) of each dependency work published."""
    owned: list[tuple[str, str, str]] = field(default_factory=list)
    """(dependency key, cluster, digest) of the dependency works this reconciliation
    publishes for every render of this replica that needs the same at once."""
    waiting: list[tuple[asyncio.Future[bool], Envelope, tuple[ObjectRef, str, str]]] = field(
        default_factory=list
    )
    """Dependency works another render of this replica is publishing: its outcome,
    and the work to publish if that failed."""

    def batch(self) -> list[Envelope]:
        return [*self.dependencies, *self.own, *self.removals]


@dataclass(frozen=True)
class _DependentsChange:
    """One dependency's dependents before and after an update, and where its work
    must be published because its content there is not what was last published."""

    before: Mapping[str, Sequence[ObjectRef]]
    after: Mapping[str, Sequence[ObjectRef]]
    revision: int
    publish: frozenset[str]


def content_digest(manifest: Mapping[str, Any]) -> str:
    """A dependency manifest's digest without the decision annotation: the render
    of whichever dependent sent it names its decision, which is no change of
    content."""
    metadata = dict(manifest.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(api.DECISION_ANNOTATION, None)
    metadata["annotations"] = annotations
    return rendering.digest({**manifest, "metadata": metadata})


def own_digest(work: Rendered, uid: str) -> str:
    """What an own work says to its cluster: the hub object's uid and the manifest's
    `content_digest` (equal digests, nothing to send). Not its state: a copy turning
    Retiring keeps its manifest, and the syncer applies manifests, not states."""
    return f"{uid}:{content_digest(work.manifest)}"


class Transformer:
    """One replica's handlers and the state they share."""

    def __init__(
        self,
        *,
        bus: EventBus,
        hub: Hub,
        objects: Store[ObjectRecord],
        dependents: Store[DependentsRecord],
        reporter: Reporter | None = None,
    ) -> None:
        self.bus = bus
        self.hub = hub
        self.objects = objects
        self.dependents = dependents
        self.reporter = reporter
        self._dependency_locks = KeyedLocks()
        """Dependency key → its lock and how many updates hold or wait for it."""
        self._publishing: dict[tuple[str, str, str], asyncio.Future[bool]] = {}
        """(dependency key, cluster, digest) → whether the render publishing that
        dependency work published it (unresolved while it is in flight)."""

    def router(self) -> Router:
        router = Router(SERVICE)
        router.on(ResourceAnalyzed)(self.on_resource_analyzed)
        router.on(PlacementDecided)(self.on_placement_decided)
        router.on(ConfigChanged)(self.on_config_changed)
        return router

    async def on_config_changed(self, event: Received[ConfigChanged]) -> None:
        if event.payload.ref.kind in TRANSFORMATION_KINDS:
            self.hub.forget()

    async def on_resource_analyzed(self, event: Received[ResourceAnalyzed]) -> None:
        analyzed, envelope = event.payload, event.envelope

        def update(record: ObjectRecord) -> ObjectRecord | None:
            same_object = not record.uid or not envelope.uid or record.uid == envelope.uid
            if same_object and envelope.revision < record.analyzed_revision:
                return None  # an older analysis than one already taken in
            return record.model_copy(
                update={
                    "uid": envelope.uid or record.uid,
                    "analyzed": None if analyzed.deleted else analyzed,
                    "analyzed_revision": envelope.revision,
                }
            )

        await self.reconcile(analyzed.ref, envelope.key, update)
        if analyzed.strategy is Strategy.AS_NEEDED:
            await self._refresh_dependency(analyzed, envelope)

    async def on_placement_decided(self, event: Received[PlacementDecided]) -> None:
        decision = event.payload

        def update(record: ObjectRecord) -> ObjectRecord | None:
            return record.model_copy(update={"decision": None if decision.deleted else decision})

        await self.reconcile(decision.ref, event.envelope.key, update)
        if (decision.rejections or decision.rejected) and not decision.deleted:
            await self._report_incompatible(decision, event.envelope.key)

    async def _report_incompatible(self, decision: PlacementDecided, key: str) -> None:
        """A Warning naming the clusters the object was kept off because they do not
        serve its type (the scheduler's ``api-resources`` filter)."""
        gvk = GroupVersionKind.from_api_version(decision.ref.api_version, decision.ref.kind)
        lacking = rendering.incompatible(
            gvk, await self.hub.clusters(), decision.rejected_clusters()
        )
        if not lacking:
            return  # kept off for other reasons (a drained cluster): no record to read
        entry = await self.objects.get(key)
        if entry is None or entry.value.analyzed is None:
            return
        await self._warn(
            entry.value.analyzed.object,
            "IncompatibleCluster",
            f"not placed on cluster{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}: "
            f"{'they do' if len(lacking) > 1 else 'it does'} not serve {gvk}",
        )

    async def _refresh_dependency(self, analyzed: ResourceAnalyzed, envelope: Envelope) -> None:
        """An ``as-needed`` object a policy selects changed: its works on the clusters
        where objects need it carry the new content now (removed if it was deleted),
        rather than waiting for one of those objects to be rendered again."""
        entry = await self.dependents.get(analyzed.ref.key)
        if entry is None:
            return
        own = await self.objects.get(envelope.key)
        decision = own.value.decision if own else None
        decision_id = decision.decision_id if decision else ""
        clusters = await self.hub.clusters()
        batch: list[Envelope] = []
        for cluster, dependents in sorted(entry.value.clusters.items()):
            if analyzed.deleted:
                batch.append(
                    self._removal(
                        analyzed.ref,
                        cluster,
                        decision_id,
                        envelope.uid,
                        dedupe=("source-deleted", envelope.revision),
                    )
                )
                continue
            work = self._dependency_work(
                analyzed.object,
                rendering.facts(clusters, cluster),
                decision_id,
                dependents,
                entry.revision,
                dedupe=("source", envelope.revision),
            )
            if work is not None:
                batch.append(work)
        if batch:
            await self.bus.publish_batch(batch)

    # -- one reconciliation -------------------------------------------------------------

    async def reconcile(
        self, ref: ObjectRef, key: str, update: Callable[[ObjectRecord], ObjectRecord | None]
    ) -> None:
        for _ in range(MAX_ATTEMPTS):
            entry = await self.objects.get(key)
            current = entry.value if entry else ObjectRecord(ref=ref)
            record = update(current)
            if record is None:
                return
            try:
                await self._reconcile(key, record, entry.revision if entry else 0)
                return
            except Conflict:
                continue
        raise Conflict(f"{key}: the transformer's record kept changing")

    async def _reconcile(self, key: str, record: ObjectRecord, revision: int) -> None:
        wanted: dict[str, list[ObjectRef]] = {}
        outgoing = _Outgoing([], [], [], [])
        dependency_objects: dict[str, JsonObject] = {}
        published: dict[str, str] = {}
        if record.renderable:
            analyzed, decision = record.analyzed, record.decision
            assert analyzed is not None and decision is not None
            clusters = await self.hub.clusters()
            if needed_clusters(decision) - clusters.keys():
                # A cluster registered since the cache was read: its labels decide
                # transformations and defaults, so read them rather than guess.
                clusters = await self.hub.clusters(fresh=True)
            dependency_objects = await self._dependencies(analyzed)
            chosen = await self._transformations(analyzed, decision)
            rendered, failed = rendering.render_placement(analyzed, decision, clusters, chosen)
            for failure in failed:
                await self._warn(analyzed.object, failure.reason, failure.message)
            needed = [ObjectRef.of(obj) for obj in dependency_objects.values()]
            for placement in decision.clusters:
                wanted[placement.cluster] = needed
            for failure in failed:
                # A cluster that never had the work gets none; one that has it keeps
                # what it has until a render succeeds or the object leaves it.
                if failure.cluster not in record.works:
                    wanted.pop(failure.cluster, None)
            for work in rendered:
                digest = own_digest(work, record.uid)
                published[work.cluster] = digest
                if work.cluster in record.works and record.published.get(work.cluster) == digest:
                    continue  # the same content there: only the decision id would differ
                analyzed_at = record.analyzed_revision
                outgoing.own.append(
                    self._work(work, decision.decision_id, analyzed.object, analyzed_at)
                )
            for failure in failed:
                # What that cluster keeps is still what was last published there.
                if failure.cluster in record.published:
                    published[failure.cluster] = record.published[failure.cluster]
        decision_id = record.decision.decision_id if record.decision else ""
        try:
            await self._move_dependents(record, wanted, dependency_objects, outgoing)
            for cluster in sorted(set(record.works) - set(wanted)):
                outgoing.removals.append(
                    self._removal(
                        record.ref, cluster, decision_id, record.uid, (record.analyzed_revision,)
                    )
                )
            batch = outgoing.batch()
            if batch:
                await self.bus.publish_batch(batch)
        except BaseException:
            self._dependents_settle(outgoing, published=False)
            raise
        try:
            # Settled once recorded: a render whose update came before the record
            # waits for this one rather than sending the same again.
            await self._dependents_published(outgoing.published)
        finally:
            self._dependents_settle(outgoing, published=True)
        await self._dependents_wait(outgoing.waiting)
        await self._recheck(outgoing.dependency_removals, dependency_objects, decision_id)
        final = record.model_copy(
            update={
                "works": wanted,
                "published": {c: d for c, d in published.items() if c in wanted},
            }
        )
        if not wanted and record.analyzed is None and record.decision is None:
            if revision:
                await self.objects.delete(key, revision)
            return
        await self.objects.write(key, final, revision)

    async def _dependencies(self, analyzed: ResourceAnalyzed) -> dict[str, JsonObject]:
        """The object's ``as-needed`` dependencies as the hub has them now, by key."""
        found: dict[str, JsonObject] = {}
        refs = [
            ObjectRef(
                api_version=dependency.api_version,
                kind=dependency.kind,
                name=dependency.name,
                namespace=dependency.namespace,
            )
            for dependency in analyzed.dependencies
        ]
        if analyzed.ref.namespace:
            # Every namespaced object needs its Namespace; analyses leave it implicit.
            refs.append(ObjectRef(api_version="v1", kind="Namespace", name=analyzed.ref.namespace))
        for ref in refs:
            obj = await self.hub.get(ref)
            if obj is None or not rendering.is_as_needed(obj):
                continue
            obj.setdefault("apiVersion", ref.api_version)
            obj.setdefault("kind", ref.kind)
            found[ObjectRef.of(obj).key] = obj
        return dict(sorted(found.items()))

    async def _transformations(
        self, analyzed: ResourceAnalyzed, decision: PlacementDecided
    ) -> tuple[transformations.NamedTransformation, ...]:
        wanted = transformations.names(analyzed.object, analyzed.policy_spec)
        if not wanted:
            return ()
        chosen, missing = transformations.resolve(
            wanted, analyzed.ref.namespace, await self.hub.transformations()
        )
        if missing:
            await self._warn(
                analyzed.object,
                "TransformationNotFound",
                f"names transformations that do not exist: {', '.join(missing)}; "
                "the others are applied",
            )
        return chosen

    async def _move_dependents(
        self,
        record: ObjectRecord,
        wanted: Mapping[str, Sequence[ObjectRef]],
        objects: Mapping[str, JsonObject],
        outgoing: _Outgoing,
    ) -> None:
        """Update every dependency this object needs or needed; publish its work only
        where this render changes something: where its content differs from what was
        last published there (its first dependent there arrives, or it changed on the
        hub or in how it renders), and its removal where its last dependent left.

        Each further dependent on a cluster publishes nothing: a namespace of n
        objects is one Namespace work per cluster, not n ever larger ones."""
        held: dict[str, ObjectRef] = {}
        for refs in (*record.works.values(), *wanted.values()):
            held.update((ref.key, ref) for ref in refs)
        decision_id = record.decision.decision_id if record.decision else ""
        clusters = await self.hub.clusters() if held else {}
        for dep_key in sorted(held, key=lambda k: rendering.install_rank(held[k])):
            dependency = held[dep_key]
            needed_on = {c for c, refs in wanted.items() if any(r.key == dep_key for r in refs)}
            before = {c for c, refs in record.works.items() if any(r.key == dep_key for r in refs)}
            obj = objects.get(dep_key)
            manifests: dict[str, JsonObject] = {}
            if obj is not None:
                for cluster in sorted(needed_on):
                    manifest = self._render_dependency(
                        obj, rendering.facts(clusters, cluster), decision_id
                    )
                    if manifest is not None:
                        manifests[cluster] = manifest
            change = await self._dependents_update(
                dependency,
                record.ref,
                needed_on,
                {cluster: content_digest(m) for cluster, m in manifests.items()},
            )
            if obj is not None:
                for cluster in sorted(change.publish):
                    digest = content_digest(manifests[cluster])
                    work = self._dependency_work(
                        obj,
                        rendering.facts(clusters, cluster),
                        decision_id,
                        change.after[cluster],
                        change.revision,
                        manifest=manifests[cluster],
                    )
                    if work is None:
                        continue
                    in_flight = (dep_key, cluster, digest)
                    other = self._publishing.get(in_flight)
                    if other is not None:
                        # Another render of this replica is sending the same: one is enough.
                        outgoing.waiting.append((other, work, (dependency, cluster, digest)))
                        continue
                    self._publishing[in_flight] = asyncio.get_running_loop().create_future()
                    outgoing.owned.append(in_flight)
                    outgoing.dependencies.append(work)
                    outgoing.published.append((dependency, cluster, digest))
            for cluster in sorted(before - needed_on):
                if cluster not in change.after:
                    outgoing.removals.append(
                        self._removal(
                            dependency, cluster, decision_id, "", dedupe=(change.revision,)
                        )
                    )
                    outgoing.dependency_removals.append((dependency, cluster, change.revision))

    @contextlib.asynccontextmanager
    async def _one_update_at_a_time(self, key: str) -> AsyncIterator[None]:
        """This replica's updates of one dependents record, one after the other.

        Every object of a namespace needs its Namespace, so all their renders update
        one record; run concurrently they lose the compare-and-set to each other and
        read (parse) the growing record again for each retry. Serialising them here
        leaves the compare-and-set to settle only races with other replicas."""
        async with self._dependency_locks.hold(key):
            yield

    async def _dependents_update(
        self,
        dependency: ObjectRef,
        dependent: ObjectRef,
        needed_on: set[str],
        digests: Mapping[str, str],
    ) -> _DependentsChange:
        async with self._one_update_at_a_time(dependency.key):
            return await self._dependents_compare_and_set(dependency, dependent, needed_on, digests)

    async def _dependents_compare_and_set(
        self,
        dependency: ObjectRef,
        dependent: ObjectRef,
        needed_on: set[str],
        digests: Mapping[str, str],
    ) -> _DependentsChange:
        """`dependent` needs `dependency` exactly on `needed_on` from now on.

        `digests` are the dependency's content digests this render has for (some
        of) `needed_on`; the change says where they differ from what was last
        published (never published there counts as differing): there the work
        goes out. The digests are recorded only once published
        (`_dependents_published`)."""
        for _ in range(MAX_ATTEMPTS):
            entry = await self.dependents.get(dependency.key)
            current = entry.value.clusters if entry else {}
            published = entry.value.published if entry else {}
            after = rendering.dependents_after(current, dependent, needed_on)
            publish = frozenset(
                cluster
                for cluster, digest in digests.items()
                if cluster in needed_on and published.get(cluster) != digest
            )
            kept = {c: d for c, d in published.items() if c in after}
            if after == current and entry is not None:
                return _DependentsChange(current, after, entry.revision, publish)
            try:
                if not after:
                    if entry is None:
                        return _DependentsChange(current, after, 0, publish)
                    revision = await self.dependents.delete(dependency.key, entry.revision)
                else:
                    revision = await self.dependents.write(
                        dependency.key,
                        DependentsRecord(ref=dependency, clusters=after, published=kept),
                        entry.revision if entry else 0,
                    )
            except Conflict:
                continue
            return _DependentsChange(current, after, revision, publish)
        raise Conflict(f"{dependency.key}: its dependents kept changing")

    def _dependents_settle(self, outgoing: _Outgoing, *, published: bool) -> None:
        """Tell the renders waiting on this one's dependency works how it went."""
        for in_flight in outgoing.owned:
            future = self._publishing.pop(in_flight, None)
            if future is not None and not future.done():
                future.set_result(published)
        outgoing.owned.clear()

    async def _dependents_wait(
        self,
        waiting: Sequence[tuple[asyncio.Future[bool], Envelope, tuple[ObjectRef, str, str]]],
    ) -> None:
        """Publish the dependency works another render of this replica was to send
        and did not (its publish failed; its event is retried, but this render's
        object must not wait for that)."""
        failed = [(work, done) for future, work, done in waiting if not await future]
        if failed:
            await self.bus.publish_batch([work for work, _ in failed])
            await self._dependents_published([done for _, done in failed])

    async def _dependents_published(self, published: Sequence[tuple[ObjectRef, str, str]]) -> None:
        """Record the digests of the dependency works just published (on clusters
        that still need them), so the next dependent there publishes nothing."""
        by_dependency: dict[str, tuple[ObjectRef, dict[str, str]]] = {}
        for dependency, cluster, digest in published:
            by_dependency.setdefault(dependency.key, (dependency, {}))[1][cluster] = digest
        for key, (dependency, digests) in sorted(by_dependency.items()):
            async with self._one_update_at_a_time(key):
                await self._dependents_record_published(dependency, digests)

    async def _dependents_record_published(
        self, dependency: ObjectRef, digests: Mapping[str, str]
    ) -> None:
        for _ in range(MAX_ATTEMPTS):
            entry = await self.dependents.get(dependency.key)
            if entry is None:
                return
            record = entry.value
            published = dict(record.published)
            published.update((c, d) for c, d in digests.items() if c in record.clusters)
            if published == record.published:
                return
            try:
                await self.dependents.write(
                    dependency.key,
                    record.model_copy(update={"published": published}),
                    entry.revision,
                )
            except Conflict:
                continue
            return
        raise Conflict(f"{dependency.key}: its dependents kept changing")

    async def _recheck(
        self,
        removed: Sequence[tuple[ObjectRef, str, int]],
        objects: Mapping[str, JsonObject],
        decision_id: str,
    ) -> None:
        """Re-publish a removed dependency that another object needs there by now."""
        again: list[Envelope] = []
        for dependency, cluster, removed_at in removed:
            entry = await self.dependents.get(dependency.key)
            if entry is None or cluster not in entry.value.clusters:
                continue
            obj = objects.get(dependency.key) or await self.hub.get(dependency)
            if obj is None:
                continue
            clusters = await self.hub.clusters()
            work = self._dependency_work(
                obj,
                rendering.facts(clusters, cluster),
                decision_id,
                entry.value.clusters[cluster],
                entry.revision,
                dedupe=("after-removal", removed_at),
            )
            if work is not None:
                again.append(work)
        if again:
            await self.bus.publish_batch(again)

    # -- events -----------------------------------------------------------------------

    def _work(
        self, work: Rendered, decision_id: str, source: Mapping[str, Any], revision: int
    ) -> Envelope:
        """An own work; its id changes with the decision, the analysis and the manifest,
        so going back to an earlier manifest is a new event, not a duplicate."""
        metadata = source.get("metadata") or {}
        return events.envelope(
            WorkRendered(
                ref=work.ref,
                cluster=work.cluster,
                decision_id=decision_id,
                manifest=work.manifest,
                state=work.state,
            ),
            key=events.work_key(work.ref, work.cluster),
            producer=self.bus.producer,
            uid=str(metadata.get("uid") or ""),
            generation=rendering.hub_generation(source) or 0,
            revision=revision,
            dedupe=(decision_id, work.state.value, work.digest),
        )

    def _render_dependency(
        self, obj: JsonObject, cluster: ClusterFacts, decision_id: str
    ) -> JsonObject | None:
        try:
            return rendering.render_dependency(obj, cluster, decision_id)
        except transformations.RenderError as exc:
            log.warning("dependency %s not rendered: %s", ObjectRef.of(obj).key, exc)
            return None

    def _dependency_work(
        self,
        obj: JsonObject,
        cluster: ClusterFacts,
        decision_id: str,
        dependents: Sequence[ObjectRef],
        revision: int,
        dedupe: tuple[object, ...] = (),
        manifest: JsonObject | None = None,
    ) -> Envelope | None:
        """A dependency's work on one cluster (`manifest` if already rendered); its
        `dependency_of` names at most `DEPENDENCY_OF_SHOWN` of `dependents`."""
        if manifest is None:
            manifest = self._render_dependency(obj, cluster, decision_id)
            if manifest is None:
                return None
        ref = ObjectRef.of(obj)
        shown = sorted(dependents, key=lambda d: d.key)[:DEPENDENCY_OF_SHOWN]
        return events.envelope(
            WorkRendered(
                ref=ref,
                cluster=cluster.name,
                decision_id=decision_id,
                manifest=manifest,
                dependency_of=shown,
            ),
            key=events.work_key(ref, cluster.name),
            producer=self.bus.producer,
            uid=str((obj.get("metadata") or {}).get("uid") or ""),
            generation=rendering.hub_generation(obj) or 0,
            dedupe=(
                rendering.digest(manifest),
                revision,
                *(d.key for d in shown),
                *dedupe,
            ),
        )

    def _removal(
        self,
        ref: ObjectRef,
        cluster: str,
        decision_id: str,
        uid: str,
        dedupe: tuple[object, ...] = (),
    ) -> Envelope:
        return events.envelope(
            WorkRendered(ref=ref, cluster=cluster, decision_id=decision_id, manifest=None),
            key=events.work_key(ref, cluster),
            producer=self.bus.producer,
            uid=uid,
            dedupe=("removed", decision_id, *dedupe),
        )

    async def _warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        log.warning("%s: %s", reason, message)
        if self.reporter is not None:
            with contextlib.suppress(FlotillaError):
                await self.reporter.warning(dict(obj), reason, message)


async def setup(rt: Runtime) -> Transformer:
    """Compose one replica: the hub client, the buckets, the handlers."""
    settings = rt.settings_as(TransformerSettings)
    if not isinstance(rt.bus, Bus):
        raise ConfigError("the transformer keeps its records in JetStream KV")
    if settings.hub_kubeconfig is None:
        raise ConfigError(
            "the transformer reads dependencies from the hub: set FLOTILLA_HUB_KUBECONFIG"
        )
    hub_api = await kube.hub_client(settings)
    rt.on_close(hub_api.close)
    dyn = await DynamicClient(hub_api)
    reporter = kube.EventRecorder(hub_api, COMPONENT)
    transformer = Transformer(
        bus=rt.bus,
        hub=KubeHub(dyn, settings.hub_cache_ttl),
        objects=await rt.bus.store(
            rt.bus.topology.bucket("transformer-objects"), ObjectRecord, memo=OBJECTS_MEMO
        ),
        # A namespace's record names every object placed in it and is read and
        # rewritten for each placement: the memo spares parsing what this replica
        # wrote or read last (quadratic in the objects of a namespace otherwise).
        dependents=await rt.bus.store(
            rt.bus.topology.bucket("transformer-dependents"), DependentsRecord, memo=DEPENDENTS_MEMO
        ),
        reporter=reporter,
    )
    rt.serve(transformer.router(), reporter=reporter)
    return transformer
