"""The scheduler's durable records: one placement record per object, and the fleet's
clusters as the scheduler last saw them. Both are kept in
`flotilla.common.store` stores, written by compare-and-set.

Why compare-and-set: several scheduler replicas may run at once, and any of them
may die between deciding and acknowledging. The placement record is the one thing
that says where an object runs; of two writers that read the same revision only one
wins, and the loser re-reads and decides again. The record also keeps the
``ResourceAnalyzed`` it was decided from, so a ``RescheduleRequested`` (which
names only the object) can be decided without asking the dependency detector
again, and the ``PlacementDecided`` it published, so a redelivered event
re-publishes exactly the same decision. A deleted object's record (``deleted``)
is kept for a while, so that late events about it are recognised as stale, and
then forgotten (`flotilla.scheduler.service`).

Clusters live in a second bucket (``<prefix>-scheduler-clusters``): a
``ClusterObserved`` reaches only the replica that owns the cluster key's
partition, but every replica decides against every cluster, so the owner writes
the cluster there and every replica follows the bucket.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from flotilla.common import api
from flotilla.common.events import ClusterPlacement, PlacementDecided, ResourceAnalyzed


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacementRecord(_Model):
    """Where one object runs, what it was decided from, and what was published."""

    key: str
    uid: str = ""
    generation: int = 0
    revision: int = Field(default=0, description="the hub resourceVersion last acted on")
    analyzed: ResourceAnalyzed
    decided: PlacementDecided
    """The last ``PlacementDecided`` published for this key (the KV record equals it)."""
    schedulable: bool = True
    pending: int = Field(default=0, description="replicas that fit nowhere yet")
    cause: str = Field(default="", description="id of the event that led to `decided`")
    held_back: str = Field(
        default="",
        description="why the newest decision was not applied (it did not fit); empty if it was",
    )

    @property
    def clusters(self) -> tuple[ClusterPlacement, ...]:
        return tuple(self.decided.clusters)

    @property
    def deleted(self) -> bool:
        return self.decided.deleted

    @property
    def waiting(self) -> bool:
        """Pending: something of the object is not placed and a change may help it."""
        return not self.deleted and (not self.schedulable or self.pending > 0)


class ClusterRecord(_Model):
    """A cluster as last observed, with the hub resourceVersion it was observed at."""

    name: str
    revision: int = 0
    cluster: api.Cluster | None = Field(description="None: the cluster was removed")
    previous: api.Cluster | None = Field(
        default=None, description="the cluster before this change (what the change is judged by)"
    )
    cause: str = Field(default="", description="id of the ClusterObserved that wrote this")
