"""What one scheduler replica knows of the fleet and the placements, and which objects
a change can affect.

Every replica follows both KV buckets of `flotilla.scheduler.records` (see
`flotilla.scheduler.service`), so this in-memory view covers *all* objects and
clusters, not only the partitions the replica consumes. That is what lets the
replica that receives a ``ClusterObserved`` or ``CapacityChanged`` (one replica,
the owner of the cluster key's partition) name every object the change affects.
It names them; it does not decide them. Each is sent a ``RescheduleRequested``
under its own key, so the decision happens on the object's partition owner, in
that object's event order, against its durable record.

Which objects a change can affect (the rest are left alone):

=============================================  ========================================
change to a cluster                            re-evaluated
=============================================  ========================================
cordoned (``unschedulable`` set)               nothing: cordon stops only new placements
new cluster, uncordoned, Ready again, taint    Pending objects, and ``copy`` objects
removed, APIs added                            (they go to every eligible cluster)
NotReady, taint added, APIs removed, cluster   objects placed there (Active or Retiring)
deleted
labels added, removed or changed               objects whose policy mentions that label
                                               key (selector, spread, weights)
status only (heartbeat, placements count,      nothing
capacity figures), ``evictAfter``               (draining is the drain coordinator's
                                               call: it asks with ``avoid_clusters``)
capacity record written (``CapacityChanged``)  Pending objects it could help
a placement changed                            objects that depend on that object
=============================================  ========================================

Nothing here does I/O; versions (KV revisions) make applying the same update
twice, or an older one after a newer one, a no-op.

Memory follows the live objects: a deleted object's record is kept (it holds the
revision late events are judged stale by) and remembered with the time it was
deleted, until the service tombstones it after the retention period; the
tombstone (``None``) drops the key from every map, and a reverse-map entry that
becomes empty goes with it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from flotilla.common import api, capacity
from flotilla.common.api import PlacementState, Strategy
from flotilla.common.events import ObjectRef, ResourceAnalyzed
from flotilla.scheduler.records import ClusterRecord, PlacementRecord


def _selector_keys(selector: api.LabelSelector | None) -> set[str]:
    if selector is None:
        return set()
    return set(selector.match_labels) | {e.key for e in selector.match_expressions}


def label_keys(policy: api.PlacementPolicySpec | None) -> frozenset[str]:
    """Every cluster label key the policy's placement depends on."""
    if policy is None:
        return frozenset()
    keys = _selector_keys(policy.cluster_selector)
    if policy.spread is not None:
        keys.add(policy.spread.label_key)
    for rule in policy.weights:
        keys |= _selector_keys(rule.cluster_selector)
    return frozenset(keys)


def dependency_keys(analyzed: ResourceAnalyzed) -> frozenset[str]:
    """The object keys of what `analyzed` depends on."""
    return frozenset(
        ObjectRef(api_version=d.api_version, kind=d.kind, name=d.name, namespace=d.namespace).key
        for d in analyzed.dependencies
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """One object as the index sees it."""

    record: PlacementRecord
    version: int
    """The KV revision of `record`."""
    clusters: frozenset[str]
    waiting: bool
    copies: bool
    label_keys: frozenset[str]
    dependencies: frozenset[str]

    @classmethod
    def of(cls, record: PlacementRecord, version: int) -> Entry:
        analyzed = record.analyzed
        policy = analyzed.policy_spec
        try:
            strategy = api.effective_strategy(analyzed.object, policy, analyzed.default_strategy)
        except ValueError:
            # An invalid annotation leaves the placement as it was (`core.schedule`).
            strategy = analyzed.strategy
        return cls(
            record=record,
            version=version,
            clusters=frozenset(p.cluster for p in record.clusters),
            waiting=record.waiting,
            copies=strategy is Strategy.COPY and not record.deleted,
            label_keys=label_keys(policy),
            dependencies=dependency_keys(record.analyzed),
        )


class Index:
    """Every object's placement record, with the reverse maps changes are matched by."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries: dict[str, Entry] = {}
        self._clock = clock
        self._deleted_at: dict[str, float] = {}
        """Keys whose record says deleted, with when this index first saw that."""
        self._on_cluster: defaultdict[str, set[str]] = defaultdict(set)
        self._waiting: set[str] = set()
        self._copies: set[str] = set()
        self._by_label: defaultdict[str, set[str]] = defaultdict(set)
        self._dependents: defaultdict[str, set[str]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def apply(self, key: str, record: PlacementRecord | None, version: int) -> bool:
        """Take in a record at KV revision `version`; older news is ignored (False)."""
        old = self.entries.get(key)
        if old is not None and old.version >= version:
            return False
        if old is not None:
            self._unlink(key, old)
        if record is None:
            self.entries.pop(key, None)
            self._deleted_at.pop(key, None)
            return True
        if record.deleted:
            # A deleted record still holds the revision stale events are judged by.
            self.entries[key] = Entry.of(record, version)
            self._deleted_at.setdefault(key, self._clock())
            return True
        self._deleted_at.pop(key, None)
        entry = Entry.of(record, version)
        self.entries[key] = entry
        for cluster in entry.clusters:
            self._on_cluster[cluster].add(key)
        if entry.waiting:
            self._waiting.add(key)
        if entry.copies:
            self._copies.add(key)
        for label in entry.label_keys:
            self._by_label[label].add(key)
        for dependency in entry.dependencies:
            self._dependents[dependency].add(key)
        return True

    def _unlink(self, key: str, entry: Entry) -> None:
        for cluster in entry.clusters:
            _discard(self._on_cluster, cluster, key)
        self._waiting.discard(key)
        self._copies.discard(key)
        for label in entry.label_keys:
            _discard(self._by_label, label, key)
        for dependency in entry.dependencies:
            _discard(self._dependents, dependency, key)

    def deleted_before(self, moment: float) -> list[str]:
        """Keys whose record has said deleted since before `moment` (the clock's time)."""
        return sorted(key for key, since in self._deleted_at.items() if since <= moment)

    def footprint(self) -> int:
        """How many keys all maps hold together (what forgetting keeps bounded)."""
        reverse = (self._on_cluster, self._by_label, self._dependents)
        return (
            len(self.entries)
            + len(self._deleted_at)
            + len(self._waiting)
            + len(self._copies)
            + sum(len(m) + sum(map(len, m.values())) for m in reverse)
        )

    def placed_on(self, cluster: str) -> set[str]:
        return set(self._on_cluster.get(cluster, ()))

    def waiting(self) -> set[str]:
        return set(self._waiting)

    def copies(self) -> set[str]:
        return set(self._copies)

    def selecting(self, label_keys: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for label in label_keys:
            found |= self._by_label.get(label, set())
        return found

    def dependents(self, key: str) -> set[str]:
        return set(self._dependents.get(key, ()))

    def dependency_placements(self, record_keys: Iterable[str]) -> dict[str, list[str]]:
        """Dependency key → the clusters it is pinned to, for those the index knows.

        An ``as-needed`` dependency pins nothing (it follows its dependents), so it
        maps to an empty list; dependencies not placed by the scheduler are absent.
        """
        pinned: dict[str, list[str]] = {}
        for key in record_keys:
            entry = self.entries.get(key)
            if entry is None or entry.record.deleted:
                continue
            record = entry.record
            if record.analyzed.strategy is Strategy.AS_NEEDED:
                pinned[key] = []
            else:
                pinned[key] = sorted(
                    p.cluster for p in record.clusters if p.state is PlacementState.ACTIVE
                )
        return pinned


def _discard(reverse: defaultdict[str, set[str]], name: str, key: str) -> None:
    keys = reverse.get(name)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del reverse[name]


@dataclass(frozen=True, slots=True)
class ClusterEntry:
    record: ClusterRecord
    version: int


class Clusters:
    """Every cluster as last written to the clusters bucket, and the newest revision seen."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries: dict[str, ClusterEntry] = {}
        self.version = 0
        """The newest KV revision taken in; `flotilla.scheduler.service` waits on it."""
        self._clock = clock
        self._removed_at: dict[str, float] = {}

    def apply(self, name: str, record: ClusterRecord | None, version: int) -> bool:
        self.version = max(self.version, version)
        old = self.entries.get(name)
        if old is not None and old.version >= version:
            return False
        if record is None:
            self.entries.pop(name, None)
            self._removed_at.pop(name, None)
        else:
            self.entries[name] = ClusterEntry(record, version)
            if record.cluster is None:
                self._removed_at.setdefault(name, self._clock())
            else:
                self._removed_at.pop(name, None)
        return True

    def removed_before(self, moment: float) -> list[str]:
        """Clusters recorded as removed since before `moment` (the clock's time)."""
        return sorted(name for name, since in self._removed_at.items() if since <= moment)

    def get(self, name: str) -> ClusterRecord | None:
        entry = self.entries.get(name)
        return entry.record if entry is not None else None

    def live(self) -> list[api.Cluster]:
        """The clusters decisions are made against (removed ones left out)."""
        return [e.record.cluster for e in self.entries.values() if e.record.cluster is not None]


# --- what a change affects ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Facts:
    """The parts of a cluster that placement depends on (status figures left out)."""

    labels: Mapping[str, str]
    taints: frozenset[tuple[str, str, str]]
    unschedulable: bool
    ready: bool
    api_resources: frozenset[api.GroupVersionKind]

    @classmethod
    def of(cls, cluster: api.Cluster) -> Facts:
        ready = cluster.status.condition(api.ClusterConditionType.READY)
        return cls(
            labels=dict(cluster.metadata.labels),
            taints=frozenset((t.key, t.value, t.effect.value) for t in cluster.spec.taints),
            unschedulable=cluster.spec.unschedulable,
            ready=ready is not None and ready.status is api.ConditionStatus.TRUE,
            api_resources=frozenset(r.gvk for r in cluster.status.api_resources),
        )

    def same_as(self, other: Facts) -> bool:
        return dataclasses.astuple(self) == dataclasses.astuple(other)


@dataclass(frozen=True, slots=True)
class Impact:
    """What a cluster change means: which kinds of objects to re-evaluate."""

    placed: bool = False
    """Objects placed on the cluster."""
    opened: bool = False
    """Pending and ``copy`` objects: the cluster may take new work now."""
    labels: frozenset[str] = frozenset()
    """Objects whose policy mentions one of these label keys."""

    @property
    def any(self) -> bool:
        return self.placed or self.opened or bool(self.labels)


def impact(old: api.Cluster | None, new: api.Cluster | None) -> Impact:
    """Which objects a change of one cluster from `old` to `new` can affect."""
    if new is None:
        return Impact(placed=old is not None)
    after = Facts.of(new)
    if old is None:
        return Impact(opened=True, labels=frozenset(after.labels))
    before = Facts.of(old)
    changed_labels = frozenset(
        key
        for key in before.labels.keys() | after.labels.keys()
        if before.labels.get(key) != after.labels.get(key)
    )
    placed = (
        (before.ready and not after.ready)
        or bool(after.taints - before.taints)
        or bool(after.api_resources and before.api_resources - after.api_resources)
    )
    opened = (
        (before.unschedulable and not after.unschedulable)
        or (after.ready and not before.ready)
        or bool(before.taints - after.taints)
        or bool(after.api_resources - before.api_resources)
        or bool(before.api_resources and not after.api_resources)
    )
    return Impact(placed=placed, opened=opened, labels=changed_labels)


def affected(index: Index, cluster: str, change: Impact) -> set[str]:
    """The keys of the objects `change` (to `cluster`) can affect."""
    keys: set[str] = set()
    if change.placed:
        keys |= index.placed_on(cluster)
    if change.opened:
        keys |= index.waiting() | index.copies()
    if change.labels:
        keys |= index.selecting(change.labels)
    return keys


def relevant(old: api.Cluster | None, new: api.Cluster | None) -> bool:
    """Whether the change is worth writing down: placement-relevant facts changed."""
    if old is None or new is None:
        return old is not new
    return not Facts.of(old).same_as(Facts.of(new))


def helped_by(record: PlacementRecord, cluster: str, room: capacity.ClusterCapacity) -> bool:
    """Whether `room` (the cluster's capacity record as it is now) could help a Pending
    object: one replica (or each component) of it fits there, and the object's last
    decision turned the cluster down for capacity or not at all — a cluster refused
    for a taint or a selector stays refused however much room it has."""
    reasons = record.decided.reasons_for(cluster)
    if any(not reason.startswith("capacity:") for reason in reasons):
        return False
    analyzed = record.analyzed
    if analyzed.components:
        return all(
            room.fit_replicas(dict(c.requests)) >= 1 for c in analyzed.components if c.replicas
        )
    return room.fit_replicas(dict(analyzed.requests)) >= 1


P = TypeVar("P", bound=BaseModel)


class Interned(Generic[P]):
    """One object per distinct value (its JSON), the most recent `limit` of them.

    Every event carries its own parsed copy of the object's policy; the core's memos
    are keyed by the policy object, so equal policies must be the same object for
    them to be reused."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._by_text: OrderedDict[str, P] = OrderedDict()

    def intern(self, value: P) -> P:
        text = value.model_dump_json(by_alias=True)
        found = self._by_text.get(text)
        if found is not None:
            self._by_text.move_to_end(text)
            return found
        self._by_text[text] = value
        if len(self._by_text) > self.limit:
            self._by_text.popitem(last=False)
        return value
