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
* **Adapters** behind the `CapacityCache` protocol: `RedisCapacityCache` (the real
  one, on ``redis.asyncio``) and `FakeCapacityCache` (in memory, same semantics,
  for unit tests of other services).

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

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

    `reserved` is the sum of the live reservations (pod slots included) when the
    record comes out of a snapshot; whatever a writer puts there is ignored, since
    reservations live beside the record, not in it.
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


class Snapshot(_Model):
    """Every cluster's capacity as read in one round trip at `taken_at`."""

    clusters: dict[str, ClusterCapacity]
    taken_at: float

    def get(self, cluster: str) -> ClusterCapacity | None:
        return self.clusters.get(cluster)


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
