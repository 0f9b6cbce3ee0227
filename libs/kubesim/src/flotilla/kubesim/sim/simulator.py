"""The simulator's composition root: listeners in, work queues, loops, node operations.

Store listeners translate every committed change into keys on work queues (one per
controller, one for the scheduler, one for pod clean-up) and into `ClusterState`
updates; a handful of long-running asyncio tasks drain those queues in time-boxed
batches and a single timer heap drives the kubelet side (pod start, Job pod
completion, NoExecute eviction). Nothing here sleeps per pod, and nothing goes
through HTTP, which is what lets 10,000 pods start in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Protocol, TypeVar

from aiohttp import web

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.sim import (
    controllers,
    cronjobs,
    disruption,
    http,
    nodes,
    pods,
    recorder,
    scheduling,
)
from flotilla.kubesim.sim.options import SimOptions
from flotilla.kubesim.sim.queues import BATCH_SECONDS, TimerHeap, WorkQueue
from flotilla.kubesim.sim.scheduling import PodSchedulingSpec
from flotilla.kubesim.sim.state import (
    TERMINAL_PHASES,
    ClusterState,
    Key,
    PodRecord,
    controller_ref,
    key_of,
    pod_is_ready,
)
from flotilla.kubesim.store import Store, StoreEvent, WatchRecord, now_rfc3339

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
Timer = tuple[str, str, str]  # (action, namespace, pod name)
CAPACITY_ANNOTATION = "kubesim.flotilla.io/original-allocatable"
_TYPES = {
    "Node": "v1",
    "Pod": "v1",
    "Lease": "coordination.k8s.io/v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1",
    "CronJob": "batch/v1",
}
_RETRY_SECONDS = 1.0
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Upstream's DefaultTolerationSeconds admission gives every pod these unless it has its own.
DEFAULT_TOLERATION_SECONDS = 300


def with_default_tolerations(tolerations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod's tolerations plus the 300 s not-ready/unreachable ones admission adds."""
    out = list(tolerations)
    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        taint = {"key": key, "effect": "NoExecute"}
        if not any(scheduling.tolerates(t, taint) for t in tolerations):
            out.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    return out


_GATED = "SchedulingGated"


class Reconciler(Protocol):
    """A controller: level-triggered reconcile of one object of its kind."""

    kind: str

    def reconcile(self, key: Key) -> None: ...


class Simulator:
    """Nodes, kubelets, scheduler and workload controllers of one simulated cluster."""

    def __init__(self, store: Store, options: SimOptions, cluster_name: str) -> None:
        self.store = store
        self.options = options
        self.cluster_name = cluster_name
        self.state = ClusterState()
        self.types = {kind: store.resource_type(api, kind) for kind, api in _TYPES.items()}
        self.ctx = controllers.Context(
            store,
            self.state,
            self.types,
            self._requeue_after,
        )
        self.controllers: dict[str, Reconciler] = {
            c.kind: c(self.ctx) for c in controllers.CONTROLLERS
        }
        self.recorder = recorder.Recorder(store, self._owner_alive, self._busy)
        self.budgets = disruption.DisruptionController(self.ctx)
        self.controllers[self.budgets.kind] = self.budgets
        self.cronjobs = cronjobs.CronJobController(self.ctx, self.recorder.record)
        self.controllers[self.cronjobs.kind] = self.cronjobs
        self.queues: dict[str, WorkQueue[Key]] = {kind: WorkQueue() for kind in self.controllers}
        self.scheduler_queue: WorkQueue[Key] = WorkQueue()
        self.janitor_queue: WorkQueue[Key] = WorkQueue()
        self.timers: TimerHeap[Timer] = TimerHeap()
        self._node_prefix = nodes.node_name_prefix(cluster_name)
        self.default_shape = nodes.NodeShape(
            cpu=options.node_cpu,
            memory=options.node_memory,
            pods=options.node_pods,
            gpus=options.node_gpus,
            labels=dict(options.node_labels),
        )
        self.default_shape.capacity()  # fail fast on a bad quantity flag
        self._node_index = 0
        self._pod_ips = 0
        self._created = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: list[Callable[[], None]] = []
        self._retries: set[asyncio.TimerHandle] = set()
        self._wakeups: dict[tuple[str, Key], asyncio.TimerHandle] = {}
        self.unreachable: set[str] = set()  # nodes whose simulated kubelet is down

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Register listeners, load existing objects, create nodes, start the loops."""
        listeners: dict[str, Callable[[StoreEvent], None]] = {
            "Node": self._on_node,
            **{kind: self._workload_listener(kind) for kind in self.controllers},
        }
        for kind, listener in listeners.items():
            self._unsubscribe.append(self.store.add_listener(self.types[kind], listener))
            # Objects that existed before the simulator: seen as if just added.
            items, rv = self.store.list(self.types[kind])
            for item in items:
                listener(StoreEvent("ADDED", item, rv))
        # Pods are only read (into a PodRecord), never kept whole: the stored objects
        # themselves, not a copy of each of the four writes of every pod.
        pod_rt = self.types["Pod"]
        self._unsubscribe.append(self.store.add_record_listener(pod_rt, self._on_pod))
        items, rv = self.store.list_frozen(pod_rt)
        for item in items:
            self._on_pod(StoreEvent("ADDED", item, rv))
        observers = (
            ("Pod", self.recorder.observe_pod),
            ("ReplicaSet", self.recorder.observe_replicaset),
            ("Job", self.recorder.observe_job),
            ("Node", self.recorder.observe_node),
        )
        for kind, observe in observers if self.options.record_events else ():
            self._unsubscribe.append(self.store.add_record_listener(self.types[kind], observe))
        existing = len(self.state.nodes)
        self._node_index = existing
        if self.options.nodes > existing:
            self.add_nodes(self.options.nodes - existing)
        loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            (f"controller-{kind}", self._queue_loop(queue, self.controllers[kind].reconcile))
            for kind, queue in self.queues.items()
        ]
        loops.append(("scheduler", self._queue_loop(self.scheduler_queue, self._schedule)))
        loops.append(("janitor", self._queue_loop(self.janitor_queue, self._tidy_pod)))
        loops.append(("kubelet", self._timer_loop))
        loops.append(("heartbeat", self._heartbeat_loop))
        loops.append(("events", self.recorder.run))
        for name, factory in loops:
            self._tasks.append(asyncio.create_task(self._guarded(name, factory), name=name))

    async def stop(self) -> None:
        """Cancel and await every task; unsubscribe from the store."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        for handle in [*self._retries, *self._wakeups.values()]:
            handle.cancel()
        self._retries.clear()
        self._wakeups.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _guarded(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a loop forever: a crash is logged and the loop restarted, never fatal."""
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("simulator loop %s crashed; restarting", name)
                await asyncio.sleep(_RETRY_SECONDS)

    def _queue_loop(
        self, queue: WorkQueue[K], handler: Callable[[K], None]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        async def run() -> None:
            while True:
                await queue.wait()
                for key in queue.drain(time.monotonic() + BATCH_SECONDS):
                    try:
                        handler(key)
                    except ApiError as exc:
                        # A conflict means someone wrote in between: just look again.
                        delay = 0.0 if exc.code == 409 else _RETRY_SECONDS
                        if exc.code != 404:
                            log.debug("retrying %s after %r", key, exc)
                            self._retry(queue, key, delay)
                    except Exception:
                        log.exception("reconciling %s failed; retrying", key)
                        self._retry(queue, key, _RETRY_SECONDS)
                await asyncio.sleep(0)

        return run

    def _retry(self, queue: WorkQueue[K], key: K, delay: float) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._retries.discard(handle)
            queue.add(key)

        handle = loop.call_later(delay, fire)
        self._retries.add(handle)

    def _requeue_after(self, kind: str, key: Key, delay: float) -> None:
        """Reconcile (kind, key) again in `delay` seconds; an earlier wake-up already
        armed wins, since that reconcile re-arms whatever it still waits for."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(delay, 0.0)
        armed = self._wakeups.get((kind, key))
        if armed is not None and not armed.cancelled() and armed.when() <= when:
            return
        if armed is not None:
            armed.cancel()

        def fire() -> None:
            self._wakeups.pop((kind, key), None)
            self.queues[kind].add(key)

        self._wakeups[(kind, key)] = loop.call_at(when, fire)

    # -- listeners (synchronous, inside store writes: only bookkeeping and enqueueing) ------

    def _workload_listener(self, kind: str) -> Callable[[StoreEvent], None]:
        cache = self.state.cache(kind)
        queue = self.queues[kind]

        def on_event(event: StoreEvent) -> None:
            key = key_of(event.object)
            if event.type == "DELETED":
                cache.remove(key)
            else:
                cache.put(event.object)
                queue.add(key)
            ref = controller_ref(event.object)
            if ref and ref.get("kind") in self.queues:
                self.queues[ref["kind"]].add((key[0], ref.get("name", "")))

        return on_event

    def _on_node(self, event: StoreEvent) -> None:
        name = event.object["metadata"]["name"]
        if event.type == "DELETED":
            for key in self.state.remove_node(name):
                self.janitor_queue.add(key)
        else:
            info = nodes.node_info(event.object)
            previous = self.state.nodes.get(name)
            self.state.set_node(info)
            if previous is None:
                # Pods bound to this name before the node registered start now.
                for record in list(self.state.pods.values()):
                    if record.node_name == name and record.accounted_node is None and record.active:
                        self.state.account(record, name)
                        self._kubelet_next(record)
            for address in (event.object.get("status") or {}).get("addresses") or ():
                if address.get("type") == "InternalIP":
                    self.state.node_ips[name] = address.get("address", "")
            if previous is not None and (
                previous.allocatable,
                previous.labels,
                previous.taints,
                previous.unschedulable,
            ) == (info.allocatable, info.labels, info.taints, info.unschedulable):
                return
            if any(t.get("effect") == "NoExecute" for t in info.taints):
                for key in self.state.pods_by_node.get(name, ()):
                    self.janitor_queue.add(key)
        self._retry_unschedulable()
        for key in self.state.cache("DaemonSet").objects:
            self.queues["DaemonSet"].add(key)

    def _retry_unschedulable(self) -> None:
        for key in self.state.unschedulable:
            self.scheduler_queue.add(key)

    def _on_pod(self, event: StoreEvent | WatchRecord) -> None:
        """Read-only: `event.object` is the stored pod (never mutate it or keep parts
        of it that are not shared read-only data)."""
        obj = event.object
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        record = self.state.pods.get(key)
        if event.type == "DELETED":
            freed = record is not None and record.accounted_node is not None
            removed = self.state.remove_pod(key)
            for action in ("start", "finish", "evict"):
                self.timers.cancel((action, *key))
            if removed is not None:
                self._enqueue_owner(removed)
                self._enqueue_budgets(key[0])
            if freed:
                self._retry_unschedulable()
            return
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if record is None or record.uid != meta.get("uid"):
            if record is not None:
                self.state.remove_pod(key)
            ref = controller_ref(obj)
            self._created += 1
            record = PodRecord(
                namespace=key[0],
                name=key[1],
                uid=meta.get("uid", ""),
                owner_kind=ref.get("kind") if ref else None,
                owner_name=ref.get("name") if ref else None,
                owner_uid=ref.get("uid") if ref else None,
                labels=self.store.shared(meta.get("labels") or {}),
                scheduling=self._parse_scheduling(spec),
                created=self._created,
            )
            self.state.add_pod(record)
            changed = True
        else:
            changed = False
            ref = controller_ref(obj)
            if (ref.get("uid") if ref else None) != record.owner_uid:
                # Orphaned (or adopted): the old owner must recount too.
                self._enqueue_owner(record)
                self.state.set_owner(record, ref)
                changed = True
            if record.node_name is None and not spec.get("nodeName"):
                parsed = self._parse_scheduling(spec)
                if parsed != record.scheduling:
                    record.scheduling = parsed
                    self.state.unschedulable.discard(key)
                    changed = True
        before = (record.node_name, record.phase, record.ready, record.deleting)
        record.node_name = spec.get("nodeName") or None
        record.phase = status.get("phase") or "Pending"
        record.ready = pod_is_ready(status)
        if not record.ready:
            record.ready_since = None
        elif record.ready_since is None:
            record.ready_since = time.monotonic()
        record.deleting = bool(meta.get("deletionTimestamp"))
        labels = meta.get("labels") or {}
        if labels != record.labels:
            record.labels = self.store.shared(labels)
        changed = changed or before != (
            record.node_name,
            record.phase,
            record.ready,
            record.deleting,
        )
        if record.node_name and record.phase not in TERMINAL_PHASES:
            self.state.unschedulable.discard(key)
            if self.state.account(record, record.node_name) and not record.deleting:
                self._kubelet_next(record)
        elif record.phase in TERMINAL_PHASES:
            if self.state.release(record):
                self._retry_unschedulable()
        elif not record.deleting and key not in self.state.unschedulable:
            self.scheduler_queue.add(key)
        if changed:
            self._enqueue_owner(record)
            self._enqueue_budgets(key[0])

    def _kubelet_next(self, record: PodRecord) -> None:
        """Arm the kubelet timer for what happens next to a pod on a known node."""
        if record.phase == "Pending":
            timer, delay = ("start", *record.key), self.options.pod_ready_seconds
        elif record.phase == "Running" and record.owner_kind == "Job":
            timer, delay = ("finish", *record.key), self.options.job_seconds
        else:
            return
        if timer not in self.timers:
            self.timers.schedule(timer, delay)

    def _parse_scheduling(self, spec: dict[str, Any]) -> PodSchedulingSpec:
        try:
            parsed = PodSchedulingSpec.from_pod_spec(spec)
        except (ValueError, TypeError, AttributeError):
            # A pod the real scheduler would reject at validation; never fits anywhere.
            return PodSchedulingSpec(requests={"pods": 1, "kubesim.flotilla.io/invalid": 1})
        # Read-only from here on, and the same for every pod of a template: kept once.
        parsed.requests = self.store.shared(parsed.requests)
        parsed.node_selector = self.store.shared(parsed.node_selector)
        parsed.tolerations = self.store.shared(parsed.tolerations)
        return parsed

    def _busy(self) -> bool:
        """Whether any controller, the scheduler or the janitor has work queued."""
        return any(self.queues.values()) or bool(self.scheduler_queue) or bool(self.janitor_queue)

    def _owner_alive(self, kind: str, namespace: str, name: str) -> bool:
        owner = self.state.cache(kind).get((namespace, name))
        return owner is not None and not owner["metadata"].get("deletionTimestamp")

    def _enqueue_budgets(self, namespace: str) -> None:
        for budget in self.budgets.budgets_in(namespace):
            self.queues[self.budgets.kind].add(budget)

    def _enqueue_owner(self, record: PodRecord) -> None:
        if record.owner_kind in self.queues and record.owner_name:
            self.queues[record.owner_kind].add((record.namespace, record.owner_name))

    # -- scheduler ---------------------------------------------------------------------

    def _schedule(self, key: Key) -> None:
        record = self.state.pods.get(key)
        if record is None or record.node_name or record.deleting or not record.active:
            return
        if not record.scheduling.ours:
            return
        pod_rt = self.types["Pod"]
        if record.scheduling.gated:
            # Upstream keeps gated pods out of the scheduling queue until the gates go.
            if record.unschedulable_message != _GATED:
                pod = self.store.get_frozen(pod_rt, *key)
                status = pods.gated_status(pod.get("spec") or {})
                controllers.write_status(self.store, pod_rt, pod, status)
                record.unschedulable_message = _GATED
            return
        decision = scheduling.choose_node(record.scheduling, self.state.nodes.values())
        if decision.node is None:
            self.state.unschedulable.add(key)
            message = scheduling.unschedulable_message(len(self.state.nodes), decision.reasons)
            if record.unschedulable_message != message:
                pod = self.store.get_frozen(pod_rt, *key)
                controllers.write_status(
                    self.store,
                    pod_rt,
                    pod,
                    pods.unschedulable_status(pod.get("spec") or {}, message),
                )
                record.unschedulable_message = message
            return
        pod = self.store.get_frozen(pod_rt, *key)
        if (pod.get("spec") or {}).get("nodeName"):
            return
        self.state.unschedulable.discard(key)
        record.unschedulable_message = None
        # Reserve before writing so the listener sees the pod already charged to the node.
        self.state.account(record, decision.node)
        # The stored pod is read-only: a fresh top level, metadata and spec carry the
        # binding; everything below them is shared with it, unchanged.
        binding = {
            **pod,
            "metadata": dict(pod["metadata"]),
            "spec": {**pod["spec"], "nodeName": decision.node},
        }
        try:
            bound = self.store.update(pod_rt, binding, owned=True)
        except ApiError:
            self.state.release(record)
            raise
        controllers.write_status(
            self.store,
            pod_rt,
            bound,
            pods.scheduled_status(
                bound["spec"],
                bound.get("status") or {},
                self.state.node_ips.get(decision.node, "10.0.0.1"),
            ),
        )

    # -- kubelet -----------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        while True:
            await self.timers.wait()
            deadline = time.monotonic() + BATCH_SECONDS
            while time.monotonic() < deadline:
                due = self.timers.pop_due(time.monotonic(), 64)
                if not due:
                    break
                for timer in due:
                    try:
                        self._fire(timer)
                    except ApiError as exc:
                        if exc.code != 404:
                            log.warning("kubelet action %s failed: %r", timer, exc)
                            self.timers.schedule(timer, _RETRY_SECONDS)
                    except Exception:
                        log.exception("kubelet action %s failed", timer)
                        self.timers.schedule(timer, _RETRY_SECONDS)
            await asyncio.sleep(0)

    def _fire(self, timer: Timer) -> None:
        action, namespace, name = timer
        record = self.state.pods.get((namespace, name))
        if record is None or record.deleting or record.node_name is None:
            return
        if action != "evict" and record.node_name in self.unreachable:
            return  # that kubelet is down; `set_nodes_ready` re-arms its pods
        pod_rt = self.types["Pod"]
        if action == "start" and record.phase == "Pending":
            pod = self.store.get_frozen(pod_rt, namespace, name)
            self._pod_ips += 1
            n = self._pod_ips
            pod_ip = f"10.{64 + (n >> 16) % 64}.{(n >> 8) & 255}.{n & 255}"
            host_ip = self.state.node_ips.get(record.node_name, "10.0.0.1")
            status = pods.running_status(
                pod.get("spec") or {}, pod.get("status") or {}, host_ip, pod_ip
            )
            controllers.write_status(self.store, pod_rt, pod, status)
        elif action == "finish" and record.phase == "Running":
            pod = self.store.get_frozen(pod_rt, namespace, name)
            controllers.write_status(
                self.store, pod_rt, pod, pods.succeeded_status(pod.get("status") or {})
            )
        elif action == "evict":
            self._tidy_pod((namespace, name), evict_now=True)

    def _tidy_pod(self, key: Key, *, evict_now: bool = False) -> None:
        """Pod GC and the NoExecute taint manager: remove pods their node no longer keeps."""
        record = self.state.pods.get(key)
        if record is None or record.deleting or record.node_name is None:
            return
        node = self.state.nodes.get(record.node_name)
        if node is None:
            self.ctx.delete_pod(record)
            return
        if record.phase in TERMINAL_PHASES:
            return
        tolerations = with_default_tolerations(record.scheduling.tolerations)
        taint = scheduling.untolerated_taint(node.taints, tolerations, frozenset({"NoExecute"}))
        if taint is not None:
            self.ctx.delete_pod(record)
            return
        grace = [
            float(t["tolerationSeconds"])
            for n_taint in node.taints
            if n_taint.get("effect") == "NoExecute"
            for t in tolerations
            if scheduling.tolerates(t, n_taint) and t.get("tolerationSeconds") is not None
        ]
        if grace:
            if evict_now:
                self.ctx.delete_pod(record)
            elif ("evict", *key) not in self.timers:
                self.timers.schedule(("evict", *key), min(grace))

    async def _heartbeat_loop(self) -> None:
        while True:
            self.renew_leases()
            await asyncio.sleep(self.options.heartbeat_seconds)

    def renew_leases(self) -> None:
        """Renew (or create) every node's Lease in kube-node-lease."""
        lease_rt = self.types["Lease"]
        for name in sorted(self.state.nodes):
            if name in self.unreachable:
                continue
            try:
                lease = self.store.get(lease_rt, nodes.LEASE_NAMESPACE, name)
            except ApiError as exc:
                if exc.code != 404:
                    raise
                uid = None
                with contextlib.suppress(ApiError):
                    uid = self.store.get(self.types["Node"], None, name)["metadata"]["uid"]
                self.store.create(lease_rt, nodes.lease_object(name, uid))
                continue
            lease.setdefault("spec", {})["renewTime"] = nodes.now_micro()
            self.store.update(lease_rt, lease)

    # -- node operations (Python API and /sim/v1/nodes) ----------------------------------

    def add_nodes(
        self, count: int, shape: nodes.NodeShape | None = None, names: list[str] | None = None
    ) -> list[str]:
        """Create `count` nodes (or the named ones) with their Leases."""
        shape = shape or self.default_shape
        shape.capacity()
        wanted = list(names or [])
        created: list[str] = []
        while len(created) < (len(wanted) or count):
            name = wanted[len(created)] if wanted else f"{self._node_prefix}-{self._node_index}"
            index = self._node_index
            self._node_index += 1
            if not wanted and name in self.state.nodes:
                continue
            node = self.store.create(
                self.types["Node"], nodes.node_object(name, index, shape, self.cluster_name)
            )
            self.store.create(
                self.types["Lease"], nodes.lease_object(name, node["metadata"]["uid"])
            )
            created.append(name)
        return created

    def remove_nodes(self, names: list[str]) -> list[str]:
        for name in names:
            self.store.delete(self.types["Node"], None, name)
        return names

    def cordon_nodes(self, names: list[str], unschedulable: bool = True) -> list[str]:
        for name in names:
            node = self.store.get(self.types["Node"], None, name)
            spec = node.setdefault("spec", {})
            if unschedulable:
                spec["unschedulable"] = True
            else:
                spec.pop("unschedulable", None)
            self.store.update(self.types["Node"], node)
        return names

    def set_nodes_ready(self, names: list[str], ready: bool) -> list[str]:
        """Stop (or restart) the nodes' kubelets, as the node lifecycle controller sees it.

        Down: Lease renewals stop, every node condition turns Unknown, the
        `node.kubernetes.io/unreachable` NoSchedule and NoExecute taints are added and
        the node's pods are marked not Ready; pods without their own toleration are
        evicted after the default 300 s. Up: all of that is undone.
        """
        node_rt = self.types["Node"]
        pod_rt = self.types["Pod"]
        for name in names:
            if ready:
                self.unreachable.discard(name)
            else:
                self.unreachable.add(name)
            node = self.store.get(node_rt, None, name)
            spec = node.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
            if not ready:
                now = now_rfc3339()
                taints += [
                    {"key": UNREACHABLE_TAINT, "effect": effect, "timeAdded": now}
                    for effect in ("NoSchedule", "NoExecute")
                ]
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)
            node = self.store.update(node_rt, node)
            node.setdefault("status", {})["conditions"] = nodes.node_conditions(
                now_rfc3339(), ready=ready
            )
            self.store.update(node_rt, node, subresource="status")
            for key in sorted(self.state.pods_by_node.get(name, ())):
                record = self.state.pods.get(key)
                if record is None or not record.active or record.phase != "Running":
                    if record is not None and record.active and ready:
                        self._kubelet_next(record)
                    continue
                pod = self.store.get_frozen(pod_rt, *key)
                status = pods.with_readiness(pod.get("status") or {}, ready)
                controllers.write_status(self.store, pod_rt, pod, status)
                if ready:
                    self._kubelet_next(record)
        return names

    def zero_capacity(self, names: list[str], zero: bool = True) -> list[str]:
        """Set allocatable (and capacity) to zero, or restore what it was before."""
        node_rt = self.types["Node"]
        for name in names:
            node = self.store.get(node_rt, None, name)
            status = node.setdefault("status", {})
            annotations = node["metadata"].setdefault("annotations", {})
            if zero:
                if CAPACITY_ANNOTATION not in annotations:
                    annotations[CAPACITY_ANNOTATION] = json.dumps(
                        status.get("allocatable") or {}, sort_keys=True, separators=(",", ":")
                    )
                    node = self.store.update(node_rt, node)
                    status = node.setdefault("status", {})
                zeroed = {resource: "0" for resource in status.get("allocatable") or {}}
                status["allocatable"] = zeroed
                status["capacity"] = dict(zeroed)
            else:
                saved = annotations.pop(CAPACITY_ANNOTATION, None)
                if saved is None:
                    continue
                node = self.store.update(node_rt, node)
                status = node.setdefault("status", {})
                status["allocatable"] = json.loads(saved)
                status["capacity"] = json.loads(saved)
            self.store.update(node_rt, node, subresource="status")
        return names

    # -- server integration ------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return http.routes(self)

    def stats(self) -> dict[str, Any]:
        return {
            "nodes": len(self.state.nodes),
            "podsByPhase": self.state.pods_by_phase(),
            "unschedulablePods": len(self.state.unschedulable),
            "unreachableNodes": len(self.unreachable),
            "pendingKubeletActions": len(self.timers),
        }
