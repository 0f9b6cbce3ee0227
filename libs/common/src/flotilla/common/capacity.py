"""The cluster capacity cache: what is free on every member cluster, and who has claimed it.

The syncer writes one `ClusterCapacity` record per member cluster (from its node and
pod watches); the scheduler takes one `Snapshot` of all of them per decision and,
before publishing a placement, `reserve`s the capacity it is about to use so that
two scheduler replicas deciding at the same moment cannot both spend the same free
CPU. Reservations expire on their own (the syncer's next record will include the
pods once they are bound), so a scheduler that dies mid-decision leaks nothing.

The module has two halves:

* **Pure models** (`NodeCapacity`, `Reservation`, `ClusterCapacity`, `Snapshot`,
  `fit_replicas`) — no I/O; the scheduler core imports only these.
* **The `CapacityCache` protocol** and `FakeCapacityCache` (in memory, same
  semantics, for unit tests of other services). The real adapter,
  `flotilla.common.rediscapacity.RedisCapacityCache`, lives in its own module so
  that importing these models never imports Redis.

Units: every amount is an integer — CPU in millicores, everything else in base
units (see `flotilla.common.quantity.to_units`). ``"pods"`` counts pods: every
replica uses one pod slot unless its shape says otherwise, so a node or cluster
must report ``pods`` to host anything (as every kubelet does).

Fit rule (shared by `ClusterCapacity.fit_replicas`, the Redis reserve script and
the fake): replicas fit node by node — ``sum over nodes of min_r floor(free[r] /
per_replica[r])``, so fragmentation is respected — then that count is capped by
the cluster level ``(available - reserved) / per_replica`` so live reservations
count. Reservations are not attributed to nodes (the scheduler does not pick
nodes; the member's kube-scheduler does), so only the cluster-level cap sees them.
A record without a node breakdown is judged at the cluster level alone.

The Redis side (`flotilla.common.rediscapacity`) is a few small Lua scripts rather
than a library: nothing maintained offers an atomic "check several resource amounts
against a record minus live, expiring claims, then claim" on Redis. It keeps running
totals of the live reservations per cluster, so `reserve` is linear in the cluster's
nodes and `snapshot` in the clusters, however many reservations are live; `snapshot`
derives key names inside the script, so it needs a standalone or Sentinel Redis, not
Redis Cluster; amounts must stay below 2**53 (Lua numbers are doubles).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from flotilla.common.errors import Unavailable
from flotilla.common.events import Requests

PODS = "pods"
"""The pod-slot resource; every replica uses one unless its shape says otherwise."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeCapacity(_Model):
    """One member node: what it offers and what is still free on it."""

    name: str
    allocatable: Requests
    free: Requests = Field(description="allocatable minus requests of the pods bound here")


class Reservation(_Model):
    """Capacity a scheduler claimed on a cluster until `expires_at` (epoch seconds)."""

    id: str
    cluster: str
    requests: Requests = Field(description="per replica")
    replicas: int = Field(ge=0)
    expires_at: float

    @property
    def total(self) -> Requests:
        """What the whole reservation holds, pod slots included."""
        return scale(pod_shape(self.requests), self.replicas)


class ClusterCapacity(_Model):
    """The capacity record of one member cluster at `observed_at` (epoch seconds).

    `reserved` is the sum of the live reservations (pod slots included; resources
    summing to zero left out) when the record comes out of a snapshot; whatever a
    writer puts there is ignored, since reservations live beside the record.
    """

    cluster: str
    allocatable: Requests
    available: Requests
    nodes: list[NodeCapacity] = Field(default_factory=list)
    reserved: Requests = Field(default_factory=dict)
    observed_at: float

    @property
    def headroom(self) -> Requests:
        """Cluster-level room left once live reservations are taken off `available`."""
        return {r: amount - self.reserved.get(r, 0) for r, amount in self.available.items()}

    def fit_replicas(self, per_replica: Requests) -> int:
        """How many more pods of this shape fit here (see the module docstring)."""
        return fit_replicas(
            per_replica,
            headroom=self.headroom,
            node_free=[node.free for node in self.nodes],
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """One reservation a decision asks for: `replicas` pods of `per_replica` on
    `cluster`, held under `reservation_id` (claiming an id again replaces it)."""

    cluster: str
    reservation_id: str
    per_replica: Requests
    replicas: int


class Snapshot(_Model):
    """Every cluster's capacity as read in one round trip at `taken_at`."""

    clusters: dict[str, ClusterCapacity]
    taken_at: float

    def get(self, cluster: str) -> ClusterCapacity | None:
        return self.clusters.get(cluster)


def uniform(
    cluster: str, node: Mapping[str, int], count: int, *, observed_at: float
) -> ClusterCapacity:
    """The record of a cluster of `count` identical, empty nodes (``<cluster>-n<i>``):
    what a fresh simulated member reports."""
    nodes = [
        NodeCapacity(name=f"{cluster}-n{i}", allocatable=dict(node), free=dict(node))
        for i in range(count)
    ]
    total = add(*(n.free for n in nodes))
    return ClusterCapacity(
        cluster=cluster, allocatable=total, available=total, nodes=nodes, observed_at=observed_at
    )


def pod_shape(per_replica: Mapping[str, int]) -> Requests:
    """The shape one replica really uses: its requests plus one pod slot."""
    for resource, amount in per_replica.items():
        if amount < 0:
            raise ValueError(f"negative request {resource}={amount}")
    shape = dict(per_replica)
    shape.setdefault(PODS, 1)
    return shape


def scale(requests: Mapping[str, int], factor: int) -> Requests:
    return {resource: amount * factor for resource, amount in requests.items()}


def add(*many: Mapping[str, int]) -> Requests:
    total: Requests = {}
    for requests in many:
        for resource, amount in requests.items():
            total[resource] = total.get(resource, 0) + amount
    return total


UNBOUNDED = 2**31 - 1
"""The fit of a shape that requests nothing, not even a pod slot (an explicit pods=0)."""


def _count(free: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """How many whole `shape`s fit into `free`; resources missing from `free` are 0."""
    counts = [max(free.get(r, 0), 0) // amount for r, amount in shape.items() if amount > 0]
    return min(counts, default=UNBOUNDED)


def fit_replicas(
    per_replica: Mapping[str, int],
    *,
    headroom: Mapping[str, int],
    node_free: Iterable[Mapping[str, int]] = (),
) -> int:
    """The fit rule on plain mappings; `ClusterCapacity.fit_replicas` and the fake use it."""
    shape = pod_shape(per_replica)
    cluster_level = _count(headroom, shape)
    nodes = list(node_free)
    if not nodes:
        return cluster_level
    return min(sum(_count(free, shape) for free in nodes), cluster_level)


# --------------------------------------------------------------------------- adapters


class CapacityCache(Protocol):
    """Where capacity records and reservations live; the scheduler and syncer see only this."""

    async def put(self, record: ClusterCapacity) -> None:
        """Store a cluster's record (its `reserved` is ignored); reservations are kept."""

    async def remove(self, cluster: str) -> None:
        """Forget a cluster: its record and every reservation on it."""

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        """Every (or the named) cluster's record with its live reservations summed in."""

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        """Atomically claim room for `replicas` pods of `per_replica` for `ttl` seconds.

        False (and nothing changed) when they do not fit or the cluster is unknown.
        Reserving an id that is already held replaces it, so retries are harmless.
        """

    async def claim(
        self,
        claims: Sequence[Claim],
        ttl: float,
        *,
        releases: Sequence[tuple[str, str]] = (),
        check: bool = True,
    ) -> set[str]:
        """One decision's reservations at once, all or nothing: every claim (several
        on one cluster count together) and every ``(cluster, id)`` release.

        Returns the clusters that refused (unknown, or the claims do not fit), and
        then nothing changed; an empty set means everything was applied. With
        ``check=False`` nothing is refused (putting reservations back as they were).
        """

    async def release(self, cluster: str, reservation_id: str) -> None:
        """Drop one reservation; releasing an unknown id is not an error."""

    async def reservations(self, cluster: str) -> list[Reservation]:
        """The live reservations on one cluster, oldest expiry first."""


class FakeCapacityCache:
    """In-memory `CapacityCache` with the Redis one's semantics, for other services' tests.

    `clock` stands in for Redis `TIME` so a test can expire reservations by moving it;
    set `unavailable = True` to make every call raise `Unavailable`, as a dead Redis does.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.unavailable = False
        self._records: dict[str, ClusterCapacity] = {}
        self._reservations: dict[str, dict[str, Reservation]] = {}

    def _check(self) -> None:
        if self.unavailable:
            raise Unavailable("capacity cache unavailable (FakeCapacityCache.unavailable)")

    def _live(self, cluster: str, now: float) -> dict[str, Reservation]:
        held = self._reservations.setdefault(cluster, {})
        for rid in [rid for rid, r in held.items() if r.expires_at <= now]:
            del held[rid]
        return held

    async def put(self, record: ClusterCapacity) -> None:
        self._check()
        self._records[record.cluster] = record.model_copy(update={"reserved": {}})

    async def remove(self, cluster: str) -> None:
        self._check()
        self._records.pop(cluster, None)
        self._reservations.pop(cluster, None)

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        self._check()
        now = self.clock()
        names = list(self._records) if clusters is None else list(clusters)
        out: dict[str, ClusterCapacity] = {}
        for name in names:
            record = self._records.get(name)
            if record is not None:
                held = self._live(name, now).values()
                reserved = {r: n for r, n in add(*(r.total for r in held)).items() if n}
                out[name] = record.model_copy(update={"reserved": reserved})
        return Snapshot(clusters=out, taken_at=now)

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        return not await self.claim([Claim(cluster, reservation_id, per_replica, replicas)], ttl)

    async def claim(
        self,
        claims: Sequence[Claim],
        ttl: float,
        *,
        releases: Sequence[tuple[str, str]] = (),
        check: bool = True,
    ) -> set[str]:
        self._check()
        for one in claims:
            validate_reservation(one.per_replica, one.replicas, ttl)
        now = self.clock()
        # Judged on copies, applied only when nothing refused.
        trial = {one.cluster: dict(self._live(one.cluster, now)) for one in claims}
        refused: set[str] = set()
        for one in claims:
            held = trial[one.cluster]
            record = self._records.get(one.cluster)
            if record is None:
                if check:
                    refused.add(one.cluster)
            elif check and one.replicas > 0:
                others = add(*(r.total for rid, r in held.items() if rid != one.reservation_id))
                headroom = {r: n - others.get(r, 0) for r, n in record.available.items()}
                fit = fit_replicas(
                    one.per_replica, headroom=headroom, node_free=[n.free for n in record.nodes]
                )
                if fit < one.replicas:
                    refused.add(one.cluster)
            held[one.reservation_id] = Reservation(
                id=one.reservation_id,
                cluster=one.cluster,
                requests=dict(one.per_replica),
                replicas=one.replicas,
                expires_at=now + ttl,
            )
        if refused:
            return refused
        self._reservations.update(trial)
        for cluster, reservation_id in releases:
            self._reservations.get(cluster, {}).pop(reservation_id, None)
        return set()

    async def release(self, cluster: str, reservation_id: str) -> None:
        self._check()
        self._reservations.get(cluster, {}).pop(reservation_id, None)

    async def reservations(self, cluster: str) -> list[Reservation]:
        self._check()
        return sorted(self._live(cluster, self.clock()).values(), key=lambda r: r.expires_at)


def validate_reservation(per_replica: Mapping[str, int], replicas: int, ttl: float) -> None:
    pod_shape(per_replica)
    if replicas < 0:
        raise ValueError(f"replicas must not be negative, got {replicas}")
    if not (ttl > 0 and math.isfinite(ttl)):
        raise ValueError(f"ttl must be positive and finite, got {ttl}")


__all__ = [
    "PODS",
    "UNBOUNDED",
    "CapacityCache",
    "Claim",
    "ClusterCapacity",
    "FakeCapacityCache",
    "NodeCapacity",
    "Requests",
    "Reservation",
    "Snapshot",
    "add",
    "fit_replicas",
    "pod_shape",
    "scale",
]
