"""The simulator's in-memory picture of the cluster, kept current by store listeners.

Controllers never list the store: they read this picture, which listeners update
synchronously inside every store write (so a pod a controller just created is already
counted when it computes status, and no "expectations" bookkeeping is needed).
Workload objects are cached whole; pods, of which there may be tens of thousands,
only as a slim `PodRecord`. Node accounting (what bound pods request of each node)
lives here too, so a deleted or finished pod frees its share at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flotilla.kubesim.sim.scheduling import NodeInfo, PodSchedulingSpec

Key = tuple[str, str]  # (namespace, name)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The ownerReference with `controller: true`, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def pod_is_ready(status: dict[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


@dataclass(slots=True)
class PodRecord:
    """What the simulator needs to remember about one pod."""

    namespace: str
    name: str
    uid: str
    owner_kind: str | None
    owner_name: str | None
    owner_uid: str | None
    labels: dict[str, str]
    scheduling: PodSchedulingSpec
    created: int
    node_name: str | None = None
    phase: str = "Pending"
    ready: bool = False
    ready_since: float | None = None  # monotonic time Ready last became True
    deleting: bool = False
    accounted_node: str | None = None
    unschedulable_message: str | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def active(self) -> bool:
        """Counts towards a controller's replicas: not finished and not being deleted."""
        return not self.deleting and self.phase not in TERMINAL_PHASES

    @property
    def target_node(self) -> str | None:
        """The node a DaemonSet pod is pinned to (by nodeName or a metadata.name term)."""
        if self.node_name:
            return self.node_name
        for term in self.scheduling.required_terms or ():
            for expression in term.get("matchFields") or ():
                values = expression.get("values") or []
                if (
                    expression.get("key") == "metadata.name"
                    and expression.get("operator") == "In"
                    and len(values) == 1
                ):
                    return str(values[0])
        return None


@dataclass
class ObjectCache:
    """Latest copy of every object of one workload kind, indexed by controller owner."""

    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    by_owner: dict[str, set[Key]] = field(default_factory=dict)

    def get(self, key: Key) -> dict[str, Any] | None:
        return self.objects.get(key)

    def put(self, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        self._unindex(key)
        self.objects[key] = obj
        ref = controller_ref(obj)
        if ref and ref.get("uid"):
            self.by_owner.setdefault(ref["uid"], set()).add(key)

    def remove(self, key: Key) -> dict[str, Any] | None:
        self._unindex(key)
        return self.objects.pop(key, None)

    def owned_by(self, uid: str) -> Iterator[dict[str, Any]]:
        for key in sorted(self.by_owner.get(uid, ())):
            obj = self.objects.get(key)
            if obj is not None:
                yield obj

    def _unindex(self, key: Key) -> None:
        old = self.objects.get(key)
        if old is None:
            return
        ref = controller_ref(old)
        if ref and ref.get("uid"):
            owned = self.by_owner.get(ref["uid"])
            if owned is not None:
                owned.discard(key)
                if not owned:
                    del self.by_owner[ref["uid"]]


@dataclass
class ClusterState:
    """Nodes, pods and workloads as the simulator currently knows them."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    node_ips: dict[str, str] = field(default_factory=dict)
    pods: dict[Key, PodRecord] = field(default_factory=dict)
    pods_by_owner: dict[str, set[Key]] = field(default_factory=dict)
    pods_by_node: dict[str, set[Key]] = field(default_factory=dict)
    unschedulable: set[Key] = field(default_factory=set)
    workloads: dict[str, ObjectCache] = field(default_factory=dict)

    def cache(self, kind: str) -> ObjectCache:
        return self.workloads.setdefault(kind, ObjectCache())

    def owned_pods(self, owner_uid: str) -> list[PodRecord]:
        keys = self.pods_by_owner.get(owner_uid, ())
        return [self.pods[k] for k in keys if k in self.pods]

    # -- pods ------------------------------------------------------------------------

    def add_pod(self, record: PodRecord) -> None:
        self.pods[record.key] = record
        if record.owner_uid:
            self.pods_by_owner.setdefault(record.owner_uid, set()).add(record.key)

    def set_owner(self, record: PodRecord, ref: dict[str, Any] | None) -> None:
        """Re-index a pod whose controller ownerReference changed."""
        self._unindex_owner(record)
        record.owner_kind = ref.get("kind") if ref else None
        record.owner_name = ref.get("name") if ref else None
        record.owner_uid = ref.get("uid") if ref else None
        if record.owner_uid:
            self.pods_by_owner.setdefault(record.owner_uid, set()).add(record.key)

    def _unindex_owner(self, record: PodRecord) -> None:
        if record.owner_uid:
            owned = self.pods_by_owner.get(record.owner_uid)
            if owned is not None:
                owned.discard(record.key)
                if not owned:
                    del self.pods_by_owner[record.owner_uid]

    def remove_pod(self, key: Key) -> PodRecord | None:
        record = self.pods.pop(key, None)
        if record is None:
            return None
        self.release(record)
        self.unschedulable.discard(key)
        self._unindex_owner(record)
        return record

    # -- node accounting -------------------------------------------------------------

    def account(self, record: PodRecord, node_name: str) -> bool:
        """Charge the pod's requests to `node_name` (once); False if the node is unknown."""
        if record.accounted_node == node_name:
            return True
        self.release(record)
        node = self.nodes.get(node_name)
        if node is None:
            return False
        node.reserve(record.scheduling.requests)
        record.accounted_node = node_name
        self.pods_by_node.setdefault(node_name, set()).add(record.key)
        return True

    def release(self, record: PodRecord) -> bool:
        """Give the pod's requests back to its node; True if something was freed."""
        name = record.accounted_node
        if name is None:
            return False
        record.accounted_node = None
        node = self.nodes.get(name)
        if node is not None:
            node.release(record.scheduling.requests)
        on_node = self.pods_by_node.get(name)
        if on_node is not None:
            on_node.discard(record.key)
        return True

    def set_node(self, info: NodeInfo) -> None:
        """Insert or refresh a node, recomputing what its bound pods request."""
        info.requested = {}
        self.nodes[info.name] = info
        for key in self.pods_by_node.get(info.name, set()):
            record = self.pods.get(key)
            if record is not None:
                info.reserve(record.scheduling.requests)

    def remove_node(self, name: str) -> set[Key]:
        """Forget a node; returns the pods that were bound to it."""
        self.nodes.pop(name, None)
        self.node_ips.pop(name, None)
        keys = self.pods_by_node.pop(name, set())
        for key in keys:
            record = self.pods.get(key)
            if record is not None:
                record.accounted_node = None
        return keys

    def pods_by_phase(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self.pods.values():
            counts[record.phase] = counts.get(record.phase, 0) + 1
        return counts
