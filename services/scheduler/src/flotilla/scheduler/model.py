"""What goes into one scheduling decision and what comes out of it.

The scheduler core is a pure function ``core.schedule(SchedulingInput) -> Decision``
(deterministic: docs/architecture.md, "Rules every service follows"). This module
holds its value types:

* `Fleet` — the clusters and one capacity snapshot, with the per-cluster facts that
  every decision reads (labels, taints, readiness, served APIs, fit per request
  shape) computed once per snapshot. A service builds one `Fleet` per snapshot and
  reuses it for every object it schedules against that snapshot; building it is the
  only cost that grows with the fleet and does not depend on the object.
* `SchedulingInput` — one object (`events.ResourceAnalyzed`), its effective policy
  (``None``: no policy, every default), the `Fleet`, the previous placement, where
  the object's dependencies are placed, and ``now``.
* `Context` — facts about one decision derived from the input once (strategy, the
  request shape, which clusters already hold the object), so filters, scores and
  strategies do not recompute them per cluster.
* `Verdict` — why a cluster was not chosen, as a value with a code, the unit that
  decided, and one readable line (the Kubernetes scheduler framework's ``Status``).
* `Decision` — the placement, the reason, every rejection and a deterministic
  ``decision_id``; `Decision.to_event` gives the `events.PlacementDecided` payload.

These are frozen dataclasses rather than pydantic models on purpose: they are built
on the hot path (thousands of decisions per second over a thousand clusters), their
inputs were validated by pydantic where they entered the process, and nothing here
parses untrusted data.

Memoisation inside `Fleet` (selector matches, fits per request shape, placement
entries, the core's filter verdicts per policy and shape and their share of the
decision id) does not make the core impure: every cached value is a function of
the snapshot and its key alone.

Capacity records are typed by the protocols `CapacityRecord` and `CapacitySnapshot`,
which ``flotilla.common.capacity.ClusterCapacity`` / ``Snapshot`` satisfy, instead of
importing that module: it also holds the Redis adapter, and the pure core must not
have ``redis`` in its import graph (the import-linter contract follows imports under
``TYPE_CHECKING`` too).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import operator
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import compress, repeat
from operator import attrgetter, is_, mul
from typing import Any, Generic, Protocol, TypeVar

from flotilla.common import api, labels
from flotilla.common.api import GroupVersionKind, PlacementState, Strategy
from flotilla.common.events import (
    ClusterPlacement,
    Component,
    ObjectRef,
    PlacementDecided,
    ResourceAnalyzed,
)


class NodeRecord(Protocol):
    """One node of a capacity record (``flotilla.common.capacity.NodeCapacity``)."""

    @property
    def free(self) -> Mapping[str, int]: ...


class CapacityRecord(Protocol):
    """What the core reads of ``flotilla.common.capacity.ClusterCapacity``."""

    @property
    def allocatable(self) -> Mapping[str, int]: ...

    @property
    def available(self) -> Mapping[str, int]: ...

    @property
    def reserved(self) -> Mapping[str, int]: ...

    @property
    def nodes(self) -> Sequence[NodeRecord]: ...

    @property
    def observed_at(self) -> float: ...

    @property
    def headroom(self) -> Mapping[str, int]:
        """``available`` minus live reservations."""

    def fit_replicas(self, per_replica: dict[str, int]) -> int:
        """How many more pods of this shape fit (node-level, minus reservations)."""

    def model_dump_json(self, *, exclude: Any = None) -> str: ...


class CapacitySnapshot(Protocol):
    """What the core reads of ``flotilla.common.capacity.Snapshot``."""

    def get(self, cluster: str) -> CapacityRecord | None: ...


PODS = "pods"
"""Every pod uses one pod slot (mirrors ``flotilla.common.capacity.PODS``)."""

UNBOUNDED = 2**31 - 1
"""A fit larger than any replica count (mirrors ``flotilla.common.capacity.UNBOUNDED``)."""

MAX_SETS_ESTIMATE = 64
"""Whole component sets are packed onto nodes one by one; counting stops here."""

RequestsKey = tuple[tuple[str, int], ...]

Unit = TypeVar("Unit")
K = TypeVar("K")
V = TypeVar("V")


class Registry(Generic[Unit]):
    """Small units (filters, scores, strategies) by name, in registration order.

    After the Kubernetes scheduler framework's ``Registry``: one dict, and
    registering a name twice is an error rather than a silent replacement.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._units: dict[str, Unit] = {}

    def add(self, name: str, unit: Unit) -> Unit:
        if name in self._units:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._units[name] = unit
        return unit

    def register(self, name: str) -> Callable[[Unit], Unit]:
        """Decorator form of `add`."""

        def decorate(unit: Unit) -> Unit:
            return self.add(name, unit)

        return decorate

    def __getitem__(self, name: str) -> Unit:
        return self._units[name]

    def __contains__(self, name: object) -> bool:
        return name in self._units

    def __iter__(self) -> Iterator[str]:
        return iter(self._units)

    def __len__(self) -> int:
        return len(self._units)

    def items(self) -> list[tuple[str, Unit]]:
        return list(self._units.items())


def aware(moment: datetime) -> datetime:
    """``moment`` with a time zone; naive times are taken as UTC (Kubernetes' zone)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


MARK_BITS = 28
"""Bits of a cluster's and a verdict's mark (`Fleet.rejections_mark`): their product
stays one machine word and a fleet's sum of them one C long for ``sum``, where
64-bit marks made every term a multi-digit multiplication."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
"""2**64 / golden ratio: the usual odd multiplier of multiplicative hashing."""


def hash64(text: str) -> int:
    """A stable 64-bit hash of ``text`` (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def components_key(components: Sequence[Component]) -> str:
    """A hashable form of a component list (a cache key)."""
    if not components:
        return "[]"  # most objects: what json.dumps gives, without calling it per decision
    return json.dumps([[c.name, c.replicas, sorted(c.requests.items())] for c in components])


def requests_key(requests: Mapping[str, int]) -> RequestsKey:
    """A hashable, order-independent form of a request shape (a cache key)."""
    return tuple(sorted(requests.items()))


class Code(enum.StrEnum):
    """How a rejection may go away (after Kubernetes ``framework.Code``)."""

    UNSCHEDULABLE = "Unschedulable"
    """The cluster's state rules it out now (cordon, readiness, capacity, taints)."""
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    """The policy or the object rules it out; only editing one of them changes that."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why one cluster was not chosen: a value, never an exception."""

    code: Code
    unit: str
    """The filter, score or selection step that decided (e.g. ``cordon``)."""
    reason: str
    """One readable line, shown by ``describe``."""
    line: str = field(init=False, repr=False, compare=False)
    """``code:unit:reason`` (built once per verdict)."""
    mark: int = field(init=False, repr=False, compare=False)
    """`MARK_BITS` of `hash64` of `line`, made odd: what the decision id hashes of this
    verdict, times the rejected cluster's own mark (`Fleet.rejections_mark`)."""
    text: str = field(init=False, repr=False, compare=False)
    """``unit: reason``, what the event shows (built once: one verdict object is
    shared by every cluster it rejects, and by every decision of a memoised filter)."""

    def __post_init__(self) -> None:
        line = f"{self.code}:{self.unit}:{self.reason}"
        object.__setattr__(self, "line", line)
        object.__setattr__(self, "mark", hash64(line) >> (64 - MARK_BITS) | 1)
        object.__setattr__(self, "text", f"{self.unit}: {self.reason}")

    def __str__(self) -> str:
        return self.text


Rejections = dict[str, Verdict]
"""Cluster name → why it was rejected; clusters that pass are absent."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The facts about one cluster that decisions read, fixed for a fleet's lifetime.

    Its capacity record is not among them: records are patched while the cluster
    objects are not, so the record lives in `Fleet.records` and a view never has to
    be rebuilt (nor a memo holding views updated) when a claim changes capacity."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[api.Taint, ...]
    unschedulable: bool
    ready: bool
    not_ready_reason: str
    """Why the cluster is not Ready (empty when it is)."""
    api_resources: frozenset[GroupVersionKind]
    """Empty when the cluster has not reported its API resources yet."""
    placements: int
    """Objects placed on the cluster (``status.placements``); the balance score reads it."""
    name_hash: int
    """64 bits of blake2b over the name; `Context.tiebreaks` mixes in the object's uid."""

    @classmethod
    def of(cls, cluster: api.Cluster) -> ClusterView:
        ready = cluster.status.condition(api.ClusterConditionType.READY)
        if ready is None:
            not_ready = "no Ready condition reported yet"
        elif ready.status is not api.ConditionStatus.TRUE:
            detail = ": ".join(part for part in (ready.reason, ready.message) if part)
            not_ready = f"Ready is {ready.status.value}" + (f" ({detail})" if detail else "")
        else:
            not_ready = ""
        return cls(
            name=cluster.metadata.name,
            labels=dict(cluster.metadata.labels),
            taints=tuple(cluster.spec.taints),
            unschedulable=cluster.spec.unschedulable,
            ready=not not_ready,
            not_ready_reason=not_ready,
            api_resources=frozenset(r.gvk for r in cluster.status.api_resources),
            placements=cluster.status.placements,
            name_hash=hash64(cluster.metadata.name),
        )


def _shape(requests: Mapping[str, int]) -> dict[str, int]:
    shape = dict(requests)
    shape.setdefault(PODS, 1)
    return shape


def _count(free: Mapping[str, int], shape: Mapping[str, int]) -> int:
    counts = [max(free.get(r, 0), 0) // amount for r, amount in shape.items() if amount > 0]
    return min(counts, default=UNBOUNDED)


_Amounts = tuple[tuple[str, int], ...]
"""A shape's positive amounts, taken out once per `Fleet.fits` call."""


def _count_amounts(free: Mapping[str, int], amounts: _Amounts) -> int:
    """`_count` of a shape given as its positive amounts (the per-cluster loop of
    `Fleet.fits`, run for every patched cluster and shape after each claim)."""
    best = UNBOUNDED
    for resource, amount in amounts:
        have = free.get(resource, 0)
        if have <= 0:
            return 0
        count = have // amount
        if count < best:
            best = count
    return best


def whole_sets(record: CapacityRecord, components: Sequence[Component]) -> int:
    """How many complete sets of ``components`` fit on one cluster (0 when none does).

    Sets are packed onto the nodes' free capacity one after another, each pod
    first-fit onto the first node with room, largest pods first. First-fit
    decreasing is what a person would do by hand and is never optimistic: a set it
    places really fits. It stops at `MAX_SETS_ESTIMATE` sets (an estimate, not a
    promise beyond the first) and at the cluster-level headroom, which is where live
    reservations count. A record without nodes is judged at the cluster level alone,
    like ``ClusterCapacity.fit_replicas``.
    """
    pods = [_shape(c.requests) for c in components for _ in range(c.replicas)]
    total: dict[str, int] = {}
    for pod in pods:
        for resource, amount in pod.items():
            total[resource] = total.get(resource, 0) + amount
    bound = min(_count(record.headroom, total), MAX_SETS_ESTIMATE)
    if not record.nodes or bound == 0:
        return bound
    resources = sorted(total)
    pods.sort(key=lambda pod: tuple(pod.get(r, 0) for r in resources), reverse=True)
    free = [dict(node.free) for node in record.nodes]
    sets = 0
    while sets < bound:
        for pod in pods:
            node = next(
                (n for n in free if all(n.get(r, 0) >= amount for r, amount in pod.items())),
                None,
            )
            if node is None:
                return sets
            for resource, amount in pod.items():
                node[resource] = node.get(resource, 0) - amount
        sets += 1
    return sets


class Fleet:
    """The clusters plus one capacity snapshot, prepared for many decisions.

    Views are ordered by cluster name, so every loop over the fleet is deterministic
    whatever order the clusters arrived in. Its memos grow with the distinct
    policies and request shapes decided against it.

    `patch` replaces the capacity records of a few clusters in place (a service
    applying its own claims, or re-reading a cluster that refused one): only those
    clusters' records and fingerprint parts are replaced (views hold no capacity,
    so they stay), and every memo that reads capacity (fits per shape, the core's
    filter verdicts) recomputes just the clusters changed since it was filled, the
    next time it is read. A patched
    fleet decides exactly as a fleet built fresh from the same clusters and
    records would, ``decision_id`` included. It is not safe to share between
    threads (the scheduler service is one asyncio loop).
    """

    def __init__(self, clusters: Iterable[api.Cluster], snapshot: CapacitySnapshot) -> None:
        by_name: dict[str, api.Cluster] = {}
        for cluster in clusters:
            name = cluster.metadata.name
            if name in by_name:
                raise ValueError(f"cluster {name!r} appears twice in the fleet")
            by_name[name] = cluster
        self.clusters: tuple[api.Cluster, ...] = tuple(by_name[n] for n in sorted(by_name))
        self._cluster_by_name = by_name
        self.records: dict[str, CapacityRecord] = {}
        """Cluster → its capacity record (clusters without one are absent)."""
        self._cluster_digest: dict[str, bytes] = {}
        self._parts: dict[str, bytes] = {}
        self._base: dict[str, tuple[object, object, object, float, bytes]] = {}
        for cluster in self.clusters:
            name = cluster.metadata.name
            self._cluster_digest[name] = hashlib.sha256(
                cluster.model_dump_json(by_alias=True).encode()
            ).digest()
            record = snapshot.get(name)
            if record is not None:
                self.records[name] = record
            self._parts[name] = self._part(name, record)
        self.views: tuple[ClusterView, ...] = tuple(ClusterView.of(c) for c in self.clusters)
        self.by_name: dict[str, ClusterView] = {v.name: v for v in self.views}
        self.fingerprint = self._fingerprint()
        self.epoch = 0
        """Bumped by every `patch`; memos remember the epoch they were filled at."""
        self._changed_at: dict[str, int] = dict.fromkeys(self.by_name, 0)
        """Cluster → the epoch of the last patch that changed it (0: none did)."""
        self._stale_since: dict[int, list[ClusterView]] = {}
        """Epoch → `_stale` of it at the current epoch (emptied by every patch)."""
        self._recent: list[list[str]] = []
        """The names each of the last `RECENT_PATCHES` patches changed, oldest first."""
        self._selected: dict[str, frozenset[str]] = {}
        self._fits: dict[RequestsKey, tuple[int, dict[str, int]]] = {}
        self._node_fits: dict[RequestsKey, dict[str, tuple[object, int]]] = {}
        """Shape → cluster → (its record's node list, the node-level fit): per shape
        first, so that the shape (a tuple of pairs) is hashed once per `fits` call."""
        self._sets: dict[str, tuple[int, dict[str, int]]] = {}
        self._placements: dict[tuple[str, int | None, PlacementState], ClusterPlacement] = {}
        self._placement_lines: dict[tuple[str, int | None, PlacementState], str] = {}
        self._policies: dict[int, tuple[api.PlacementPolicySpec, str, str]] = {}
        self._selectors: dict[int, tuple[api.LabelSelector, str]] = {}
        self._verdicts: dict[
            Hashable, tuple[int, list[ClusterView], Rejections, frozenset[str]]
        ] = {}
        """Key → (epoch, passing, rejections, the rejected names whose rejection stands)."""
        self.memo: dict[Hashable, Any] = {}
        """Per-fleet results other modules compute that do not read capacity."""

    def _part(self, name: str, record: CapacityRecord | None) -> bytes:
        """One cluster's share of the fingerprint: its object and its record, hashed.

        The record is hashed as its reported figures (hashed once per record: a
        record that only had its reservations patched shares them) plus its
        reserved totals in sorted order, however they were read or patched."""
        if record is None:
            return hashlib.sha256(self._cluster_digest[name] + b"\x1e-").digest()
        base = self._base.get(name)
        if (
            base is None
            or base[0] is not record.nodes
            or base[1] is not record.available
            # (A record with only its reservations patched shares the dict: no
            # comparison item by item then.)
            or (base[2] is not record.allocatable and base[2] != record.allocatable)
            or base[3] != record.observed_at
        ):
            figures = hashlib.sha256(record.model_dump_json(exclude={"reserved"}).encode())
            base = (
                record.nodes,
                record.available,
                record.allocatable,
                record.observed_at,
                self._cluster_digest[name] + b"\x1e" + figures.digest(),
            )
            self._base[name] = base
        return hashlib.sha256(base[4] + _reserved_text(record.reserved).encode()).digest()

    def _fingerprint(self) -> str:
        return hashlib.sha256(b"".join(self._parts.values())).hexdigest()

    def get(self, cluster: str) -> CapacityRecord | None:
        """The capacity record of `cluster` in this fleet (a fleet reads as a snapshot)."""
        return self.records.get(cluster)

    def patch(self, records: Mapping[str, CapacityRecord | None]) -> None:
        """Replace the capacity records of the named clusters (None: it has none).

        Names that are not clusters of this fleet are ignored: the cluster set and
        the cluster objects are fixed for a fleet's lifetime (build a new one when
        they change)."""
        clusters = self._cluster_by_name
        changed = [name for name in records if name in clusters]
        if not changed:
            return
        self.epoch = epoch = self.epoch + 1
        self._stale_since.clear()
        # Names bound once: a copy object's claim patches most of the fleet.
        own, parts, part, changed_at = self.records, self._parts, self._part, self._changed_at
        for name in changed:
            record = records[name]
            if record is None:
                own.pop(name, None)
            else:
                own[name] = record
            parts[name] = part(name, record)
            changed_at[name] = epoch
        self.fingerprint = self._fingerprint()
        self._recent.append(changed)
        if len(self._recent) > RECENT_PATCHES:
            del self._recent[0]

    def _stale(self, epoch: int) -> list[ClusterView]:
        """Views of the clusters patched after `epoch`, in name order (remembered
        until the next patch: the memos filled by one decision are read together)."""
        behind = self.epoch - epoch
        if behind == 0:
            return []
        stale = self._stale_since.get(epoch)
        if stale is None:
            stale = self._stale_since[epoch] = self._patched_since(epoch, behind)
        return stale

    def _patched_since(self, epoch: int, behind: int) -> list[ClusterView]:
        """`_stale` computed: the views of the clusters the last `behind` patches changed."""
        if behind <= len(self._recent):
            patches = self._recent[-behind:]
            if sum(map(len, patches)) < len(self.views) // 4:
                # A memo a few small patches old: the names those patches touched,
                # not a pass over the whole fleet.
                names = set().union(*patches)
                return [self.by_name[name] for name in sorted(names)]
        # Many names (a copy object's claim patches most of the fleet, and a memo
        # behind one or more of those would union them all): one pass over the
        # fleet, already in name order.
        # (C-level passes: the views are fixed for the fleet's lifetime, in the
        # order `_changed_at` was filled in.)
        since = map(epoch.__lt__, self._changed_at.values())
        return list(compress(self.views, since))

    def verdicts(
        self,
        key: Hashable,
        judge: Callable[[Sequence[ClusterView]], tuple[list[ClusterView], Rejections]],
        *,
        stands: Callable[[Verdict], bool] | None = None,
        again: Callable[[Sequence[ClusterView]], tuple[list[ClusterView], Rejections]]
        | None = None,
    ) -> tuple[list[ClusterView], Rejections]:
        """The memoised verdicts of `judge` over every cluster: (passing, rejections).

        `judge` must judge each cluster on its own (a cluster's verdict never
        depends on which other clusters are judged with it), so after a `patch`
        only the patched clusters are judged again, and of those not the ones
        whose rejection `stands` (it did not read capacity, the only thing a patch
        changes). `again`, when given, judges those instead of `judge`: it may skip
        what cannot have changed for a cluster that passed, or whose rejection did
        not stand. (`stands` must depend on the verdict alone: which rejections
        stand is remembered with the memo.) Rejections are kept in a canonical
        order (by unit, then cluster name) so that a patched fleet and a fresh one
        list them alike.
        """
        entry = self._verdicts.get(key)
        if entry is None:
            return self._remember_verdicts(key, judge(self.views)[1], stands)
        epoch, passing, rejections, standing = entry
        stale = self._stale(epoch)
        if stale and standing:
            stale = [v for v in stale if v.name not in standing]
        if not stale:
            if epoch != self.epoch:
                self._verdicts[key] = (self.epoch, passing, rejections, standing)
            return passing, rejections
        _, rejected = (again or judge)(stale)
        # Usually a patch changes no verdict (a cluster with room keeps passing, one
        # without keeps the same words): then the memo's own objects are returned
        # again (`verdicts_mark` then knows their mark without a pass), and views
        # carry no capacity, so the passing list holds no stale view. Nothing
        # rejected now, and nothing judged again rejected before, is that at once.
        if not rejected and rejections.keys().isdisjoint(map(_NAME, stale)):
            self._verdicts[key] = (self.epoch, passing, rejections, standing)
            return passing, rejections
        updated: Rejections | None = None
        moved = False
        reworded: list[str] = []
        for view in stale:
            name = view.name
            before = rejections.get(name)
            after = rejected.get(name)
            if after is None:
                if before is None:
                    continue
                moved = True
            elif before is None or before.unit != after.unit:
                moved = True
            elif before == after:
                continue
            if updated is None:
                updated = dict(rejections)
            if after is None:
                del updated[name]
            else:
                updated[name] = after  # the same unit: the same place in the order
                reworded.append(name)
        if updated is None:
            self._verdicts[key] = (self.epoch, passing, rejections, standing)
            return passing, rejections
        if moved:
            return self._remember_verdicts(key, updated, stands)
        if stands is not None:
            # The reworded clusters were judged again: none of them stood before.
            standing = standing.union([n for n in reworded if stands(updated[n])])
        self._verdicts[key] = (self.epoch, passing, updated, standing)
        return passing, updated

    def _remember_verdicts(
        self, key: Hashable, rejections: Rejections, stands: Callable[[Verdict], bool] | None
    ) -> tuple[list[ClusterView], Rejections]:
        """Store verdicts in canonical form: rejections by (unit, cluster name), and
        every other cluster passing, in fleet order; and the names of the rejected
        clusters whose rejection `stands` (never judged again after a patch)."""
        rejections = dict(sorted(rejections.items(), key=lambda item: (item[1].unit, item[0])))
        passing = [v for v in self.views if v.name not in rejections]
        standing = (
            frozenset(name for name, verdict in rejections.items() if stands(verdict))
            if stands is not None
            else frozenset()
        )
        _bounded(self._verdicts)[key] = (self.epoch, passing, rejections, standing)
        return passing, rejections

    def placement(
        self, cluster: str, replicas: int | None, state: PlacementState
    ) -> ClusterPlacement:
        """The (frozen, so shareable) placement entry; built once per fleet."""
        key = (cluster, replicas, state)
        entry = self._placements.get(key)
        if entry is None:
            entry = ClusterPlacement(cluster=cluster, replicas=replicas, state=state)
            self._placements[key] = entry
        return entry

    def placement_line(self, entry: ClusterPlacement) -> str:
        """``cluster=replicas:state``, what the decision id hashes of a placement
        (memoised: formatting the state enum is a Python-level call per entry)."""
        key = (entry.cluster, entry.replicas, entry.state)
        line = self._placement_lines.get(key)
        if line is None:
            line = f"{entry.cluster}={entry.replicas}:{entry.state}"
            _bounded(self._placement_lines)[key] = line
        return line

    @functools.cached_property
    def _active(self) -> dict[tuple[str, int | None], tuple[ClusterPlacement, str]]:
        """(cluster, replicas) → its Active `placement` entry and `placement_line`."""
        return {}

    def active_entries(
        self, placements: Sequence[tuple[str, int | None]]
    ) -> list[tuple[ClusterPlacement, str]]:
        """The Active `placement` entry and `placement_line` of each (cluster, replicas),
        looked up in one C-level pass (a copy lands on most of the fleet: two method
        calls per cluster were a tenth of its decision)."""
        memo = self._active
        found = list(map(memo.get, placements))
        if None in found:
            for i, pair in enumerate(placements):
                if found[i] is None:
                    entry = self.placement(pair[0], pair[1], PlacementState.ACTIVE)
                    found[i] = _bounded(memo)[pair] = (entry, self.placement_line(entry))
        return found  # type: ignore[return-value]  # (no None left)

    def policy_text(self, policy: api.PlacementPolicySpec | None) -> str | None:
        """The policy as canonical JSON, for decision ids (memoised per policy object).

        Keyed by identity and holding the policy itself, so an id is never reused
        for another policy while the entry lives; policies are not mutated once
        parsed (they come from validated hub objects).
        """
        if policy is None:
            return None
        return self._policy_entry(policy)[1]

    def _policy_entry(self, policy: api.PlacementPolicySpec) -> tuple[Any, str, str]:
        """(the policy, `policy_text`, that text as a JSON string): the last is what
        `SchedulingInput.digest` writes, escaped once per policy instead of per
        decision."""
        entry = self._policies.get(id(policy))
        if entry is None:
            text = json.dumps(policy.model_dump(mode="json", by_alias=True), sort_keys=True)
            entry = (policy, text, json.dumps(text))
            _bounded(self._policies)[id(policy)] = entry
        return entry

    def policy_json(self, policy: api.PlacementPolicySpec | None) -> str:
        """``json.dumps(policy_text(policy))``, memoised with it."""
        return "null" if policy is None else self._policy_entry(policy)[2]

    def selector_text(self, selector: api.LabelSelector) -> str:
        """``selector.model_dump_json()``, a memo key (memoised per selector object, as
        `policy_text`: every decision under a policy keys its filters by it)."""
        entry = self._selectors.get(id(selector))
        if entry is None:
            entry = (selector, selector.model_dump_json())
            _bounded(self._selectors)[id(selector)] = entry
        return entry[1]

    def selected_by(self, selector: api.LabelSelector) -> frozenset[str]:
        """Names of the clusters ``selector`` selects (memoised per selector)."""
        key = self.selector_text(selector)
        selected = self._selected.get(key)
        if selected is None:
            selected = frozenset(v.name for v in self.views if labels.matches(selector, v.labels))
            self._selected[key] = selected
        return selected

    def fits(self, per_replica: Mapping[str, int]) -> Mapping[str, int]:
        """Cluster → how many more replicas of this shape fit (clusters with a record).

        The fit rule of ``ClusterCapacity.fit_replicas``, with its node-level half
        remembered per record's node list: a patch that only changed a cluster's
        reservations recomputes the cluster-level half alone. (One loop, no call per
        cluster: a copy object's claims patch every cluster, and every shape decided
        next recomputes them all.)"""
        key = requests_key(per_replica)
        entry = self._fits.get(key)
        if entry is not None and entry[0] == self.epoch:
            return entry[1]
        if entry is None:
            views: Iterable[ClusterView] = self.views
            values: dict[str, int] = {}
        else:
            views = self._stale(entry[0])
            values = dict(entry[1])
        amounts = tuple((r, amount) for r, amount in _shape(per_replica).items() if amount > 0)
        records = self.records
        node_fits = self._node_fits.get(key)
        if node_fits is None:
            node_fits = _bounded(self._node_fits)[key] = {}
        for view in views:
            name = view.name
            record = records.get(name)
            if record is None:
                values.pop(name, None)
                continue
            # The record's `headroom` a resource at a time (available minus reserved;
            # none where nothing is available), without building it as a dict.
            available, reserved = record.available, record.reserved
            fit = UNBOUNDED
            for resource, amount in amounts:
                have = available.get(resource)
                if have is None:
                    fit = 0
                    break
                have -= reserved.get(resource, 0)
                if have <= 0:
                    fit = 0
                    break
                count = have // amount
                if count < fit:
                    fit = count
            nodes = record.nodes
            if nodes and fit:
                remembered = node_fits.get(name)
                if remembered is None or remembered[0] is not nodes:
                    remembered = (nodes, sum(_count_amounts(node.free, amounts) for node in nodes))
                    node_fits[name] = remembered
                if remembered[1] < fit:
                    fit = remembered[1]
            values[name] = fit
        _bounded(self._fits)[key] = (self.epoch, values)
        return values

    def set_fits(self, components: Sequence[Component]) -> Mapping[str, int]:
        """Cluster → how many whole sets of ``components`` fit (see `whole_sets`)."""

        def sets(record: CapacityRecord) -> int:
            return whole_sets(record, components)

        return self._per_cluster(self._sets, components_key(components), sets)

    def _per_cluster(
        self,
        memo: dict[Any, tuple[int, dict[str, int]]],
        key: Hashable,
        compute: Callable[[CapacityRecord], int],
    ) -> dict[str, int]:
        """Cluster → `compute` of it for clusters with a record, memoised under `key`
        and recomputed only for the clusters patched since."""
        entry = memo.get(key)
        if entry is not None and entry[0] == self.epoch:
            return entry[1]
        records = self.records
        if entry is None:
            values = {v.name: compute(records[v.name]) for v in self.views if v.name in records}
        else:
            values = dict(entry[1])
            for view in self._stale(entry[0]):
                record = records.get(view.name)
                if record is None:
                    values.pop(view.name, None)
                else:
                    values[view.name] = compute(record)
        _bounded(memo)[key] = (self.epoch, values)
        return values

    # --- the rejections' share of decision ids ---------------------------------------

    @functools.cached_property
    def _name_marks(self) -> dict[str, int]:
        """Cluster → its mark in `rejections_mark`: `MARK_BITS` of its name hash, made
        odd (the cluster set is fixed for a fleet's lifetime: built once)."""
        return {v.name: v.name_hash >> (64 - MARK_BITS) | 1 for v in self.views}

    @functools.cached_property
    def _marks(self) -> dict[Hashable, tuple[int, Rejections, int]]:
        """Verdict memo key → (epoch, the rejections `verdicts` returned then, their
        `rejections_mark`)."""
        return {}

    def rejections_mark(self, rejections: Mapping[str, Verdict]) -> int:
        """The sum over `rejections` of the cluster's mark times its verdict's
        (`Verdict.mark`): what a decision id hashes of its rejections.

        A sum, not a hash of the lines in order, so that it adds up from parts: the
        memoised verdicts' share is summed once per memo (`verdicts_mark`) and a
        decision adds or takes away only its own (holders, per-decision filters, the
        strategy's). Swapping two clusters' verdicts changes it (the marks are odd
        numbers, their products distinct), and any difference in the input is
        in the decision id through `SchedulingInput.digest` anyway: this share is
        there so that the id also names the result."""
        names = self._name_marks
        verdicts = list(rejections.values())
        if verdicts and all(map(is_, verdicts, repeat(verdicts[0]))):
            # One verdict for all (a strategy's "ranked below the chosen ones", a
            # selector's): its mark times the names' sum, one multiplication.
            return verdicts[0].mark * sum(map(names.__getitem__, rejections))
        return sum(map(mul, map(names.__getitem__, rejections), map(_MARK, verdicts)))

    def verdicts_mark(self, key: Hashable, rejections: Rejections) -> int:
        """`rejections_mark` of the rejections `verdicts(key, ...)` has just returned,
        memoised per key: after a patch only the patched clusters' terms are taken
        out and put back (`verdicts` judges only those again, so no other cluster's
        verdict can differ), not every rejection summed again per decision."""
        entry = self._marks.get(key)
        if entry is not None:
            epoch, known, total = entry
            if known is rejections:
                if epoch != self.epoch:
                    self._marks[key] = (self.epoch, rejections, total)
                return total
            stale = self._stale(epoch)
            if 2 * len(stale) < len(rejections):
                names = self._name_marks
                for view in stale:
                    name = view.name
                    before = known.get(name)
                    after = rejections.get(name)
                    if before is not None:
                        total -= names[name] * before.mark
                    if after is not None:
                        total += names[name] * after.mark
                _bounded(self._marks)[key] = (self.epoch, rejections, total)
                return total
        total = self.rejections_mark(rejections)
        _bounded(self._marks)[key] = (self.epoch, rejections, total)
        return total


_MARK = attrgetter("mark")
_NAME = attrgetter("name")

RECENT_PATCHES = 32
"""Patches a fleet remembers the names of (`Fleet._stale`); older memos scan the fleet."""

MEMO_LIMIT = 4096
"""Entries a per-fleet memo keeps: a fleet lives as long as its clusters do, and
the policies and shapes decided against it keep coming."""


def _bounded(memo: dict[K, V]) -> dict[K, V]:
    """`memo`, emptied first when full (refilled by the next decisions)."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    return memo


_ReservedForm = tuple[str, Callable[[Mapping[str, int]], tuple[int, ...]]]
_RESERVED_FORMS: dict[tuple[str, ...], _ReservedForm] = {}
"""Reserved totals' resource names in the order a record holds them → the text of
`_reserved_text` with a ``%r`` per amount, and what takes the amounts out in
sorted order (few distinct sets of names: one or two per request shape)."""


def _reserved_text(reserved: Mapping[str, int]) -> str:
    """``repr(sorted(reserved.items()))``, what a fingerprint part hashes of a
    record's reservations, from a template per set of names: a third of repr's cost
    (its recursion guard per list and tuple, a repr per name). `Fleet.patch` makes
    it for every patched cluster, and a copy object's claim patches most of them."""
    names = tuple(reserved)
    form = _RESERVED_FORMS.get(names)
    if form is None:
        order = sorted(names)
        template = ", ".join(f"({repr(name).replace('%', '%%')}, %r)" for name in order)
        amounts: Callable[[Mapping[str, int]], tuple[int, ...]]
        if len(order) > 1:
            amounts = operator.itemgetter(*order)
        else:
            amounts = functools.partial(_amounts, tuple(order))
        form = _bounded(_RESERVED_FORMS)[names] = (f"[{template}]", amounts)
    return form[0] % form[1](reserved)


def _amounts(order: tuple[str, ...], reserved: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(reserved[name] for name in order)


@dataclass(frozen=True, slots=True)
class SchedulingInput:
    """Everything one decision depends on; the same input always gives the same decision."""

    analyzed: ResourceAnalyzed
    """The object as the dependency detector interpreted it."""
    policy: api.PlacementPolicySpec | None
    """The effective (highest-priority matching) policy; ``None`` means every default."""
    fleet: Fleet
    now: datetime
    """The decision's clock: NoExecute toleration windows compare to it."""
    previous: tuple[ClusterPlacement, ...] = ()
    """The durable placement record as it stood before this decision."""
    dependency_placements: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Dependency key → clusters it is pinned to. An empty list pins nothing (the
    dependency is ``as-needed`` and follows this object instead). Keys appear in
    rejection reasons as given; ``events.ObjectRef.key`` form reads best."""
    avoid_clusters: frozenset[str] = frozenset()
    """Clusters a ``RescheduleRequested`` asked to leave (failover); even existing
    placements there are moved."""

    @classmethod
    def of(
        cls,
        analyzed: ResourceAnalyzed,
        *,
        policy: api.PlacementPolicySpec | None,
        clusters: Iterable[api.Cluster],
        snapshot: CapacitySnapshot,
        previous: Iterable[ClusterPlacement] = (),
        dependency_placements: Mapping[str, Sequence[str]] | None = None,
        now: datetime,
        avoid_clusters: Iterable[str] = (),
    ) -> SchedulingInput:
        """An input with its own `Fleet`; prefer sharing one `Fleet` across decisions."""
        return cls(
            analyzed=analyzed,
            policy=policy,
            fleet=Fleet(clusters, snapshot),
            previous=tuple(previous),
            dependency_placements=dict(dependency_placements or {}),
            now=now,
            avoid_clusters=frozenset(avoid_clusters),
        )

    @property
    def uid(self) -> str:
        """The object's uid, the seed of every tie-break; its key when it has none."""
        metadata = self.analyzed.object.get("metadata") or {}
        return str(metadata.get("uid") or self.analyzed.ref.key)

    def digest(self) -> str:
        """A hash of everything this decision reads (the input half of ``decision_id``).

        sha256 of the object's facts, the policy (its canonical JSON, `Fleet.policy_json`),
        the fleet's fingerprint, the previous placement, the dependencies' placements,
        ``now`` and the clusters to avoid, joined by ``\\x1e``. Each part but the policy
        and the fingerprint is written with ``repr``: they are tuples and lists of
        strings, numbers, booleans and ``None``, whose ``repr`` is the same in every
        process, names its values unambiguously (strings quoted, control characters
        escaped, so never a bare ``\\x1e``), and costs one C call where a JSON
        encoder call per part cost microseconds."""
        analyzed = self.analyzed
        metadata = analyzed.object.get("metadata") or {}
        components = analyzed.components
        facts = (
            analyzed.ref.key,
            metadata.get("uid"),
            metadata.get("generation"),
            metadata.get("resourceVersion"),
            (metadata.get("annotations") or {}).get(api.STRATEGY_ANNOTATION),
            analyzed.deleted,
            analyzed.strategy.value,
            analyzed.replicas,
            sorted(analyzed.requests.items()),
            [(c.name, c.replicas, sorted(c.requests.items())) for c in components]
            if components
            else (),
        )
        previous = self.previous
        dependencies = self.dependency_placements
        avoid = self.avoid_clusters
        text = "\x1e".join(
            [
                repr(facts),
                self.fleet.policy_json(self.policy),
                self.fleet.fingerprint,
                repr([(p.cluster, p.replicas, p.state.value) for p in previous])
                if previous
                else "()",
                repr(sorted((k, sorted(v)) for k, v in dependencies.items()))
                if dependencies
                else "()",
                self.now.isoformat(),
                repr(sorted(avoid)) if avoid else "()",
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Context:
    """Facts about one decision, derived once from its input."""

    input: SchedulingInput
    strategy: Strategy
    gvk: GroupVersionKind
    per_replica: Mapping[str, int]
    components: tuple[Component, ...]
    replicas: int | None
    """The object's replicas as interpreted (``None``: a single instance)."""
    required: int
    """How many replicas (or whole component sets) a cluster must fit to be a new
    placement; 0 means the object does not consume capacity the core can judge."""
    held: Mapping[str, int]
    """Clusters where the object is Active now → its replicas there (0 if unknown)."""
    cluster_selector: api.LabelSelector | None
    cluster_names: frozenset[str] | None
    tolerations: tuple[api.Toleration, ...]
    max_clusters: int | None
    spread: api.Spread | None
    split_by: api.SplitBy
    weights: tuple[api.WeightRule, ...]
    seed: int
    """`hash64` of the uid; `tiebreaks` mixes it with each cluster's name hash."""
    fits: Mapping[str, int]
    """Cluster → free fit for this object's shape (replicas, or whole component
    sets); clusters without a capacity record are absent. Empty when
    ``required`` is 0."""

    @property
    def fleet(self) -> Fleet:
        return self.input.fleet

    @property
    def now(self) -> datetime:
        return self.input.now

    def tiebreaks(self, views: Sequence[ClusterView]) -> list[int]:
        """Per (object, cluster) numbers that order otherwise equal clusters.

        Not Python's ``hash()`` (randomised per process) nor ``random``: the order
        must be the same in every replica and every replay, yet differ between
        objects so that ties do not all land on the same cluster. Both hashes are
        blake2b, computed once (per cluster per fleet, per object per decision);
        here they are only mixed by one multiply-xorshift, a fraction of a
        microsecond per cluster.
        """
        seed = self.seed
        mixed = [((v.name_hash ^ seed) * _GOLDEN) & _MASK64 for v in views]
        return [m ^ (m >> 29) for m in mixed]

    def capacity_of(self, name: str) -> int | None:
        """Replicas (or component sets) the cluster can hold for this object.

        The free capacity plus what the object already holds there: the snapshot's
        free capacity (or its reservations) already count the object's own replicas,
        so without adding them back a full cluster would reject its own workload.
        ``None`` when the snapshot has no record of the cluster.
        """
        fit = self.fits.get(name)
        if fit is None:
            return None
        return min(fit + self.held.get(name, 0), UNBOUNDED)


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one object runs, why, and why every other cluster was not chosen."""

    ref: ObjectRef
    decision_id: str
    strategy: Strategy
    clusters: tuple[ClusterPlacement, ...]
    """Active placements, then clusters the object is leaving (state Retiring)."""
    reason: str
    """One readable line (goes to ``flotilla.io/placement`` and Warning Events)."""
    rejections: Mapping[str, Verdict]
    schedulable: bool
    """False when the object should run somewhere and no cluster can take it."""
    pending: int = 0
    """Replicas that fit nowhere right now (split places what fits)."""
    deleted: bool = False

    @property
    def active(self) -> tuple[ClusterPlacement, ...]:
        return tuple(p for p in self.clusters if p.state is PlacementState.ACTIVE)

    def rejection_reasons(self) -> dict[str, list[str]]:
        """Rejections grouped by reason, the shape `events.PlacementDecided.rejected`
        carries: a hundred clusters turned down for one taint are one line."""
        grouped: dict[str, list[str]] = {}
        for name, verdict in self.rejections.items():
            names = grouped.get(verdict.text)
            if names is None:
                grouped[verdict.text] = [name]
            else:
                names.append(name)
        for names in grouped.values():
            names.sort()
        # Reasons in the order of their first cluster by name, as one sorted pass gave.
        return dict(sorted(grouped.items(), key=lambda item: item[1][0]))

    def to_event(self, previous: Iterable[ClusterPlacement] = ()) -> PlacementDecided:
        """The ``PlacementDecided`` payload for the object this decision is about."""
        return PlacementDecided(
            ref=self.ref,
            decision_id=self.decision_id,
            clusters=list(self.clusters),
            previous=list(previous),
            reason=self.reason,
            rejected=self.rejection_reasons(),
            deleted=self.deleted,
        )
