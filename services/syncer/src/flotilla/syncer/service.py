"""The syncer service: rendered works onto member clusters, member state back.

Handlers (one `Router`): ``WorkRendered`` (key ``<hub key>@<cluster>``, so one
work's events arrive in order, and a down cluster's works, retried with the
bus's backoff, never hold up another cluster's) — apply the manifest, or delete
the member object when the manifest is None. Loops, one set per member cluster
(`flotilla.syncer.agent.ClusterAgent`): watches of what Flotilla applied (status
back, drift repaired), and the heartbeat (capacity, reservations, Cluster status).

**Applying.** Server-side apply with field manager ``flotilla`` and
``force=true``: the manifest holds only fields Flotilla renders and owns, so a
conflict there is someone else's edit of Flotilla's field, which Flotilla sets
back; fields Flotilla does not render stay whoever's they are. A namespaced
object whose namespace does not exist yet gets the namespace created first (a
plain Namespace, not labelled as Flotilla's, so Flotilla never deletes it unless
a Namespace work of its own claims it). Re-applying the same manifest changes
nothing on the member: a work equal to the recorded one whose member object still
holds every applied field is not sent again at all.

**Durable record.** Before touching the member, the work's manifest is written to
the ``syncer-works`` bucket (key = the work key), and tombstoned after a removal.
Every replica follows the bucket: a restarted syncer re-lists each member, sets
back what was edited and recreates what was deleted by hand, and a syncer killed
mid-apply gets the event again (the bus redelivers it unacknowledged) and
applies it again, which is harmless.

**One thing at a time per work.** A work's handler and the agent's repair of the
same work (a watch saw its member object deleted or edited) never overlap
(`Syncer.work_lock`), and a repair applies only the work still recorded when it
gets its turn. Without that, a removal could run while a repair was re-applying
the copy (the object deleted on the member a moment earlier, as its namespace's
removal does to every object in it): the removal found nothing to delete, the
repair then created it, and the member kept a copy no work described.
Likewise a repair does not create an object again in a namespace that a Namespace
work's removal deleted there (until a work is applied in it again): the
transformer removes a namespace and its last objects by works of different keys,
which may arrive in either order, and the object's own removal follows; creating
it again would also have created a plain namespace that nothing ever removes.

**Deleting.** Only a member object that carries the ``flotilla.io/origin`` label
and whose ``flotilla.io/origin`` annotation names the removed work's hub object;
anything else is left alone with a log line. Deciding *when* an as-needed
dependency goes (its last dependent on that cluster left) is the transformer's:
the syncer deletes what it is told to.

**Pull mode.** ``FLOTILLA_SYNCER_CLUSTER=<name>`` runs the syncer inside that
member (`flotilla.syncer.members.LocalMember`), with the hub's kubeconfig as
``FLOTILLA_HUB_KUBECONFIG``. It consumes through its own durable consumers
(``syncer-<name>-p<n>``), so it sees every ``WorkRendered`` and handles only its
own cluster's (filtered in the handler); the hub-side (push) syncer skips every
Cluster that has no ``spec.kubeconfigSecretRef``, which is how a pull-mode member
is registered. NATS permissions a pull-mode syncer needs (``<prefix>`` is
``FLOTILLA_STREAM_PREFIX``): subscribe to and ack its consumers
(``$JS.API.CONSUMER.*.<PREFIX>_EVENTS.syncer-<name>-p*``,
``$JS.ACK.<PREFIX>_EVENTS.syncer-<name>-p*.>``, ``$JS.API.INFO``,
``$JS.API.STREAM.INFO.*``), publish ``<prefix>.events.MemberStatusObserved.*``,
``<prefix>.events.CapacityChanged.*`` and ``<prefix>.dlq.WorkRendered``, and read
and write the KV buckets ``<prefix>-leases`` and ``<prefix>-syncer-works``
(``$KV.<bucket>.>`` and ``$JS.API.STREAM.*.KV_<bucket>``). Subjects are
partitioned by key hash, not by cluster, so NATS cannot narrow the works it
reads to its own cluster's: a member that must not see other clusters'
manifests needs push mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field

from flotilla.common import events, kube
from flotilla.common.api import GROUP, ORIGIN_LABEL, VERSION
from flotilla.common.bus import Bus
from flotilla.common.capacity import CapacityCache
from flotilla.common.config import Settings
from flotilla.common.dispatch import EventBus, Received
from flotilla.common.errors import ConfigError, FlotillaError, InvalidObject
from flotilla.common.events import ObjectRef, WorkRendered
from flotilla.common.members import MemberClients
from flotilla.common.queueing import KeyedLocks
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.common.store import Follower, MemoryBucket, Store
from flotilla.syncer import observation, rest
from flotilla.syncer.agent import ClusterAgent
from flotilla.syncer.members import LocalMember, Members

log = logging.getLogger(__name__)

SERVICE = "syncer"
FIELD_MANAGER = "flotilla"
NAMESPACE = ("v1", "Namespace")
"""(apiVersion, kind) of a Namespace work's member object."""
COMPONENT = "flotilla-syncer"
WORKS_BUCKET = "syncer-works"
REPORT_DELAY = 0.1
"""Seconds a member status report waits for a newer one of the same object
(`flotilla.syncer.agent`): a copy coming up changes status three or four times
within a few tens of milliseconds, and only the last needs reporting."""


class SyncerSettings(Settings):
    """The syncer's own settings on top of the common ones."""

    heartbeat_interval: float = Field(
        default=10.0, gt=0, description="seconds between heartbeats (capacity, Cluster status)"
    )
    missed_heartbeats: int = Field(
        default=3, ge=1, description="heartbeats a member may miss before it is not Ready"
    )
    syncer_cluster: str | None = Field(
        default=None,
        description="pull mode: the one member cluster this syncer runs in (unset: push mode)",
    )
    member_kubeconfig: Path | None = Field(
        default=None,
        description="pull mode: the member's kubeconfig (unset: the Pod's service account)",
    )
    per_cluster: int = Field(
        default=16, ge=1, description="requests in flight at once on one member cluster"
    )
    report_delay: float = Field(
        default=REPORT_DELAY,
        ge=0,
        description="seconds a member status report waits for a newer status of its object",
    )


class WorkRecord(BaseModel):
    """The last work applied for one (hub object, cluster): what drift is judged against."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ref: ObjectRef
    cluster: str
    decision_id: str = ""
    manifest: dict[str, Any]
    dependency_of: list[ObjectRef] = Field(default_factory=list)

    @property
    def member(self) -> tuple[str, str, str, str]:
        return observation.identity(self.manifest)


class Syncer:
    """One replica's handlers, the work index and the per-cluster agents."""

    def __init__(
        self,
        *,
        bus: EventBus,
        members: Members,
        hub: ApiClient,
        cache: CapacityCache,
        works: Store[WorkRecord],
        own_cluster: str | None = None,
        heartbeat_interval: float = 10.0,
        missed_heartbeats: int = 3,
        report_delay: float = REPORT_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.members = members
        self.hub = hub
        self.cache = cache
        self.works = works
        self.own_cluster = own_cluster
        self.heartbeat_interval = heartbeat_interval
        self.missed_heartbeats = missed_heartbeats
        self.report_delay = report_delay
        self.clock = clock
        self.index: dict[str, WorkRecord] = {}
        self.by_member: dict[tuple[str, tuple[str, str, str, str]], str] = {}
        self.agents: dict[str, ClusterAgent] = {}
        self.pull_clusters: set[str] = set()
        """Clusters registered without a kubeconfig Secret: their own syncer pulls."""
        self.follower = Follower(works, on_change=self._on_record)
        self._namespaces: dict[str, set[str]] = {}
        self._removed_namespaces: dict[str, set[str]] = {}
        """Cluster → namespaces a Namespace work's removal deleted there, until a work
        is applied in them again: a repair does not create those again."""
        self.applying: set[str] = set()
        """Work keys whose handler is applying them now: a watch's list that misses
        one of them is early, not looking at a deletion."""
        self._work_locks = KeyedLocks()

    @property
    def service(self) -> str:
        return SERVICE if self.own_cluster is None else f"{SERVICE}-{self.own_cluster}"

    def router(self) -> Router:
        router = Router(self.service)
        router.on(WorkRendered)(self.on_work_rendered)
        return router

    def serves(self, cluster: str) -> bool:
        if self.own_cluster is not None:
            return cluster == self.own_cluster
        return cluster not in self.pull_clusters

    def work_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held by a work's handler and by a repair of it (module docstring)."""
        return self._work_locks.hold(key)

    # --- the work index ----------------------------------------------------------------

    def _on_record(self, key: str, record: WorkRecord | None, _revision: int) -> None:
        self._index(key, record)

    def _index(self, key: str, record: WorkRecord | None) -> None:
        previous = self.index.pop(key, None)
        if previous is not None:
            self.by_member.pop((previous.cluster, previous.member), None)
        if record is None:
            return
        self.index[key] = record
        self.by_member[(record.cluster, record.member)] = key
        if self.serves(record.cluster):
            api_version, kind, _, _ = record.member
            self.agent(record.cluster).watch(api_version, kind)

    def work_for(self, cluster: str, obj: dict[str, Any]) -> tuple[str, WorkRecord] | None:
        key = self.by_member.get((cluster, observation.identity(obj)))
        record = self.index.get(key) if key else None
        return (key, record) if key and record else None

    def records_of(self, cluster: str, api_version: str, kind: str) -> list[tuple[str, WorkRecord]]:
        return [
            (key, record)
            for key, record in list(self.index.items())
            if record.cluster == cluster and record.member[:2] == (api_version, kind)
        ]

    def agent(self, cluster: str) -> ClusterAgent:
        found = self.agents.get(cluster)
        if found is None:
            found = self.agents[cluster] = ClusterAgent(cluster, self)
        return found

    # --- handlers -------------------------------------------------------------------

    async def on_work_rendered(self, event: Received[WorkRendered]) -> None:
        work = event.payload
        if not self.serves(work.cluster):
            return
        if self.own_cluster is None and work.cluster not in self.agents:
            await self.refresh_clusters()
            if not self.serves(work.cluster):
                return
        key = events.work_key(work.ref, work.cluster)
        async with self.work_lock(key):
            await self._handle(key, work)

    async def _handle(self, key: str, work: WorkRendered) -> None:
        if work.manifest is None:
            await self.remove(key, work)
            return
        _check_manifest(work)
        record = WorkRecord(
            ref=work.ref,
            cluster=work.cluster,
            decision_id=work.decision_id,
            manifest=work.manifest,
            dependency_of=work.dependency_of,
        )
        unchanged = self.index.get(key) == record
        self.applying.add(key)
        try:
            if not unchanged:
                await self.works.put(key, record)
                self._index(key, record)
            async with self.members.connection(work.cluster) as api:
                if unchanged and await self._in_place(api, record):
                    return
                self._removed_namespaces.get(work.cluster, set()).discard(
                    _namespace_of(record.member)
                )
                await self.apply(api, work.cluster, record.manifest)
        finally:
            self.applying.discard(key)

    async def _in_place(self, api: ApiClient, record: WorkRecord) -> bool:
        """Whether the member already holds the work as applied (a redelivered or
        repeated work then costs one read, and the member sees no write at all)."""
        api_version, kind, namespace, name = record.member
        resource = await rest.resource(api, api_version, kind)
        try:
            live = await rest.call(
                api, "GET", resource.path(namespace if resource.namespaced else None, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return observation.is_flotillas(live, record.ref.key) and not observation.drifted(
            record.manifest, live
        )

    async def apply(
        self, api: ApiClient, cluster: str, manifest: dict[str, Any], *, repair: bool = False
    ) -> bool:
        """Server-side apply of one manifest (its namespace first); False when a
        `repair` was not made because Flotilla itself removed the object's namespace
        there (module docstring)."""
        api_version, kind, namespace, name = observation.identity(manifest)
        resource = await rest.resource(api, api_version, kind)
        removed = repair and namespace in self._removed_namespaces.get(cluster, ())
        if resource.namespaced and namespace:
            if removed and not await self._namespace_exists(api, namespace):
                return False
            await self._ensure_namespace(api, cluster, namespace)
        path = resource.path(namespace if resource.namespaced else None, name)
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]

        async def patch() -> None:
            await rest.call(
                api,
                "PATCH",
                path,
                query=query,
                body=manifest,
                content_type=rest.APPLY_PATCH,
                decode=False,
            )

        try:
            await patch()
        except ApiException as exc:
            if exc.status != 404 or not (resource.namespaced and namespace):
                raise
            # The namespace went away since it was seen: create it again, once.
            self._namespaces.get(cluster, set()).discard(namespace)
            if removed:
                return False
            await self._ensure_namespace(api, cluster, namespace)
            await patch()
        return True

    async def _namespace_exists(self, api: ApiClient, namespace: str) -> bool:
        try:
            await rest.call(api, "GET", f"/api/v1/namespaces/{namespace}")
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    async def _ensure_namespace(self, api: ApiClient, cluster: str, namespace: str) -> None:
        known = self._namespaces.setdefault(cluster, set())
        if namespace in known:
            return
        if not await self._namespace_exists(api, namespace):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            try:
                await rest.call(api, "POST", "/api/v1/namespaces", body=body, decode=False)
            except ApiException as created:
                if created.status != 409:
                    raise
        known.add(namespace)

    async def remove(self, key: str, work: WorkRendered) -> None:
        """Delete the member object of a removed work (only if it is Flotilla's)."""
        entry = self.index.get(key)
        if entry is None:
            stored = await self.works.get(key)
            entry = stored.value if stored else None
        if entry is not None:
            api_version, kind, namespace, name = entry.member
        else:
            ref = work.ref
            api_version, kind, namespace, name = (
                ref.api_version,
                ref.kind,
                ref.namespace or "",
                ref.name,
            )
        # Out of the in-memory index first: the watch must not take the deletion
        # below for someone else's and set the object back. The durable record
        # stays until the member object is gone, so a retry still knows what to delete.
        self._index(key, None)
        self.agent(work.cluster).forget(key)
        async with self.members.connection(work.cluster) as api:
            try:
                resource = await rest.resource(api, api_version, kind)
            except InvalidObject:
                resource = None  # the type is not served there: nothing to delete
            if resource is not None:
                await self._delete(api, resource, namespace, name, work)
        if (api_version, kind) == NAMESPACE:
            self._namespaces.get(work.cluster, set()).discard(name)
            self._removed_namespaces.setdefault(work.cluster, set()).add(name)
        await self.works.delete(key)
        if not work.dependency_of:
            await self.agent(work.cluster).report_now(key, work.ref, None)

    async def _delete(
        self,
        api: ApiClient,
        resource: rest.Resource,
        namespace: str,
        name: str,
        work: WorkRendered,
    ) -> None:
        path = resource.path(namespace if resource.namespaced else None, name)
        try:
            live = await rest.call(api, "GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        if not observation.is_flotillas(live, work.ref.key):
            log.warning(
                "%s on %s: not deleting %s %s, it is not Flotilla's copy of that object",
                work.ref.key,
                work.cluster,
                resource.kind,
                path,
            )
            return
        uid = observation.metadata(live).get("uid")
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            **({"preconditions": {"uid": uid}} if uid else {}),
        }
        try:
            await rest.call(api, "DELETE", path, body=body, decode=False)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # --- clusters --------------------------------------------------------------------

    async def refresh_clusters(self) -> None:
        """Start an agent for every Cluster this syncer serves, stop the others'."""
        if self.own_cluster is not None:
            self.agent(self.own_cluster).start()
            return
        try:
            listed = await rest.call(self.hub, "GET", f"/apis/{GROUP}/{VERSION}/clusters")
        except Exception as exc:
            raise kube.translate(exc) from exc
        present: dict[str, dict[str, Any]] = {}
        pull: set[str] = set()
        for item in listed.get("items") or []:
            name = str(observation.metadata(item).get("name"))
            if not (item.get("spec") or {}).get("kubeconfigSecretRef"):
                pull.add(name)
                continue
            present[name] = item
        self.pull_clusters = pull
        for name, item in present.items():
            agent = self.agent(name)
            agent.hub_object = item
            agent.start()
        for name in list(self.agents):
            if name not in present:
                agent = self.agents.pop(name)
                await agent.stop()
                await self.cache.remove(name)
                log.info("cluster %s left the fleet (or is pulled by its own syncer)", name)

    async def watch_clusters(self) -> None:
        """Keep the agents in step with the hub's Clusters, until cancelled."""
        while True:
            try:
                await self.refresh_clusters()
            except FlotillaError as exc:
                log.warning("cannot list the hub's Clusters: %s", exc)
            await asyncio.sleep(self.heartbeat_interval)

    async def close(self) -> None:
        for agent in list(self.agents.values()):
            await agent.stop()


def _check_manifest(work: WorkRendered) -> None:
    manifest = work.manifest or {}
    api_version, kind, _, name = observation.identity(manifest)
    if not api_version or not kind or not name:
        raise InvalidObject(
            f"{work.ref.key}: the work for {work.cluster} has no apiVersion, kind or name",
            reason="InvalidWork",
        )
    if ORIGIN_LABEL not in observation.labels(manifest):
        raise InvalidObject(
            f"{work.ref.key}: the work for {work.cluster} lacks the "
            f"{ORIGIN_LABEL} label; Flotilla applies only objects it marks as its own",
            reason="InvalidWork",
        )


async def setup(rt: Runtime) -> Syncer:
    """Compose one replica: hub and member clients, capacity cache, work records, loops."""
    settings = rt.settings_as(SyncerSettings)
    if settings.hub_kubeconfig is None:
        raise ConfigError("the syncer needs FLOTILLA_HUB_KUBECONFIG")
    hub = await kube.hub_client(settings)
    rt.on_close(hub.close)
    timeouts = kube.Timeouts.of(settings)
    members: Members
    if settings.syncer_cluster is not None:
        members = await LocalMember.open(
            settings.syncer_cluster, settings.member_kubeconfig, timeouts
        )
    else:
        members = MemberClients(hub, timeouts=timeouts, per_cluster=settings.per_cluster)
    rt.on_close(members.close)
    cache = RedisCapacityCache.from_url(settings.redis_url, prefix=settings.capacity_prefix)
    rt.on_close(cache.aclose)
    if isinstance(rt.bus, Bus):
        works = await rt.bus.store(rt.bus.topology.bucket(WORKS_BUCKET), WorkRecord)
    else:
        # The in-memory bus (handler tests) has no KV: records live as long as the process.
        works = Store(MemoryBucket(), WorkRecord)
    syncer = Syncer(
        bus=rt.bus,
        members=members,
        hub=hub,
        cache=cache,
        works=works,
        own_cluster=settings.syncer_cluster,
        heartbeat_interval=settings.heartbeat_interval,
        missed_heartbeats=settings.missed_heartbeats,
        report_delay=settings.report_delay,
    )
    rt.on_close(syncer.close)
    rt.spawn("follow-works", syncer.follower.run)
    await syncer.follower.caught_up(timeout=30.0)
    rt.spawn("clusters", syncer.watch_clusters)
    rt.serve(syncer.router(), reporter=kube.EventRecorder(hub, COMPONENT))
    return syncer


def _namespace_of(member: tuple[str, str, str, str]) -> str:
    """The namespace a work's member object is in, or that it is (a Namespace)."""
    api_version, kind, namespace, name = member
    return name if (api_version, kind) == NAMESPACE else namespace
