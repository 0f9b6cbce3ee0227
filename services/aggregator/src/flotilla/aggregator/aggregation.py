"""Folding member statuses into the one status a user reads on the hub.

Pure: takes the object's placement, the latest report of each member copy, which
clusters are not Ready and the interpreter's ``statusAggregation`` rules, and
returns the hub status plus the two annotations (`Aggregate`). The service
(`flotilla.aggregator.service`) does the I/O around it.

The rules, in order:

* **Who counts.** Only members of clusters the object is placed on (Active or
  Retiring: a Retiring copy still serves until the drain coordinator releases it)
  that exist. A member whose cluster is not Ready is *stale*: it is listed as such
  in ``flotilla.io/cluster-status`` and left out of every rule, so the hub never
  shows a dead cluster's last known status as current.
* **Base.** An object whose type is placed whole (strategy ``any``: a Pod, a Job,
  an unknown type) takes its single member's status as it is, the Active copy
  first; so a Job completes when the placed copy completes. Other types start
  from an empty status.
* **Rules.** Each ``(path, op)`` rule reads the path on every counted member and
  writes the folded value at the same path: ``sum`` (absent counts as 0; no
  member has it → left out), ``min``/``max``, ``all``/``any`` (truthiness of the
  values present), ``first`` (Active copies first, then by cluster name).
* **Conditions** (types that are not placed whole): a hub condition is True only
  where it is True on every Active cluster; False if it is False on one; else
  Unknown (a cluster without a report, stale, or without the condition). The
  message names the clusters where it is not True.
* **observedGeneration** is the hub generation only when every Active member has
  applied the work rendered from it (``hub_generation``) and observed its own
  generation; until then the previous value stays.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flotilla.common import paths
from flotilla.common.api import (
    AggregationOp,
    PlacementAnnotation,
    PlacementClusterEntry,
    PlacementState,
    compact_json,
)
from flotilla.common.events import ClusterPlacement, MemberStatusObserved, PlacementDecided
from flotilla.common.paths import CompiledPath, PathError

JsonObject = dict[str, Any]
Rules = Sequence[tuple[CompiledPath, AggregationOp]]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemberReport(_Model):
    """The latest report of one member copy (a `MemberStatusObserved` without its ref)."""

    cluster: str
    exists: bool = True
    status: JsonObject = Field(default_factory=dict)
    observed_generation: int | None = None
    generation: int | None = None
    hub_generation: int | None = None
    ready: bool | None = None
    decision_id: str = ""
    observed_at: datetime | None = None
    """When the syncer sent it (the event's ``produced_at``): orders two reports of
    one copy when the bus hands them over out of order (a redelivery after a newer
    report, a partition moving between replicas)."""

    @classmethod
    def of(
        cls, observed: MemberStatusObserved, observed_at: datetime | None = None
    ) -> MemberReport:
        return cls(
            cluster=observed.cluster,
            exists=observed.exists,
            status=observed.status,
            observed_generation=observed.observed_generation,
            generation=observed.generation,
            hub_generation=observed.hub_generation,
            ready=observed.ready,
            decision_id=observed.decision_id,
            observed_at=observed_at,
        )

    @property
    def caught_up(self) -> bool:
        """The member controller has observed the member object's generation."""
        return (
            self.observed_generation is None
            or self.generation is None
            or self.observed_generation >= self.generation
        )


class ObjectReports(_Model):
    """What the aggregator keeps per hub object (durable, so a restart forgets nothing)."""

    key: str
    placement: PlacementDecided | None = None
    members: dict[str, MemberReport] = Field(default_factory=dict)

    def with_report(self, report: MemberReport) -> ObjectReports:
        """`report` as its cluster's latest, unless the one kept was sent after it."""
        kept = self.members.get(report.cluster)
        if (
            kept is not None
            and kept.observed_at is not None
            and report.observed_at is not None
            and report.observed_at < kept.observed_at
        ):
            return self
        return self.model_copy(update={"members": {**self.members, report.cluster: report}})

    def with_placement(self, placement: PlacementDecided) -> ObjectReports:
        """The new placement; reports of clusters it no longer names are dropped."""
        placed = {p.cluster for p in placement.clusters}
        members = {c: r for c, r in self.members.items() if c in placed}
        return self.model_copy(update={"placement": placement, "members": members})


class Aggregate(_Model):
    """What the hub object should show."""

    status: JsonObject
    placement: str
    """The ``flotilla.io/placement`` annotation value."""
    cluster_status: str
    """The ``flotilla.io/cluster-status`` annotation value."""


def _order(placement: Sequence[ClusterPlacement]) -> list[ClusterPlacement]:
    return sorted(placement, key=lambda p: (p.state is not PlacementState.ACTIVE, p.cluster))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fold_values(op: AggregationOp, values: Sequence[Any]) -> Any:
    """One rule over the values the members have (None: leave the field out)."""
    if op is AggregationOp.SUM:
        numbers = [v for v in values if _is_number(v)]
        return sum(numbers) if numbers else None
    if op is AggregationOp.FIRST:
        return values[0] if values else None
    if op is AggregationOp.ALL:
        return all(bool(v) for v in values) if values else None
    if op is AggregationOp.ANY:
        return any(bool(v) for v in values) if values else None
    comparable = [v for v in values if _is_number(v)] or [v for v in values if isinstance(v, str)]
    if not comparable:
        return None
    return min(comparable) if op is AggregationOp.MIN else max(comparable)


def _condition_map(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = status.get("conditions")
    if not isinstance(found, list):
        return {}
    return {
        str(c["type"]): c
        for c in found
        if isinstance(c, Mapping) and isinstance(c.get("type"), str)
    }


def merge_conditions(active: Sequence[str], fresh: Mapping[str, MemberReport]) -> list[JsonObject]:
    """Hub conditions: True only where True on every Active cluster (module docstring)."""
    per_cluster = {c: _condition_map(fresh[c].status) for c in active if c in fresh}
    types = sorted({t for conditions in per_cluster.values() for t in conditions})
    merged: list[JsonObject] = []
    for type_ in types:
        not_true: list[str] = []
        any_false = False
        reasons: list[str] = []
        times: list[str] = []
        for cluster in active:
            condition = per_cluster.get(cluster, {}).get(type_)
            status = condition.get("status") if condition else None
            if condition and isinstance(condition.get("lastTransitionTime"), str):
                times.append(condition["lastTransitionTime"])
            if status == "True":
                if condition and condition.get("reason") and not reasons:
                    reasons.append(str(condition["reason"]))
                continue
            any_false = any_false or status == "False"
            why = (
                "not reported"
                if cluster not in fresh
                else "absent"
                if condition is None
                else f"{status}: {condition.get('reason') or ''} {condition.get('message') or ''}"
            )
            not_true.append(f"{cluster} ({why.strip()})")
        if not not_true:
            status, reason, message = "True", (reasons[0] if reasons else "AllClusters"), ""
        else:
            status = "False" if any_false else "Unknown"
            reason = "NotTrueOnEveryCluster"
            message = "not True on " + ", ".join(not_true)
        entry: JsonObject = {"type": type_, "status": status, "reason": reason, "message": message}
        if times:
            entry["lastTransitionTime"] = max(times)
        merged.append(entry)
    return merged


def _leaf(path: CompiledPath) -> str:
    text = path.text
    return text[len(".status.") :] if text.startswith(".status.") else text


def fold(
    placement: PlacementDecided,
    members: Mapping[str, MemberReport],
    rules: Rules,
    *,
    whole: bool,
    not_ready: Collection[str],
    hub_generation: int | None,
    previous_observed: int | None = None,
) -> Aggregate:
    """The hub status and annotations for one object (module docstring).

    `whole`: the object's type is placed whole (strategy ``any``), so it takes its
    single member's status as the base. `not_ready`: clusters whose Ready
    condition is not True (their members are stale)."""
    ordered = _order(placement.clusters)
    fresh: dict[str, MemberReport] = {}
    for placed in ordered:
        report = members.get(placed.cluster)
        if report is not None and report.exists and placed.cluster not in not_ready:
            fresh[placed.cluster] = report
    active = [p.cluster for p in ordered if p.state is PlacementState.ACTIVE]

    status: JsonObject = {}
    if whole and fresh:
        status = copy.deepcopy(next(iter(fresh.values())).status)
    obj: JsonObject = {"status": status}
    for path, op in rules:
        values = [v for r in fresh.values() for v in paths.get_all({"status": r.status}, path)]
        value = fold_values(op, values)
        if value is None:
            continue
        try:
            paths.set_value(obj, path, value)
        except PathError:
            continue  # a path that selects into lists cannot be written whole; skip it
    status = obj["status"] if isinstance(obj.get("status"), dict) else {}
    if not whole:
        conditions = merge_conditions(active, fresh)
        if conditions:
            status["conditions"] = conditions
    status.pop("observedGeneration", None)
    observed = all(
        c in fresh and fresh[c].hub_generation == hub_generation and fresh[c].caught_up
        for c in active
    )
    if hub_generation is not None and active and observed:
        status["observedGeneration"] = hub_generation
    elif previous_observed is not None:
        status["observedGeneration"] = previous_observed
    return Aggregate(
        status=status,
        placement=placement_annotation(placement),
        cluster_status=cluster_status(ordered, members, rules, not_ready),
    )


def placement_annotation(placement: PlacementDecided) -> str:
    return PlacementAnnotation(
        clusters=[
            PlacementClusterEntry(cluster=p.cluster, replicas=p.replicas, state=p.state)
            for p in placement.clusters
        ],
        decision=placement.decision_id,
        reason=placement.reason,
    ).to_annotation()


def cluster_status(
    ordered: Sequence[ClusterPlacement],
    members: Mapping[str, MemberReport],
    rules: Rules,
    not_ready: Collection[str],
) -> str:
    """The per-cluster summary: state, staleness, readiness and each rule's own value."""
    entries: list[JsonObject] = []
    for placed in ordered:
        entry: JsonObject = {"cluster": placed.cluster, "state": placed.state.value}
        report = members.get(placed.cluster)
        stale = placed.cluster in not_ready
        entry["stale"] = stale
        if report is None:
            entry["reported"] = False
        else:
            entry["exists"] = report.exists
            entry["ready"] = bool(report.ready) and report.exists and not stale
            if report.hub_generation is not None:
                entry["hubGeneration"] = report.hub_generation
            summary: JsonObject = {}
            for path, _ in rules:
                values = paths.get_all({"status": report.status}, path)
                if len(values) == 1:
                    summary[_leaf(path)] = values[0]
            if summary:
                entry["status"] = summary
        entries.append(entry)
    return compact_json(entries)


class _Unsayable(Exception):
    """A null in an object: a merge patch would read it as "remove the field"."""


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        for inner in value.values():
            if inner is None:
                raise _Unsayable
            _without_nulls(inner)
    return value


def _diff(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> JsonObject:
    patch: JsonObject = {key: None for key in current if key not in wanted}
    for key, value in wanted.items():
        if value is None:
            raise _Unsayable
        before = current.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = _diff(before, value)
            if inner:
                patch[key] = inner
        elif key not in current or before != value:
            patch[key] = _without_nulls(value)
    return patch


def merge_patch_for(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> JsonObject | None:
    """The JSON merge patch (RFC 7386) that turns `current` into `wanted`, so that a
    status write sends what changed rather than the whole object; None when a merge
    patch cannot say it (`wanted` holds a null in an object, which it would read as
    "remove the field")."""
    try:
        return _diff(current, wanted)
    except _Unsayable:
        return None
