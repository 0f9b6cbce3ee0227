"""The Events the simulated cluster's actors write, with their real reasons and sources.

`kubectl describe pod` is where users look first, so the simulator records what a
real cluster would: the scheduler's Scheduled/FailedScheduling, the kubelet's
Pulling/Pulled/Created/Started/Killing, the controllers' SuccessfulCreate/
SuccessfulDelete, ScalingReplicaSet, Completed and SawCompletedJob, and the node
controller's NodeNotReady/NodeReady/RegisteredNode. Most are observed rather than
emitted: `observe` reads every committed Pod, ReplicaSet, Job and Node change (old
and new object) and derives the Events from the transition, so the controllers stay
free of reporting code; the few that no object change shows (a CronJob skipping a
run) are reported through `record`.

Events are written by a batched loop, never inside the store write that caused
them, and only while the simulator has no other work queued (up to MAX_DEFERRED held
back), so they trail a burst of 10,000 pods instead of slowing it. Repeats of the
same Event (object, type, reason, message, source) bump `count`/`lastTimestamp` of
the existing one, and more than ten similar ones about one object are combined, as
client-go's EventCorrelator does.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.sim.cronjobs import SCHEDULED_ANNOTATION
from flotilla.kubesim.sim.queues import BATCH_SECONDS
from flotilla.kubesim.sim.state import controller_ref, pod_is_ready
from flotilla.kubesim.store import Store, WatchRecord, now_rfc3339

SCHEDULER = "default-scheduler"
KUBELET = "kubelet"
# Which controller creates pods for which owner kind.
POD_CREATORS = {
    "ReplicaSet": "replicaset-controller",
    "Job": "job-controller",
    "DaemonSet": "daemonset-controller",
    "StatefulSet": "statefulset-controller",
}
OwnerAlive = Callable[[str, str, str], bool]  # (kind, namespace, name)


# client-go's EventCorrelator: after this many distinct messages about one object with
# the same reason and source within the interval, the rest are combined into one Event.
SIMILAR_EVENTS = 10
SIMILAR_INTERVAL_SECONDS = 600.0
# client-go's correlator caches hold this many keys (LRU); older ones start anew.
CACHE_SIZE = 4096
COMBINED = "(combined from similar events): "
# Events held back while the simulator is busy before they are written anyway.
MAX_DEFERRED = 50_000


@dataclass(frozen=True, eq=False, slots=True)
class Note:
    """One Event to write: about `involved` (shared, never mutated), from `component`."""

    involved: dict[str, str]
    type: str
    reason: str
    message: str
    component: str
    host: str = ""

    def similar_key(self) -> tuple[str, ...]:
        """Everything but the message (client-go's aggregate key)."""
        involved = self.involved
        return (
            involved.get("uid") or involved.get("name", ""),
            involved.get("kind", ""),
            involved.get("namespace", ""),
            involved.get("fieldPath", ""),
            self.type,
            self.reason,
            self.component,
            self.host,
        )


class _Fields:
    """Instances lend their `__dict__` to stored Events: CPython's key-sharing
    dictionaries (PEP 412) keep the 14 keys once for all of them instead of a hash
    table per Event, about 250 bytes less per Event (a real cluster's simulator writes
    four per pod). The dict is an ordinary `dict` to every reader."""


_EVENT_KEYS = (
    "apiVersion",
    "kind",
    "metadata",
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "reportingComponent",
    "reportingInstance",
)


_EVENT_KEY_SET = frozenset(_EVENT_KEYS)


def event_dict(**fields: Any) -> dict[str, Any]:
    """A dict of `fields` (keyed as `_EVENT_KEYS`, in that order) sharing its keys."""
    holder = _Fields()
    for key in _EVENT_KEYS:
        setattr(holder, key, fields[key])
    return holder.__dict__


class _Lru(OrderedDict[tuple[str, ...], Any]):
    """A dict that forgets its least recently used keys beyond CACHE_SIZE."""

    def touch(self, key: tuple[str, ...], value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > CACHE_SIZE:
            self.popitem(last=False)


def reference(obj: dict[str, Any], field_path: str = "") -> dict[str, str]:
    """The involvedObject for `obj` (an object or an ownerReference)."""
    meta = obj.get("metadata") or obj
    ref = {
        "kind": obj.get("kind", ""),
        "namespace": meta.get("namespace") or "",
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "apiVersion": obj.get("apiVersion", ""),
        "resourceVersion": meta.get("resourceVersion") or "",
        "fieldPath": field_path,
    }
    return {key: value for key, value in ref.items() if value}


def _owner_ref(ref: dict[str, Any], namespace: str) -> dict[str, str]:
    return {
        "kind": ref.get("kind", ""),
        "namespace": namespace,
        "name": ref.get("name", ""),
        "uid": ref.get("uid", ""),
        "apiVersion": ref.get("apiVersion", ""),
    }


def _pulls_always(container: dict[str, Any]) -> bool:
    """imagePullPolicy, defaulted as upstream does: Always for untagged or :latest images."""
    policy = container.get("imagePullPolicy")
    if policy:
        return bool(policy == "Always")
    image = str(container.get("image") or "")
    tag = image.rsplit("/", 1)[-1]
    return "@" not in tag and (":" not in tag or tag.endswith(":latest"))


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return {}


class Recorder:
    """Derives, aggregates and writes Events (see the module docstring)."""

    def __init__(
        self, store: Store, owner_alive: OwnerAlive, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self.store = store
        self.owner_alive = owner_alive
        self.busy = busy
        self.rt = store.resource_type("v1", "Event")
        self._pending: deque[Note] = deque()
        self._ready = asyncio.Event()
        # dedupe key -> (namespace, name) of the Event to bump; similar key -> messages seen.
        self._latest = _Lru()
        self._similar = _Lru()
        self._sources: dict[tuple[str, str], dict[str, str]] = {}
        self._serial = itertools.count()
        self._pulled: set[tuple[str, str]] = set()  # (node, image) a kubelet already has

    # -- reporting ------------------------------------------------------------------------

    def record(
        self,
        involved: dict[str, str],
        type_: str,
        reason: str,
        message: str,
        component: str,
        host: str = "",
    ) -> None:
        """Queue one Event; it is written by `run` shortly after."""
        self._pending.append(Note(involved, type_, reason, message, component, host))
        self._ready.set()

    def __len__(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            # Events trail the work they describe (upstream's components queue them too):
            # while the simulator has work queued they wait, unless too many pile up.
            if self.busy() and len(self._pending) < MAX_DEFERRED:
                await asyncio.sleep(BATCH_SECONDS)
                continue
            deadline = time.monotonic() + BATCH_SECONDS
            while self._pending and time.monotonic() < deadline:
                self.write(self._pending.popleft())
            if not self._pending:
                self._ready.clear()
            await asyncio.sleep(0)

    def flush(self) -> None:
        """Write everything queued now (for callers outside the loop, and tests)."""
        while self._pending:
            self.write(self._pending.popleft())
        self._ready.clear()

    def _correlate(self, note: Note) -> tuple[tuple[str, ...], str]:
        """(dedupe key, message): the note's own, or the combined Event's once similar
        notes about the same object pass SIMILAR_EVENTS within SIMILAR_INTERVAL_SECONDS."""
        similar = note.similar_key()
        now = time.monotonic()
        seen = self._similar.get(similar)
        if seen is None or seen[0] + SIMILAR_INTERVAL_SECONDS < now:
            seen = (now, set())
        messages: set[str] = seen[1]
        messages.add(note.message)
        self._similar.touch(similar, (now, messages))
        if len(messages) < SIMILAR_EVENTS:
            return (*similar, note.message), note.message
        return similar, COMBINED + note.message

    def write(self, note: Note) -> None:
        now = now_rfc3339()
        involved = note.involved
        namespace = involved.get("namespace") or "default"
        key, message = self._correlate(note)
        where = self._latest.get(key)
        if where is not None:
            try:
                # A series, as client-go keeps it: the stored Event with count+1. Built
                # from the stored one (read-only, so no copy of it) and handed over.
                stored = self.store.get_frozen(self.rt, *where)
                bumped = {
                    **stored,
                    "metadata": dict(stored["metadata"]),
                    "count": int(stored.get("count") or 1) + 1,
                    "lastTimestamp": now,
                    "message": message,
                }
                if bumped.keys() == _EVENT_KEY_SET:  # not reshaped by a client since
                    bumped = event_dict(**bumped)
                self.store.update(self.rt, bumped, owned=True)
                self._latest.touch(key, where)
                return
            except ApiError as exc:
                if exc.code != 404:
                    raise
                del self._latest[key]
        source = self._sources.get((note.component, note.host))
        if source is None:
            source = {"component": note.component, **({"host": note.host} if note.host else {})}
            self._sources[(note.component, note.host)] = source
        # client-go names Events <object>.<hex nanoseconds>; the serial keeps them unique.
        name = f"{involved.get('name', 'unknown')}.{time.time_ns() + next(self._serial):x}"
        event = event_dict(
            apiVersion="v1",
            kind="Event",
            metadata={"name": name, "namespace": namespace},
            involvedObject=involved,
            reason=note.reason,
            message=message,
            source=source,
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
            type=note.type,
            eventTime=None,
            reportingComponent=note.component,
            reportingInstance=note.host,
        )
        try:
            self.store.create(self.rt, event, owned=True)
        except ApiError as exc:
            if exc.code not in (403, 404):  # its namespace is gone or going
                raise
            return
        self._latest.touch(key, (namespace, name))

    # -- observing ------------------------------------------------------------------------

    def observe_pod(self, record: WatchRecord) -> None:
        new, old = record.object, record.old
        meta = new["metadata"]
        namespace, name = meta.get("namespace") or "", meta["name"]
        ref = controller_ref(new)
        if record.type == "ADDED":
            if ref and ref.get("kind") in POD_CREATORS:
                self._pod_owner_event(ref, namespace, name, "SuccessfulCreate")
            return
        spec, status = new.get("spec") or {}, new.get("status") or {}
        node = spec.get("nodeName") or ""
        if record.type == "DELETED":
            if status.get("phase") == "Running" and node:
                for container in spec.get("containers") or ():
                    self.record(
                        reference(new, f"spec.containers{{{container.get('name')}}}"),
                        "Normal",
                        "Killing",
                        f"Stopping container {container.get('name')}",
                        KUBELET,
                        node,
                    )
            if (
                ref
                and ref.get("kind") in POD_CREATORS
                and self.owner_alive(ref["kind"], namespace, ref.get("name", ""))
            ):
                self._pod_owner_event(ref, namespace, name, "SuccessfulDelete")
            return
        old_spec, old_status = (old or {}).get("spec") or {}, (old or {}).get("status") or {}
        if (
            node
            and not old_spec.get("nodeName")
            and spec.get("schedulerName", SCHEDULER) == SCHEDULER
        ):
            self.record(
                reference(new),
                "Normal",
                "Scheduled",
                f"Successfully assigned {namespace}/{name} to {node}",
                SCHEDULER,
            )
        scheduled, was = _condition(new, "PodScheduled"), _condition(old, "PodScheduled")
        if (
            scheduled.get("reason") == "Unschedulable"
            and scheduled.get("message")
            and scheduled.get("message") != was.get("message")
        ):
            self.record(
                reference(new), "Warning", "FailedScheduling", scheduled["message"], SCHEDULER
            )
        if status.get("phase") == "Running" and old_status.get("phase") != "Running":
            self._containers_started(new, node)
        ready, was_ready = pod_is_ready(status), pod_is_ready(old_status)
        if was_ready and not ready and _condition(new, "Ready").get("reason") == "NodeNotReady":
            self.record(
                reference(new), "Warning", "NodeNotReady", "Node is not ready", "node-controller"
            )

    def _pod_owner_event(self, ref: dict[str, Any], namespace: str, pod: str, reason: str) -> None:
        kind = ref["kind"]
        if kind == "StatefulSet":
            verb = "create" if reason == "SuccessfulCreate" else "delete"
            message = f"{verb} Pod {pod} in StatefulSet {ref.get('name')} successful"
        else:
            verb = "Created" if reason == "SuccessfulCreate" else "Deleted"
            message = f"{verb} pod: {pod}"
        self.record(_owner_ref(ref, namespace), "Normal", reason, message, POD_CREATORS[kind])

    def _containers_started(self, pod: dict[str, Any], node: str) -> None:
        for container in (pod.get("spec") or {}).get("containers") or ():
            name, image = container.get("name", ""), container.get("image", "")
            # These texts repeat for every pod of a template: keep each once.
            involved = reference(pod, sys.intern(f"spec.containers{{{name}}}"))
            notes = []
            if _pulls_always(container) or (node, image) not in self._pulled:
                self._pulled.add((node, image))
                notes += [
                    ("Pulling", f'Pulling image "{image}"'),
                    (
                        "Pulled",
                        f'Successfully pulled image "{image}" in 0s (0s including waiting). '
                        "Image size: 0 bytes.",
                    ),
                ]
            else:
                notes.append(("Pulled", f'Container image "{image}" already present on machine'))
            notes += [
                ("Created", f"Created container: {name}"),
                ("Started", f"Started container {name}"),
            ]
            for reason, message in notes:
                self.record(involved, "Normal", reason, sys.intern(message), KUBELET, node)

    def observe_replicaset(self, record: WatchRecord) -> None:
        if record.type == "DELETED":
            return
        new, old = record.object, record.old
        ref = controller_ref(new)
        if not ref or ref.get("kind") != "Deployment":
            return
        after = int((new.get("spec") or {}).get("replicas") or 0)
        before = int(((old or {}).get("spec") or {}).get("replicas") or 0)
        if after == before:
            return
        direction = "up" if after > before else "down"
        rs = new["metadata"]["name"]
        self.record(
            _owner_ref(ref, new["metadata"].get("namespace") or ""),
            "Normal",
            "ScalingReplicaSet",
            f"Scaled {direction} replica set {rs} from {before} to {after}",
            "deployment-controller",
        )

    def observe_job(self, record: WatchRecord) -> None:
        new, old = record.object, record.old
        meta = new["metadata"]
        namespace, name = meta.get("namespace") or "", meta["name"]
        ref = controller_ref(new)
        cronjob = ref if ref and ref.get("kind") == "CronJob" else None
        if record.type == "ADDED":
            # Only the Jobs the controller started (not `kubectl create job --from=cronjob/...`).
            if cronjob and SCHEDULED_ANNOTATION in (meta.get("annotations") or {}):
                self.record(
                    _owner_ref(cronjob, namespace),
                    "Normal",
                    "SuccessfulCreate",
                    f"Created job {name}",
                    "cronjob-controller",
                )
            return
        if record.type == "DELETED":
            if cronjob and self.owner_alive("CronJob", namespace, cronjob.get("name", "")):
                self.record(
                    _owner_ref(cronjob, namespace),
                    "Normal",
                    "SuccessfulDelete",
                    f"Deleted job {name}",
                    "cronjob-controller",
                )
            return
        for kind in ("Complete", "Failed"):
            if (
                _condition(new, kind).get("status") == "True"
                and _condition(old, kind).get("status") != "True"
            ):
                if kind == "Complete":
                    self.record(
                        reference(new), "Normal", "Completed", "Job completed", "job-controller"
                    )
                if cronjob:
                    self.record(
                        _owner_ref(cronjob, namespace),
                        "Normal",
                        "SawCompletedJob",
                        f"Saw completed job: {name}, status: {kind}",
                        "cronjob-controller",
                    )

    def observe_node(self, record: WatchRecord) -> None:
        new = record.object
        name = new["metadata"]["name"]
        if record.type == "ADDED":
            self.record(
                reference(new),
                "Normal",
                "RegisteredNode",
                f"Node {name} event: Registered Node {name} in Controller",
                "node-controller",
            )
            return
        if record.type == "DELETED":
            return
        ready = _condition(new, "Ready").get("status") == "True"
        was = _condition(record.old, "Ready").get("status") == "True"
        if ready != was:
            state = "NodeReady" if ready else "NodeNotReady"
            self.record(
                reference(new),
                "Normal",
                state,
                f"Node {name} status is now: {state}",
                "node-controller",
            )
