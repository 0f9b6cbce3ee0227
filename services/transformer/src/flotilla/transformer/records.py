"""The transformer's durable records (store buckets declared in `topology.BUCKETS`).

* `ObjectRecord` (bucket ``transformer-objects``, one per placed object): the last
  analysis and decision seen for it (a decision alone does not carry the object,
  and an analysis alone does not say where it runs; each arrives by itself and
  the works are rendered from both), and the works it holds: its own work per
  cluster and the dependencies it needs there. What it held is what a later
  render removes when it is no longer wanted; and, per cluster, the content of
  the own work last published there (`ObjectRecord.published`), so a decision
  that changes nothing on a cluster but its id sends that cluster nothing.
* `DependentsRecord` (bucket ``transformer-dependents``, one per ``as-needed``
  dependency): which placed objects need it on which cluster. Several objects
  share a dependency and may be handled by different replicas at once, so it is
  written by compare-and-set; the dependency's work on a cluster is published
  when its content there changes (its first dependent there arrives, or what it
  renders to differs from what was last published) and removed when its last
  dependent there lets go.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from flotilla.common.events import ObjectRef, PlacementDecided, ResourceAnalyzed


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class ObjectRecord(_Record):
    ref: ObjectRef
    uid: str = ""
    analyzed: ResourceAnalyzed | None = None
    analyzed_revision: int = 0
    """The hub revision the analysis was made from (a lower one is stale)."""
    decision: PlacementDecided | None = None
    works: dict[str, list[ObjectRef]] = Field(default_factory=dict)
    """Cluster → the dependencies held there, for every cluster the object's own
    work was sent to (and not removed since)."""
    published: dict[str, str] = Field(default_factory=dict)
    """Cluster → `flotilla.transformer.service.own_digest` of the own work last
    published there (its manifest without the decision annotation), for
    clusters in `works` only; recorded after the publish, with the rest of the record."""

    @property
    def renderable(self) -> bool:
        return self.analyzed is not None and self.decision is not None


class DependentsRecord(_Record):
    ref: ObjectRef
    clusters: dict[str, list[ObjectRef]] = Field(default_factory=dict)
    """Cluster → the placed objects that need the dependency there."""
    published: dict[str, str] = Field(default_factory=dict)
    """Cluster → the digest of the dependency's content last published there (its
    manifest without the decision annotation), for clusters in `clusters` only;
    recorded after the publish, so a crash before it publishes again."""
