"""The syncer's work for one member cluster, besides applying works: its loops.

- **Watches**, one per kind Flotilla applied there, narrowed to objects carrying
  the ``flotilla.io/origin`` label. Each (re)start lists first: an object edited
  while nobody watched is set back, one deleted by hand (or never created, after a
  crash) is applied again from the work record. Then every change is judged:
  a field Flotilla applied that reads back differently is drift, and the last
  work is applied again; a deleted object with a live work record is recreated;
  and each user object's status is reported as ``MemberStatusObserved`` when the
  report differs from the last one sent (dedup), keyed by the hub object.
- **Reports** wait `Syncer.report_delay` for the next change of the same object and
  go out together (one pipelined batch): a copy coming up passes through three or
  four statuses within a few tens of milliseconds, and the aggregator needs only
  the last (each report is the whole status, so the latest one says it all; the
  watch lists again after a restart, so a report lost with the process is sent
  again). A report a handler makes (a removed copy) goes out before the handler
  returns, after and instead of the one waiting for that object.
- **The heartbeat**, every ``heartbeat_interval``: list the member's Nodes and Pods,
  write the capacity record (`flotilla.syncer.usage`) to the cache, release the
  scheduler's reservations the record now counts, publish ``CapacityChanged``
  when the figures moved, and server-side apply ``Cluster.status`` on the hub
  (field manager ``flotilla-syncer``: the Ready condition, allocatable, available,
  apiResources, lastHeartbeatTime). A member that has not answered for
  ``missed_heartbeats`` intervals is marked not Ready. An unchanged status is
  written again only once it is ``missed_heartbeats`` intervals old: every write
  reaches every service that watches Clusters, so a quiet fleet stays quiet, and
  ``lastHeartbeatTime`` still tells an observer whether the syncer itself is alive.

**Reservations.** The scheduler reserves room for an object's replicas on a
cluster under the object's key (``<key>#<component>`` for multi-component
objects) until the member's own record counts the pods. The agent notes when a
user object's member copy was reported ready (its pods are then bound to nodes),
and releases that object's reservations only after writing a record whose Pods
were listed *after* that moment: the record counts the pods before the
reservation stops counting them, so there is no moment where neither does, and
the reservation is gone as soon as the record holds them.

A member that is down costs the others nothing: each loop is its own task, the
member pool backs the cluster off (its calls fail at once meanwhile), and the
loops retry with their own backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flotilla.common import events, kube, quantity
from flotilla.common.api import GROUP, ORIGIN_LABEL, VERSION
from flotilla.common.capacity import ClusterCapacity
from flotilla.common.errors import FlotillaError
from flotilla.common.events import CapacityChanged, ObjectRef
from flotilla.common.service import cancel_and_wait, guarded
from flotilla.syncer import observation, rest, usage

if TYPE_CHECKING:
    from flotilla.syncer.service import Syncer, WorkRecord

log = logging.getLogger(__name__)

STATUS_MANAGER = "flotilla-syncer"
DISCOVERY_EVERY = 6
"""Heartbeats between two reads of the member's API discovery."""
CAPACITY_REPUBLISH = 60.0
"""Seconds after which unchanged figures are announced again (a cache that lost its
data has been rewritten by then, and Pending objects may fit again)."""
WATCH_RETRY = 2.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClusterAgent:
    """The loops and the per-cluster state of one member (see the module docstring)."""

    def __init__(self, cluster: str, syncer: Syncer) -> None:
        self.cluster = cluster
        self.syncer = syncer
        self.hub_object: dict[str, Any] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._reported: dict[str, str] = {}
        """Work key → fingerprint of the last report sent."""
        self._pending: dict[str, tuple[ObjectRef, dict[str, Any] | None, float]] = {}
        """Work key → the latest member object not reported yet, and when it was seen."""
        self._reporting: asyncio.Task[None] | None = None
        self._sending = asyncio.Lock()
        """Held while reports are published: one object's reports leave in order."""
        self._ready_at: dict[str, float] = {}
        """Hub key → when its member copy was last reported ready (reservation release)."""
        self._repaired: dict[str, str] = {}
        """Work key → resourceVersion last set back (never twice for one version)."""
        self._verified: dict[str, tuple[WorkRecord, int]] = {}
        """Work key → the work and the member object's generation at which all but its
        metadata read back as applied: until the generation moves, a change (a status
        update, every few milliseconds while a copy comes up) is checked for drift by
        its metadata alone (`observation.drifted`)."""
        self.last_success = syncer.clock()
        self.ready: bool | None = None
        self._beats = 0
        self._api_resources: list[dict[str, Any]] = []
        self._published: tuple[dict[str, int], dict[str, int]] | None = None
        self._published_at = float("-inf")
        self._status_content: tuple[Any, ...] | None = None
        self._status_written_at = float("-inf")

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(
                guarded(f"heartbeat-{self.cluster}", self.heartbeats),
                name=f"heartbeat-{self.cluster}",
            )

    def watch(self, api_version: str, kind: str) -> None:
        if (api_version, kind) not in self._watches:
            name = f"watch-{self.cluster}-{api_version}-{kind}"
            self._watches[(api_version, kind)] = asyncio.create_task(
                guarded(name, lambda: self.watch_forever(api_version, kind)), name=name
            )

    async def stop(self) -> None:
        tasks = [
            t for t in (self._heartbeat, self._reporting, *self._watches.values()) if t is not None
        ]
        await cancel_and_wait(tasks)
        self._heartbeat = self._reporting = None
        self._watches.clear()

    # --- member objects ------------------------------------------------------------

    async def watch_forever(self, api_version: str, kind: str) -> None:
        delay = 0.5
        while True:
            try:
                await self._watch_once(api_version, kind)
                delay = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = kube.translate(exc)
                log.info("watch of %s on %s ended: %s", kind, self.cluster, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, WATCH_RETRY * 8)

    async def _watch_once(self, api_version: str, kind: str) -> None:
        api = await self.syncer.members.client(self.cluster)
        resource = await rest.resource(api, api_version, kind)
        query: list[tuple[str, Any]] = [("labelSelector", ORIGIN_LABEL)]
        listed = await rest.call(api, "GET", resource.path(), query=query)
        present: set[tuple[str, str, str, str]] = set()
        for item in listed.get("items") or []:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            present.add(observation.identity(item))
            await self.seen(item)
        for key, record in self.syncer.records_of(self.cluster, api_version, kind):
            if record.member not in present and key not in self.syncer.applying:
                await self.repair(key, record, "missing")
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        watch_query = [*query, ("resourceVersion", version), ("allowWatchBookmarks", "true")]
        async for change in rest.stream(api, resource.path(), watch_query):
            kind_of_change = change.get("type")
            obj = change.get("object") or {}
            if kind_of_change == "ERROR":
                return  # expired resourceVersion and the like: list again
            if kind_of_change == "BOOKMARK":
                continue
            obj.setdefault("apiVersion", api_version)
            obj.setdefault("kind", kind)
            if kind_of_change == "DELETED":
                await self.gone(obj)
            else:
                await self.seen(obj)

    async def seen(self, obj: dict[str, Any]) -> None:
        """A member object as it is now: set back if it drifted, report its status."""
        found = self.syncer.work_for(self.cluster, obj)
        if found is None:
            return
        key, record = found
        if not observation.is_flotillas(obj, record.ref.key):
            return
        generation = observation.metadata(obj).get("generation")
        verified = self._verified.get(key)
        content = not (
            isinstance(generation, int)
            and verified is not None
            and verified[0] is record
            and verified[1] == generation
        )
        if observation.drifted(record.manifest, obj, content=content):
            version = str(observation.metadata(obj).get("resourceVersion") or "")
            if self._repaired.get(key) != version:
                self._repaired[key] = version
                await self.repair(key, record, "edited")
        elif content and isinstance(generation, int):
            self._verified[key] = (record, generation)
        if not record.dependency_of:
            await self.report(key, record.ref, obj)

    async def gone(self, obj: dict[str, Any]) -> None:
        found = self.syncer.work_for(self.cluster, obj)
        if found is None:
            return
        key, record = found
        await self.repair(key, record, "deleted")

    async def repair(self, key: str, record: WorkRecord, why: str) -> None:
        """Apply the last work again; failures are logged, the next event retries.
        Never beside the work's own handler, and only while `record` is still the
        work recorded (a removal or a newer work handled meanwhile says otherwise)."""
        async with self.syncer.work_lock(key):
            if self.syncer.index.get(key) != record:
                log.info(
                    "%s on %s was %s on the member: its work changed since", key, self.cluster, why
                )
                return
            log.info("%s on %s was %s on the member: applying it again", key, self.cluster, why)
            try:
                async with self.syncer.members.connection(self.cluster) as api:
                    if not await self.syncer.apply(api, self.cluster, record.manifest, repair=True):
                        log.info(
                            "%s on %s not set back: Flotilla removed its namespace there, "
                            "and the work's own removal follows",
                            key,
                            self.cluster,
                        )
            except FlotillaError as exc:
                log.warning("could not set back %s on %s: %s", key, self.cluster, exc)

    def forget(self, key: str) -> None:
        """Drop what the agent keeps for a work that was removed."""
        self._verified.pop(key, None)
        self._repaired.pop(key, None)

    async def report(self, key: str, ref: ObjectRef, obj: dict[str, Any] | None) -> None:
        """Report the member status of `ref` within `report_delay` (see the module
        docstring), unless it says what the last report said."""
        self._pending[key] = (ref, obj, self.syncer.clock())
        if self._reporting is None or self._reporting.done():
            self._reporting = asyncio.create_task(
                self._report_later(), name=f"reports-{self.cluster}"
            )

    async def report_now(self, key: str, ref: ObjectRef, obj: dict[str, Any] | None) -> None:
        """Publish the member status of `ref` before returning (a handler's effect),
        after any report of it already on its way and instead of one still waiting."""
        async with self._sending:
            self._pending.pop(key, None)
            await self._publish({key: (ref, obj, self.syncer.clock())})

    async def flush(self) -> None:
        """Publish every report still waiting."""
        async with self._sending:
            pending, self._pending = self._pending, {}
            try:
                await self._publish(pending)
            except BaseException:
                for key, report in pending.items():
                    self._pending.setdefault(key, report)  # unless a newer one came
                raise

    async def _report_later(self) -> None:
        delay = self.syncer.report_delay
        while self._pending:
            await asyncio.sleep(delay)
            try:
                await self.flush()
                delay = self.syncer.report_delay
            except Exception as exc:
                delay = min(max(delay * 2, 0.5), WATCH_RETRY * 8)
                log.warning(
                    "status reports of %s not published (%s); again in %.1fs",
                    self.cluster,
                    exc,
                    delay,
                    exc_info=not isinstance(exc, FlotillaError),
                )

    async def _publish(
        self, reports: dict[str, tuple[ObjectRef, dict[str, Any] | None, float]]
    ) -> None:
        batch = []
        sent = []
        for key, (ref, obj, seen_at) in reports.items():
            payload = observation.observed(ref, self.cluster, obj)
            fingerprint = observation.fingerprint(payload)
            if self._reported.get(key) == fingerprint:
                continue
            batch.append(
                events.envelope(
                    payload,
                    key=ref.key,
                    producer=self.syncer.bus.producer,
                    generation=payload.generation or 0,
                    dedupe=(self.cluster, fingerprint),
                )
            )
            sent.append((key, ref, payload.ready, fingerprint, seen_at, obj is None))
        if not batch:
            return
        await self.syncer.bus.publish_batch(batch)
        for key, ref, ready, fingerprint, seen_at, gone in sent:
            self._reported[key] = fingerprint
            if gone:
                self._reported.pop(key, None)
                self._ready_at.pop(ref.key, None)
            elif ready:
                self._ready_at[ref.key] = seen_at

    # --- the heartbeat -----------------------------------------------------------------

    async def heartbeats(self) -> None:
        while True:
            started = self.syncer.clock()
            try:
                await self.beat()
            except FlotillaError as exc:
                log.warning("heartbeat of %s failed: %s", self.cluster, exc)
                await self._missed(str(exc))
            elapsed = self.syncer.clock() - started
            await asyncio.sleep(max(self.syncer.heartbeat_interval - elapsed, 0.0))

    async def beat(self) -> None:
        listed_at = self.syncer.clock()
        async with self.syncer.members.connection(self.cluster) as api:
            nodes = await rest.call(api, "GET", "/api/v1/nodes")
            pods = await rest.call(api, "GET", "/api/v1/pods")
            if self._beats % DISCOVERY_EVERY == 0 or not self._api_resources:
                self._api_resources = await rest.api_resources(api)
        self._beats += 1
        self.last_success = self.syncer.clock()
        record = usage.cluster_capacity(
            self.cluster, nodes.get("items") or [], pods.get("items") or [], observed_at=time.time()
        )
        await self.syncer.cache.put(record)
        released = await self.release_counted(listed_at)
        await self._announce(record, force=released)
        content = (dict(record.allocatable), dict(record.available), list(self._api_resources))
        stale_after = self.syncer.heartbeat_interval * self.syncer.missed_heartbeats
        if (
            self.ready is not True
            or content != self._status_content
            or self.syncer.clock() - self._status_written_at >= stale_after
        ):
            await self._write_status(True, "MemberReachable", "the member answers", record)
            self._status_content = content
            self._status_written_at = self.syncer.clock()

    async def release_counted(self, listed_at: float) -> bool:
        """Drop the reservations of objects the record just written counts."""
        counted = {key for key, at in self._ready_at.items() if at < listed_at}
        if not counted:
            return False
        released = False
        for reservation in await self.syncer.cache.reservations(self.cluster):
            if reservation.id.split("#", 1)[0] in counted:
                await self.syncer.cache.release(self.cluster, reservation.id)
                released = True
        for key in counted:
            if self._ready_at.get(key, listed_at) < listed_at:
                del self._ready_at[key]
        return released

    async def _announce(self, record: ClusterCapacity, *, force: bool) -> None:
        figures = (dict(record.allocatable), dict(record.available))
        now = self.syncer.clock()
        if (
            not force
            and figures == self._published
            and now - self._published_at < (CAPACITY_REPUBLISH)
        ):
            return
        payload = CapacityChanged(
            cluster=self.cluster, available=record.available, allocatable=record.allocatable
        )
        await self.syncer.bus.publish(
            events.envelope(
                payload,
                key=self.cluster,
                producer=self.syncer.bus.producer,
                dedupe=(record.observed_at,),
            )
        )
        self._published, self._published_at = figures, now

    async def _missed(self, message: str) -> None:
        silent = self.syncer.clock() - self.last_success
        limit = self.syncer.heartbeat_interval * self.syncer.missed_heartbeats
        if silent >= limit and self.ready is not False:
            try:
                await self._write_status(
                    False,
                    "MemberUnreachable",
                    f"no answer for {silent:.0f}s: {message}"[:1024],
                    None,
                )
            except FlotillaError as exc:
                log.warning("cannot mark %s not Ready on the hub: %s", self.cluster, exc)

    async def _write_status(
        self, ready: bool, reason: str, message: str, record: ClusterCapacity | None
    ) -> None:
        status_value = "True" if ready else "False"
        condition = {
            "type": "Ready",
            "status": status_value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": self._transition_time(status_value),
        }
        status: dict[str, Any] = {"conditions": [condition]}
        if record is not None:
            status["allocatable"] = _quantities(record.allocatable)
            status["available"] = _quantities(record.available)
            status["apiResources"] = self._api_resources
            status["lastHeartbeatTime"] = _now()
        elif self.hub_object is not None:
            # Keep the figures of the last answer: applying without them would drop them.
            previous = self.hub_object.get("status") or {}
            for field in ("allocatable", "available", "apiResources", "lastHeartbeatTime"):
                if field in previous:
                    status[field] = previous[field]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Cluster",
            "metadata": {"name": self.cluster},
            "status": status,
        }
        path = f"/apis/{GROUP}/{VERSION}/clusters/{self.cluster}/status"
        try:
            written = await rest.call(
                self.syncer.hub,
                "PATCH",
                path,
                query=[("fieldManager", STATUS_MANAGER), ("force", "true")],
                body=body,
                content_type=rest.APPLY_PATCH,
            )
        except Exception as exc:
            raise kube.translate(exc) from exc
        self.hub_object = written
        if self.ready != ready:
            log.info("cluster %s is %sReady (%s)", self.cluster, "" if ready else "not ", reason)
        self.ready = ready

    def _transition_time(self, status_value: str) -> str:
        previous = ((self.hub_object or {}).get("status") or {}).get("conditions") or []
        for condition in previous:
            if condition.get("type") == "Ready" and condition.get("status") == status_value:
                return str(condition.get("lastTransitionTime") or _now())
        return _now()


def _quantities(units: dict[str, int]) -> dict[str, str]:
    return {resource: quantity.format_units(resource, amount) for resource, amount in units.items()}
