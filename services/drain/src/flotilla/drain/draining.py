"""Cordon, drain, failover and failback as pure decisions over durable records.

The drain coordinator owns *progress*; the scheduler only decides placements. For
each object the coordinator keeps one `ObjectRecord` (its placement, what its
member copies report, the policy facts that bound a move, and the moves in
flight), for each cluster one `ClusterRecord`. `plan` takes an object's record,
the clusters and the time, and returns the record as it should be now, the
commands to send and the next moment something is due (the service sleeps until
then: a drain is acted on *at* ``evictAfter``, not when another event happens to
arrive). `cluster_conditions` derives a cluster's ``Cordoned``, ``Draining`` and
``Drained`` conditions and its ``placements`` count. Nothing here does I/O or
reads a clock.

A move, per (object, cluster):

* **drain** — the cluster's ``evictAfter`` has passed and the object is Active
  there: ask the scheduler to place it elsewhere (``avoid``). The scheduler keeps
  the old copy as Retiring (make-before-break). Once every Active copy reports
  ready, the Retiring one is released (``release``). If the new copies are not
  ready after the timeout (the policy's ``drainTimeoutSeconds``, else the
  service default), the old copy is released anyway, with a Warning, but only if
  what is ready without it still meets the object's *floor*; otherwise it stays
  and the Warning says so. If the scheduler found no other cluster, the object
  stays Active; it is reported as stuck after `Timing.stuck_after` and asked again
  every `Timing.retry`.
* **failover** — the cluster has not been Ready for longer than the policy's
  ``failover.tolerationSeconds`` (300 s when the policy says nothing), or carries
  a ``NoExecute`` taint the policy does not tolerate (or tolerates only for
  ``tolerationSeconds``): the same request, but the failed copy is released at
  once, without waiting, and the move is appended to the object's failover
  history. With ``failback: true`` the object is asked to be placed again once
  the cluster has been Ready for `Timing.settle` (a cluster that flaps restarts
  the wait); an object that ran whole there is asked to avoid where it runs now,
  so it goes back.
* **retire** — any other Retiring copy (the scheduler moved the object for its
  own reasons) is released the same way as a drained one.

The floor: a split object's ready replicas summed over clusters never drop below
``replicas - maxUnavailable`` (the Deployment's rolling-update budget, 25 % by
default, rounded down as Kubernetes does) nor below what a PodDisruptionBudget
selecting its pods demands, and never to zero; an object placed whole needs one
ready copy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flotilla.common import labels
from flotilla.common.api import (
    ClusterConditionType,
    Condition,
    ConditionStatus,
    Failover,
    FailoverRecord,
    LabelSelector,
    PlacementState,
    Taint,
    TaintEffect,
    Toleration,
)
from flotilla.common.events import ClusterPlacement, ObjectRef

JsonObject = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MoveKind(enum.StrEnum):
    DRAIN = "drain"
    FAILOVER = "failover"
    RETIRE = "retire"


class Member(_Model):
    """What a member copy last reported that a move needs."""

    ready: bool = False
    available: int | None = None


class Move(_Model):
    """One move of an object off one cluster, in progress."""

    cluster: str
    kind: MoveKind
    started: datetime
    asked: datetime
    """When the last command of this move was sent."""
    attempts: int = 1
    released: bool = False
    warned: bool = False


class ObjectRecord(_Model):
    key: str
    ref: ObjectRef
    uid: str = ""
    clusters: list[ClusterPlacement] = Field(default_factory=list)
    decision_id: str = ""
    rejections: dict[str, list[str]] = Field(default_factory=dict)
    replicas: int | None = None
    floor: int = 1
    split: bool = False
    failover: Failover = Field(default_factory=Failover)
    tolerations: list[Toleration] = Field(default_factory=list)
    timeout: float | None = None
    members: dict[str, Member] = Field(default_factory=dict)
    moves: dict[str, Move] = Field(default_factory=dict)
    failed_from: dict[str, datetime] = Field(default_factory=dict)
    history: list[FailoverRecord] = Field(default_factory=list)

    def on(self, cluster: str) -> ClusterPlacement | None:
        return next((p for p in self.clusters if p.cluster == cluster), None)

    @property
    def active(self) -> list[ClusterPlacement]:
        return [p for p in self.clusters if p.state is PlacementState.ACTIVE]


class ClusterRecord(_Model):
    name: str
    revision: int = 0
    unschedulable: bool = False
    evict_after: datetime | None = None
    ready: bool = True
    since: datetime | None = None
    """When readiness last changed (the Ready condition's lastTransitionTime)."""
    taints: list[Taint] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    """This coordinator's conditions as last seen on the hub (transition times)."""
    placements: int | None = None
    """``status.placements`` as last seen on the hub."""

    def draining(self, now: datetime) -> bool:
        return self.evict_after is not None and self.evict_after <= now


@dataclass(frozen=True)
class Timing:
    settle: float = 60.0
    """Seconds a failed cluster must stay Ready before objects fail back."""
    timeout: float = 600.0
    """Seconds a drained copy waits for its replacement when the policy says nothing."""
    stuck_after: float = 5.0
    """Seconds after a request with no move before an object is reported as stuck."""
    retry: float = 30.0
    """Seconds between repeated requests of a move that has not happened."""
    history: int = 20
    """Entries kept in ``flotilla.io/failover-history``."""


DEFAULT_TIMING = Timing()


@dataclass(frozen=True)
class Command:
    """A ``RescheduleRequested`` to send: ``avoid`` or ``release`` of `cluster`."""

    kind: str
    cluster: str
    reason: str
    attempt: int
    avoid: tuple[str, ...] = ()


@dataclass
class Plan:
    record: ObjectRecord
    commands: list[Command] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    stuck: dict[str, str] = field(default_factory=dict)
    """cluster → why the object has not moved off it."""
    next_at: datetime | None = None


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


# --- the floor --------------------------------------------------------------------------


def _scaled(value: Any, total: int, *, round_up: bool) -> int | None:
    """An int-or-percent value of `total` (Kubernetes' GetScaledValueFromIntOrPercent)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%"):
        try:
            share = float(value[:-1]) * total / 100
        except ValueError:
            return None
        return math.ceil(share) if round_up else math.floor(share)
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _matches(selector: Any, pod_labels: Mapping[str, str]) -> bool:
    """Whether a PodDisruptionBudget's selector selects these pod labels (an empty
    selector selects every pod, as in policy/v1; an unreadable one selects none)."""
    if not isinstance(selector, Mapping):
        return False
    try:
        parsed = LabelSelector.model_validate(selector)
    except ValidationError:
        return False
    return labels.matches(parsed, pod_labels)


def floor(obj: Mapping[str, Any], replicas: int | None, pdbs: Iterable[Mapping[str, Any]]) -> int:
    """The fewest ready replicas a split object may have while it moves (module
    docstring); 0 only for an object of 0 replicas."""
    if not replicas:
        return 0
    spec = _map(obj.get("spec"))
    rolling = _map(_map(spec.get("strategy")).get("rollingUpdate"))
    budget = rolling.get("maxUnavailable")
    unavailable = _scaled("25%" if budget is None else budget, replicas, round_up=False)
    least = replicas - unavailable if unavailable is not None else replicas
    pod_labels = _map(_map(_map(spec.get("template")).get("metadata")).get("labels"))
    for pdb in pdbs:
        pdb_spec = pdb.get("spec")
        if not isinstance(pdb_spec, Mapping) or not pod_labels:
            continue
        if not _matches(pdb_spec.get("selector"), {str(k): str(v) for k, v in pod_labels.items()}):
            continue
        if pdb_spec.get("minAvailable") is not None:
            wanted = _scaled(pdb_spec["minAvailable"], replicas, round_up=True)
            least = max(least, wanted or 0)
        elif pdb_spec.get("maxUnavailable") is not None:
            allowed = _scaled(pdb_spec["maxUnavailable"], replicas, round_up=True)
            least = max(least, replicas - (allowed or 0))
    return max(1, min(least, replicas))


# --- readiness --------------------------------------------------------------------------


def _usable(cluster: ClusterRecord | None) -> bool:
    return cluster is not None and cluster.ready


def available_without(
    record: ObjectRecord, clusters: Mapping[str, ClusterRecord], leaving: str | None = None
) -> int:
    """Ready replicas (split) or ready copies (whole) on Active clusters other than
    `leaving`, counting only clusters that are Ready."""
    total = 0
    for placed in record.active:
        if placed.cluster == leaving or not _usable(clusters.get(placed.cluster)):
            continue
        member = record.members.get(placed.cluster)
        if member is None:
            continue
        if record.split:
            if member.available is not None:
                total += member.available
            elif member.ready:
                total += placed.replicas or 0
        elif member.ready:
            total += 1
    return total


def new_copies_ready(record: ObjectRecord, clusters: Mapping[str, ClusterRecord]) -> bool:
    """Every Active copy is on a Ready cluster and reports ready; a split copy also
    reports as many available replicas as it is now given (a report from before the
    copy grew says ready about fewer)."""

    def copy_ready(placed: ClusterPlacement) -> bool:
        member = record.members.get(placed.cluster)
        if member is None or not member.ready or not _usable(clusters.get(placed.cluster)):
            return False
        if record.split and placed.replicas is not None and member.available is not None:
            return member.available >= placed.replicas
        return True

    return bool(record.active) and all(copy_ready(p) for p in record.active)


# --- failover ---------------------------------------------------------------------------


def failover_due(
    record: ObjectRecord, cluster: ClusterRecord | None, now: datetime
) -> datetime | None:
    """When `record` must leave `cluster` without waiting for its copy there."""
    if cluster is None:
        return None
    due: list[datetime] = []
    if not cluster.ready:
        since = cluster.since or now
        due.append(since + _seconds(record.failover.toleration_seconds))
    for taint in cluster.taints:
        if taint.effect is not TaintEffect.NO_EXECUTE:
            continue
        added = taint.time_added or cluster.since or now
        toleration = next((t for t in record.tolerations if t.tolerates(taint)), None)
        if toleration is None:
            due.append(added)
        elif toleration.toleration_seconds is not None:
            due.append(added + _seconds(toleration.toleration_seconds))
    return min(due) if due else None


# --- the plan ---------------------------------------------------------------------------


def _stuck_reason(record: ObjectRecord, cluster: str) -> str:
    others = {c: r for c, r in record.rejections.items() if c != cluster}
    if not others:
        return "no other cluster can take it"
    why = "; ".join(f"{c}: {', '.join(r)}" for c, r in sorted(others.items()))
    return f"no other cluster can take it ({why})"


def plan(
    record: ObjectRecord,
    clusters: Mapping[str, ClusterRecord],
    now: datetime,
    timing: Timing = DEFAULT_TIMING,
) -> Plan:
    """What should happen to `record` at `now` (module docstring)."""
    moves = {c: m for c, m in record.moves.items() if record.on(c) is not None}
    failed_from = dict(record.failed_from)
    history = list(record.history)
    result = Plan(record)
    due: list[datetime] = []
    retry = _seconds(timing.retry)

    for placed in record.clusters:
        name = placed.cluster
        cluster = clusters.get(name)
        move = moves.get(name)
        if placed.state is PlacementState.ACTIVE:
            failing = failover_due(record, cluster, now)
            if failing is not None and failing <= now:
                kind = MoveKind.FAILOVER
                why = f"cluster {name} failed (not Ready, or a NoExecute taint)"
            elif cluster is not None and cluster.draining(now):
                kind = MoveKind.DRAIN
                why = f"cluster {name} is drained"
            else:
                moves.pop(name, None)  # uncordoned, recovered, or chosen again
                due += [t for t in (failing,) if t is not None]
                if cluster is not None and cluster.evict_after is not None:
                    due.append(cluster.evict_after)
                continue
            if move is None or move.kind is not kind:
                moves[name] = Move(cluster=name, kind=kind, started=now, asked=now)
                result.commands.append(Command("avoid", name, why, 1))
                due.append(now + _seconds(timing.stuck_after))
                continue
            if now >= move.asked + _seconds(timing.stuck_after):
                result.stuck[name] = _stuck_reason(record, name)
            else:
                due.append(move.asked + _seconds(timing.stuck_after))
            if now >= move.asked + retry:
                moves[name] = move.model_copy(update={"asked": now, "attempts": move.attempts + 1})
                result.commands.append(Command("avoid", name, why, move.attempts + 1))
                due.append(now + retry)
            else:
                due.append(move.asked + retry)
            continue

        # Retiring: the scheduler has placed the object elsewhere.
        if move is None:
            move = Move(cluster=name, kind=MoveKind.RETIRE, started=now, asked=now)
        if move.kind is MoveKind.FAILOVER and name not in failed_from:
            to = ",".join(p.cluster for p in record.active) or None
            history.append(
                FailoverRecord(
                    from_cluster=name,
                    to_cluster=to,
                    at=now,
                    reason=f"cluster {name} failed: not Ready past the toleration",
                )
            )
            if record.failover.failback:
                failed_from[name] = now
        if move.released:
            if now >= move.asked + retry:  # the release was lost: send it again
                move = move.model_copy(update={"asked": now, "attempts": move.attempts + 1})
                result.commands.append(Command("release", name, "release again", move.attempts))
                due.append(now + retry)
            else:
                due.append(move.asked + retry)
            moves[name] = move
            continue
        reason = ""
        if move.kind is MoveKind.FAILOVER:
            reason = f"failover: the copy on {name} is not waited for"
        elif new_copies_ready(record, clusters):
            reason = "the new copies are ready"
        else:
            timeout = record.timeout if record.timeout is not None else timing.timeout
            deadline = move.started + _seconds(timeout)
            if now < deadline:
                due.append(deadline)
            else:
                left = available_without(record, clusters, name)
                if left >= record.floor:
                    reason = f"timed out after {timeout:g}s"
                    result.warnings.append(
                        (
                            "DrainTimeout",
                            f"the copy on {name} is removed after {timeout:g}s although the "
                            f"new copies are not all ready ({left} ready, at least "
                            f"{record.floor} needed)",
                        )
                    )
                elif not move.warned:
                    result.warnings.append(
                        (
                            "DrainTimeout",
                            f"the copy on {name} is kept past {timeout:g}s: without it only "
                            f"{left} would be ready, below the {record.floor} the object needs",
                        )
                    )
                    move = move.model_copy(update={"warned": True})
        if reason:
            move = move.model_copy(update={"released": True, "asked": now})
            result.commands.append(Command("release", name, reason, move.attempts))
            due.append(now + retry)
        moves[name] = move

    for name, since in list(failed_from.items()):
        cluster = clusters.get(name)
        current = record.on(name)
        if cluster is None or not record.failover.failback:
            failed_from.pop(name)
            continue
        if current is not None and current.state is PlacementState.ACTIVE:
            failed_from.pop(name)  # it is back
            continue
        if not cluster.ready or cluster.unschedulable or cluster.draining(now):
            continue
        settled = max(cluster.since or since, since) + _seconds(timing.settle)
        if now < settled:
            due.append(settled)
            continue
        failed_from.pop(name)
        avoid = () if record.split else tuple(p.cluster for p in record.active)
        result.commands.append(Command("failback", name, f"failback to {name}", 1, avoid))
        history.append(
            FailoverRecord(
                from_cluster=",".join(p.cluster for p in record.active) or name,
                to_cluster=name,
                at=now,
                reason=f"failback: {name} Ready for {timing.settle:g}s",
            )
        )

    history = history[-timing.history :]
    if moves != record.moves or failed_from != record.failed_from or history != record.history:
        result.record = record.model_copy(
            update={"moves": moves, "failed_from": failed_from, "history": history}
        )
    # else: the record itself, so that "nothing changed" is an identity check
    result.next_at = min(due) if due else None
    return result


# --- cluster conditions -----------------------------------------------------------------


def cluster_conditions(
    cluster: ClusterRecord,
    placed: Sequence[ObjectRecord],
    stuck: Mapping[str, str],
    now: datetime,
) -> tuple[list[Condition], int]:
    """``Cordoned``, ``Draining`` and ``Drained`` of `cluster` and its placement count.

    `placed`: the objects with a copy (Active or Retiring) there; `stuck`: object
    key → why it has not moved off. A condition keeps its transition time while its
    status does not change."""
    count = len(placed)
    draining = cluster.draining(now)
    cordoned = (
        (ConditionStatus.TRUE, "Cordoned", "no new placements on this cluster")
        if cluster.unschedulable
        else (ConditionStatus.FALSE, "Schedulable", "")
    )
    if draining and count:
        moving = count - len(stuck)
        parts = [f"{count} placement(s) left, {moving} moving"]
        if stuck:
            listed = sorted(stuck.items())
            shown = "; ".join(f"{key}: {why}" for key, why in listed[:10])
            more = f"; and {len(listed) - 10} more" if len(listed) > 10 else ""
            parts.append(f"cannot move: {shown}{more}")
        reason = "ObjectsCannotMove" if stuck and not moving else "Draining"
        drain_state = (ConditionStatus.TRUE, reason, ". ".join(parts))
        drained = (ConditionStatus.FALSE, "Draining", f"{count} placement(s) left")
    elif draining:
        drain_state = (ConditionStatus.FALSE, "Drained", "")
        drained = (
            ConditionStatus.TRUE,
            "Drained",
            "no Flotilla placements left: the cluster can be upgraded or removed",
        )
    else:
        drain_state = (ConditionStatus.FALSE, "NotDraining", "")
        drained = (ConditionStatus.FALSE, "NotDraining", "")
    seen = {c.type: c for c in cluster.conditions}
    conditions = []
    for type_, (status, reason, message) in (
        (ClusterConditionType.CORDONED, cordoned),
        (ClusterConditionType.DRAINING, drain_state),
        (ClusterConditionType.DRAINED, drained),
    ):
        before = seen.get(type_.value)
        since = before.last_transition_time if before and before.status is status else None
        conditions.append(
            Condition(
                type=type_.value,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=since or now,
            )
        )
    return conditions, count


def same_conditions(a: Sequence[Condition], b: Sequence[Condition]) -> bool:
    """Equal but for transition times (what makes a write needed)."""

    def key(conditions: Sequence[Condition]) -> list[tuple[str, str, str, str]]:
        return sorted((c.type, c.status.value, c.reason, c.message) for c in conditions)

    return key(a) == key(b)
