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
entries, the core's filter verdicts per policy and shape) does not make the core
impure: every cached value is a function of the snapshot and its key alone.

Capacity records are typed by the protocols `CapacityRecord` and `CapacitySnapshot`,
which ``flotilla.common.capacity.ClusterCapacity`` / ``Snapshot`` satisfy, instead of
importing that module: it also holds the Redis adapter, and the pure core must not
have ``redis`` in its import graph (the import-linter contract follows imports under
``TYPE_CHECKING`` too).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    def headroom(self) -> Mapping[str, int]:
        """``available`` minus live reservations."""

    def fit_replicas(self, per_replica: dict[str, int]) -> int:
        """How many more pods of this shape fit (node-level, minus reservations)."""

    def model_dump_json(self) -> str: ...


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


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
"""2**64 / golden ratio: the usual odd multiplier of multiplicative hashing."""


def hash64(text: str) -> int:
    """A stable 64-bit hash of ``text`` (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def components_key(components: Sequence[Component]) -> str:
    """A hashable form of a component list (a cache key)."""
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
    """``code:unit:reason``, what the decision id hashes (built once per verdict)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "line", f"{self.code}:{self.unit}:{self.reason}")

    def __str__(self) -> str:
        return f"{self.unit}: {self.reason}"


Rejections = dict[str, Verdict]
"""Cluster name → why it was rejected; clusters that pass are absent."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The facts about one cluster that decisions read, taken once per snapshot."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[api.Taint, ...]
    unschedulable: bool
    ready: bool
    not_ready_reason: str
    """Why the cluster is not Ready (empty when it is)."""
    api_resources: frozenset[GroupVersionKind]
    """Empty when the cluster has not reported its API resources yet."""
    capacity: CapacityRecord | None
    placements: int
    """Objects placed on the cluster (``status.placements``); the balance score reads it."""
    name_hash: int
    """64 bits of blake2b over the name; `Context.tiebreaks` mixes in the object's uid."""

    @classmethod
    def of(cls, cluster: api.Cluster, record: CapacityRecord | None) -> ClusterView:
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
            capacity=record,
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
    whatever order the clusters arrived in. A fleet lives as long as its snapshot:
    its memos grow with the distinct policies and request shapes decided against it
    and are dropped with it when the next snapshot replaces it. It is not safe to
    share between threads (the scheduler service is one asyncio loop).
    """

    def __init__(self, clusters: Iterable[api.Cluster], snapshot: CapacitySnapshot) -> None:
        by_name: dict[str, api.Cluster] = {}
        for cluster in clusters:
            name = cluster.metadata.name
            if name in by_name:
                raise ValueError(f"cluster {name!r} appears twice in the fleet")
            by_name[name] = cluster
        self.clusters: tuple[api.Cluster, ...] = tuple(by_name[n] for n in sorted(by_name))
        self.snapshot = snapshot
        self.views: tuple[ClusterView, ...] = tuple(
            ClusterView.of(c, snapshot.get(c.metadata.name)) for c in self.clusters
        )
        self.by_name: dict[str, ClusterView] = {v.name: v for v in self.views}
        digest = hashlib.sha256()
        for cluster in self.clusters:
            digest.update(cluster.model_dump_json(by_alias=True).encode())
            record = snapshot.get(cluster.metadata.name)
            digest.update(b"\x1e" + (record.model_dump_json().encode() if record else b"-"))
        self.fingerprint = digest.hexdigest()
        self._selected: dict[str, frozenset[str]] = {}
        self._fits: dict[RequestsKey, dict[str, int]] = {}
        self._sets: dict[str, dict[str, int]] = {}
        self._placements: dict[tuple[str, int | None, PlacementState], ClusterPlacement] = {}
        self._policies: dict[int, tuple[api.PlacementPolicySpec, str]] = {}
        self.memo: dict[Hashable, Any] = {}
        """Per-snapshot results other modules compute (the core's filter verdicts)."""

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

    def policy_text(self, policy: api.PlacementPolicySpec | None) -> str | None:
        """The policy as canonical JSON, for decision ids (memoised per policy object).

        Keyed by identity and holding the policy itself, so an id is never reused
        for another policy while the entry lives; policies are not mutated once
        parsed (they come from validated hub objects).
        """
        if policy is None:
            return None
        entry = self._policies.get(id(policy))
        if entry is None:
            text = json.dumps(policy.model_dump(mode="json", by_alias=True), sort_keys=True)
            entry = (policy, text)
            self._policies[id(policy)] = entry
        return entry[1]

    def selected_by(self, selector: api.LabelSelector) -> frozenset[str]:
        """Names of the clusters ``selector`` selects (memoised per selector)."""
        key = selector.model_dump_json()
        selected = self._selected.get(key)
        if selected is None:
            selected = frozenset(v.name for v in self.views if labels.matches(selector, v.labels))
            self._selected[key] = selected
        return selected

    def fits(self, per_replica: Mapping[str, int]) -> Mapping[str, int]:
        """Cluster → how many more replicas of this shape fit (clusters with a record)."""
        key = requests_key(per_replica)
        fits = self._fits.get(key)
        if fits is None:
            shape = dict(per_replica)
            fits = {
                v.name: v.capacity.fit_replicas(shape) for v in self.views if v.capacity is not None
            }
            self._fits[key] = fits
        return fits

    def set_fits(self, components: Sequence[Component]) -> Mapping[str, int]:
        """Cluster → how many whole sets of ``components`` fit (see `whole_sets`)."""
        key = components_key(components)
        fits = self._sets.get(key)
        if fits is None:
            fits = {
                v.name: whole_sets(v.capacity, components)
                for v in self.views
                if v.capacity is not None
            }
            self._sets[key] = fits
        return fits


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
        """A hash of everything this decision reads (the input half of ``decision_id``)."""
        analyzed = self.analyzed
        metadata = analyzed.object.get("metadata") or {}
        obj = {
            "ref": analyzed.ref.key,
            "uid": metadata.get("uid"),
            "generation": metadata.get("generation"),
            "resourceVersion": metadata.get("resourceVersion"),
            "annotation": (metadata.get("annotations") or {}).get(api.STRATEGY_ANNOTATION),
            "deleted": analyzed.deleted,
            "strategy": analyzed.strategy.value,
            "replicas": analyzed.replicas,
            "requests": sorted(analyzed.requests.items()),
            "components": [
                [c.name, c.replicas, sorted(c.requests.items())] for c in analyzed.components
            ],
        }
        parts: list[Any] = [
            obj,
            self.fleet.policy_text(self.policy),
            self.fleet.fingerprint,
            [[p.cluster, p.replicas, p.state.value] for p in self.previous],
            sorted((k, sorted(v)) for k, v in self.dependency_placements.items()),
            self.now.isoformat(),
            sorted(self.avoid_clusters),
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


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
        """Rejections in the shape `events.PlacementDecided.rejections` carries."""
        return {name: [str(verdict)] for name, verdict in sorted(self.rejections.items())}

    def to_event(self, previous: Iterable[ClusterPlacement] = ()) -> PlacementDecided:
        """The ``PlacementDecided`` payload for the object this decision is about."""
        return PlacementDecided(
            ref=self.ref,
            decision_id=self.decision_id,
            clusters=list(self.clusters),
            previous=list(previous),
            reason=self.reason,
            rejections=self.rejection_reasons(),
            deleted=self.deleted,
        )
