"""Event replay: run the scheduler's pure core again over recorded input and say,
per decision, whether it decides what was recorded.

The stream is read from its first event, because a decision depends on the state
before it: the clusters as the last ``ClusterObserved`` before it showed them, the
object as its last ``ResourceAnalyzed`` described it (with the policy that was in
force), whether a ``RescheduleRequested`` asked it to leave clusters, and where its
dependencies were placed. The recorded ``PlacementDecided`` carries the placement
it started from (``previous``). Each decision inside the window is then computed
again with `flotilla.scheduler.core.schedule` — no side effects: nothing is
published, reserved or written — and compared with the recorded one.

Capacity: the scheduler decides against a capacity snapshot that is not in the
stream. Replay rebuilds it from the clusters' capacity reports as Redis holds them
now (the base) and the reservations the recorded decisions made up to that point
(every object's Active replicas times its per-replica requests, as the scheduler
reserves them). While members report the same figures this is the snapshot the
scheduler saw; a decision made while a member's reported capacity was different
can differ for that reason alone, and the report says which clusters' capacity the
decision depended on.

"What if": `overrides` replaces the spec of the named policies in the replayed
input (``--policy FILE``), so the diff shows exactly the decisions a policy change
would have changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flotilla.cli.stream import Window, matches_key, trace_id
from flotilla.common import api, capacity, events
from flotilla.common.api import PlacementState
from flotilla.common.dispatch import ReplayedEvent
from flotilla.common.events import (
    ClusterObserved,
    ClusterPlacement,
    PlacementDecided,
    RescheduleRequested,
    ResourceAnalyzed,
)
from flotilla.scheduler import core
from flotilla.scheduler.model import Fleet, SchedulingInput

INPUT_TYPES = (
    "ClusterObserved",
    "ResourceAnalyzed",
    "RescheduleRequested",
    "PlacementDecided",
)
"""What the scheduler's decisions are replayed from (its output included, as the
record to compare with and the state later decisions start from)."""

PolicyId = tuple[str, str | None, str]
"""(kind, namespace, name) of a placement policy."""


def policy_id(obj: Mapping[str, Any]) -> PolicyId:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), meta.get("namespace") or None, str(meta.get("name")))


def policy_overrides(objects: list[dict[str, Any]]) -> dict[PolicyId, api.PlacementPolicySpec]:
    """The placement policies among `objects` (``--policy``; other objects in the
    same file are left out) as the specs replay substitutes."""
    found: dict[PolicyId, api.PlacementPolicySpec] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind == "PlacementPolicy":
            spec = api.parse_as(api.PlacementPolicy, obj).spec
            obj = {**obj, "metadata": {"namespace": "default", **obj.get("metadata", {})}}
        elif kind == "ClusterPlacementPolicy":
            spec = api.parse_as(api.ClusterPlacementPolicy, obj).spec
        else:
            continue
        found[policy_id(obj)] = spec
    if not found:
        raise ValueError("no PlacementPolicy or ClusterPlacementPolicy in it")
    return found


def placement_text(placements: list[ClusterPlacement]) -> str:
    parts = [
        f"{p.cluster}={'-' if p.replicas is None else p.replicas}"
        + ("" if p.state is PlacementState.ACTIVE else f"({p.state})")
        for p in sorted(placements, key=lambda p: (p.state != PlacementState.ACTIVE, p.cluster))
    ]
    return ", ".join(parts) or "nowhere"


@dataclass(frozen=True)
class Outcome:
    """One recorded decision and what the core decides from the same input."""

    sequence: int
    key: str
    recorded: PlacementDecided
    replayed: PlacementDecided | None
    trace_id: str = ""
    problem: str = ""
    """Why the decision could not be replayed (its input is not in the stream)."""

    @property
    def same(self) -> bool:
        replayed = self.replayed
        if replayed is None:
            return False
        recorded = self.recorded
        return (
            frozenset(recorded.clusters) == frozenset(replayed.clusters)
            and recorded.deleted == replayed.deleted
            and recorded.rejected_clusters() == replayed.rejected_clusters()
        )

    def differences(self) -> list[str]:
        if self.replayed is None:
            return [f"not replayed: {self.problem}"]
        lines = []
        recorded, replayed = self.recorded, self.replayed
        if frozenset(recorded.clusters) != frozenset(replayed.clusters):
            lines.append(f"- placement: {placement_text(recorded.clusters)}")
            lines.append(f"+ placement: {placement_text(replayed.clusters)}")
        if recorded.deleted != replayed.deleted:
            lines.append(f"- deleted: {recorded.deleted}")
            lines.append(f"+ deleted: {replayed.deleted}")
        if recorded.rejected_clusters() != replayed.rejected_clusters():
            lines.append(f"- rejected: {', '.join(recorded.rejected_clusters()) or 'none'}")
            lines.append(f"+ rejected: {', '.join(replayed.rejected_clusters()) or 'none'}")
        if lines and recorded.reason != replayed.reason:
            lines.append(f"- reason: {recorded.reason}")
            lines.append(f"+ reason: {replayed.reason}")
        return lines


@dataclass
class _State:
    """What the scheduler knew at a point of the stream."""

    clusters: dict[str, api.Cluster] = field(default_factory=dict)
    analyzed: dict[str, ResourceAnalyzed] = field(default_factory=dict)
    avoid: dict[str, frozenset[str]] = field(default_factory=dict)
    decided: dict[str, PlacementDecided] = field(default_factory=dict)

    def reserved(self) -> dict[str, capacity.Requests]:
        """Per cluster, what the recorded placements hold (the scheduler's reservations)."""
        held: dict[str, capacity.Requests] = {}
        for key, decided in self.decided.items():
            analyzed = self.analyzed.get(key)
            if analyzed is None or decided.deleted:
                continue
            for placement in decided.clusters:
                if placement.state is not PlacementState.ACTIVE:
                    continue
                shapes = (
                    [(c.requests, c.replicas) for c in analyzed.components if c.replicas > 0]
                    if analyzed.components
                    else [(analyzed.requests, placement.replicas or 0)]
                )
                for requests, count in shapes:
                    if count <= 0:
                        continue
                    use = capacity.scale(capacity.pod_shape(requests), count)
                    held[placement.cluster] = capacity.add(held.get(placement.cluster, {}), use)
        return held

    def snapshot(self, base: capacity.Snapshot) -> capacity.Snapshot:
        reserved = self.reserved()
        return capacity.Snapshot(
            clusters={
                name: record.model_copy(update={"reserved": reserved.get(name, {})})
                for name, record in base.clusters.items()
            },
            taken_at=base.taken_at,
        )

    def dependency_placements(self, analyzed: ResourceAnalyzed) -> dict[str, list[str]]:
        pinned: dict[str, list[str]] = {}
        for dependency in analyzed.dependencies:
            key = events.ObjectRef(
                api_version=dependency.api_version,
                kind=dependency.kind,
                name=dependency.name,
                namespace=dependency.namespace,
            ).key
            decided, its = self.decided.get(key), self.analyzed.get(key)
            if decided is None or decided.deleted or its is None:
                continue
            if its.strategy is api.Strategy.AS_NEEDED:
                pinned[key] = []
            else:
                pinned[key] = sorted(
                    p.cluster for p in decided.clusters if p.state is PlacementState.ACTIVE
                )
        return pinned


def _override(
    analyzed: ResourceAnalyzed, overrides: Mapping[PolicyId, api.PlacementPolicySpec]
) -> ResourceAnalyzed:
    ref = analyzed.policy
    if ref is None:
        return analyzed
    spec = overrides.get((ref.kind, ref.namespace, ref.name))
    return analyzed if spec is None else analyzed.model_copy(update={"policy_spec": spec})


async def scheduler(
    recorded: AsyncIterator[ReplayedEvent],
    window: Window,
    base: capacity.Snapshot,
    *,
    key: str | None = None,
    overrides: Mapping[PolicyId, api.PlacementPolicySpec] | None = None,
) -> list[Outcome]:
    """Replay every ``PlacementDecided`` of `window` (of object `key`) through the core.

    `recorded` is the stream from its first event (see the module docstring)."""
    state = _State()
    outcomes: list[Outcome] = []
    for_policy = overrides or {}
    async for event in recorded:
        envelope = event.envelope
        payload = envelope.payload
        if isinstance(payload, ClusterObserved):
            if payload.deleted:
                state.clusters.pop(payload.cluster, None)
            else:
                try:
                    state.clusters[payload.cluster] = api.parse_as(api.Cluster, payload.object)
                except api.InvalidObjectError:
                    state.clusters.pop(payload.cluster, None)
        elif isinstance(payload, ResourceAnalyzed):
            state.analyzed[payload.ref.key] = _override(payload, for_policy)
            state.avoid.pop(payload.ref.key, None)
        elif isinstance(payload, RescheduleRequested):
            state.avoid[payload.ref.key] = frozenset(payload.avoid_clusters)
        elif isinstance(payload, PlacementDecided):
            object_key = payload.ref.key
            if window.covers(event) and (key is None or matches_key(envelope, key)):
                outcomes.append(_decide_again(event, payload, state, base))
            state.decided[object_key] = payload
            state.avoid.pop(object_key, None)
    return outcomes


def _decide_again(
    event: ReplayedEvent, recorded: PlacementDecided, state: _State, base: capacity.Snapshot
) -> Outcome:
    object_key = recorded.ref.key
    analyzed = state.analyzed.get(object_key)
    if analyzed is None:
        return Outcome(
            event.sequence,
            object_key,
            recorded,
            None,
            trace_id(event.envelope.traceparent),
            problem="its ResourceAnalyzed is not in the stream",
        )
    inp = SchedulingInput(
        analyzed=analyzed,
        policy=analyzed.policy_spec,
        fleet=Fleet(state.clusters.values(), state.snapshot(base)),
        now=event.envelope.produced_at,
        previous=tuple(recorded.previous),
        dependency_placements=state.dependency_placements(analyzed),
        avoid_clusters=state.avoid.get(object_key, frozenset()),
    )
    decision = core.schedule(inp)
    return Outcome(
        event.sequence,
        object_key,
        recorded,
        decision.to_event(recorded.previous),
        trace_id(event.envelope.traceparent),
    )
