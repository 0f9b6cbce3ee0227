"""The workload controllers: Deployment, ReplicaSet, StatefulSet, DaemonSet and Job.

Each controller is level-triggered: `reconcile(key)` reads the current object and its
pods from `ClusterState`, creates or deletes what is missing or extra, and writes the
owner's status in the shape upstream controllers do (the fields clients and
Flotilla's status aggregation read). Writes go straight to the in-process `Store`;
pods carry a `controller: true` ownerReference so the store's garbage collector
removes them with their owner. Behaviour follows upstream where clients can observe
it (rolling updates bounded by maxSurge/maxUnavailable, minReadySeconds, progress
deadlines, StatefulSet ordinals, OrderedReady and claim templates, DaemonSet default
tolerations, Job completions/parallelism/Indexed) and is simplified elsewhere (no
proportional scaling mid-rollout, no ControllerRevision objects, pods never fail).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.resources import ResourceType
from flotilla.kubesim.schema import clone
from flotilla.kubesim.sim import pods, scheduling
from flotilla.kubesim.sim.scheduling import NodeInfo, PodSchedulingSpec
from flotilla.kubesim.sim.state import ClusterState, Key, PodRecord
from flotilla.kubesim.store import Store, now_rfc3339

POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
CONTROLLER_REVISION_HASH = "controller-revision-hash"
DAEMONSET_HASH = "pod-template-generation"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"

# Tolerations upstream's DaemonSet controller adds to every daemon pod.
DAEMONSET_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


@dataclass
class Context:
    """What every controller works with."""

    store: Store
    state: ClusterState
    types: dict[str, ResourceType]
    # Look at (kind, key) again after a delay; the simulator wires this to its queues.
    requeue: Callable[[str, Key, float], None] = lambda kind, key, delay: None

    def create_pod(self, pod: dict[str, Any]) -> None:
        # The store keeps a copy of its own; the stored pod is not needed back.
        self.store.create(self.types["Pod"], clone(pod), owned=True)

    def delete_pod(self, record: PodRecord) -> None:
        try:
            self.store.delete(self.types["Pod"], record.namespace, record.name)
        except ApiError as exc:
            if exc.code != 404:
                raise


def count_available(
    ctx: Context, records: Iterable[PodRecord], min_ready_seconds: int, kind: str, key: Key
) -> int:
    """Pods ready for at least `minReadySeconds`; asks to be woken when the next one is."""
    if min_ready_seconds <= 0:
        return sum(1 for r in records if r.ready)
    now = time.monotonic()
    available = 0
    wait: float | None = None
    for record in records:
        if not record.ready or record.ready_since is None:
            continue
        remaining = record.ready_since + min_ready_seconds - now
        if remaining <= 0:
            available += 1
        else:
            wait = remaining if wait is None else min(wait, remaining)
    if wait is not None:
        ctx.requeue(kind, key, wait)
    return available


def _min_ready(obj: dict[str, Any]) -> int:
    return int((obj.get("spec") or {}).get("minReadySeconds") or 0)


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    *,
    touch: bool = False,
) -> list[dict[str, Any]]:
    """Deployment-style conditions with `kind` set.

    `lastTransitionTime` moves only when the status flips; `lastUpdateTime` when the
    status or reason changes, or when `touch` says progress was made.
    """
    now = now_rfc3339()
    out = [c for c in conditions if c.get("type") != kind]
    previous = next((c for c in conditions if c.get("type") == kind), None)
    same = previous and previous.get("status") == status and previous.get("reason") == reason
    if previous and same:
        new = {**previous, "message": message}
        if touch:
            new["lastUpdateTime"] = now
    else:
        flipped = previous is None or previous.get("status") != status
        new = {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": now
            if flipped
            else (previous or {}).get("lastTransitionTime", now),
        }
    out.append(new)
    return sorted(out, key=lambda c: str(c.get("type")))


def _seconds_since(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return (datetime.now(UTC) - then).total_seconds()


def write_status(
    store: Store, rt: ResourceType, obj: dict[str, Any], status: dict[str, Any]
) -> None:
    """Write `status` unless it is what the object already has.

    `status` is handed to the store (`owned`): callers build it afresh for each write
    (its parts may be shared with stored objects, which nobody mutates) and never
    touch it again.
    """
    if obj.get("status") == status:
        return
    meta = obj["metadata"]
    store.update(
        rt,
        {
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "status": status,
        },
        subresource="status",
        owned=True,
    )


def _replicas(obj: dict[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else max(int(value), 0)


def _deleting(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _deletion_rank(record: PodRecord) -> tuple[int, int, int]:
    """Upstream's order for scale-down: unscheduled, then not ready, then newest first."""
    return (0 if record.node_name is None else 1, 1 if record.ready else 0, -record.created)


def _int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if value is None:
        return 0
    if isinstance(value, str) and value.endswith("%"):
        fraction = int(value[:-1]) * total / 100
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(value)


def _create_with_fresh_name(ctx: Context, pod: dict[str, Any], prefix: str) -> None:
    """Create `pod` as `<prefix>-<random>`, drawing a new suffix on a name collision."""
    for _ in range(5):
        pod["metadata"]["name"] = f"{prefix}-{pods.random_suffix()}"
        try:
            ctx.create_pod(pod)
            return
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
    raise ApiError(409, "AlreadyExists", f"could not find a free pod name for {prefix}")


class ReplicaSetController:
    """Keeps `spec.replicas` pods per ReplicaSet and reports their readiness."""

    kind = "ReplicaSet"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]

    def reconcile(self, key: Key) -> None:
        rs = self.ctx.state.cache(self.kind).get(key)
        if rs is None:
            return
        uid = rs["metadata"]["uid"]
        owned = self.ctx.state.owned_pods(uid)
        active = [p for p in owned if p.active]
        want = _replicas(rs)
        if not _deleting(rs):
            if len(active) < want:
                template = (rs.get("spec") or {}).get("template") or {}
                for _ in range(want - len(active)):
                    _create_with_fresh_name(
                        self.ctx,
                        pods.pod_from_template(template, namespace=key[0], name="", owner=rs),
                        key[1],
                    )
            elif len(active) > want:
                for record in sorted(active, key=_deletion_rank)[: len(active) - want]:
                    self.ctx.delete_pod(record)
            active = [p for p in self.ctx.state.owned_pods(uid) if p.active]
        ready = sum(1 for p in active if p.ready)
        available = count_available(self.ctx, active, _min_ready(rs), self.kind, key)
        status: dict[str, Any] = {
            "replicas": len(active),
            "fullyLabeledReplicas": len(active),
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        write_status(self.ctx.store, self.rt, rs, status)


class DeploymentController:
    """Deployment -> ReplicaSets: one per pod template, rolled per the strategy."""

    kind = "Deployment"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]
        self.rs_rt = ctx.types["ReplicaSet"]

    def reconcile(self, key: Key) -> None:
        deployment = self.ctx.state.cache(self.kind).get(key)
        if deployment is None:
            return
        spec = deployment.get("spec") or {}
        uid = deployment["metadata"]["uid"]
        template = spec.get("template") or {}
        digest = pods.template_hash(template)
        owned = list(self.ctx.state.cache("ReplicaSet").owned_by(uid))
        new = next((rs for rs in owned if _labels(rs).get(POD_TEMPLATE_HASH) == digest), None)
        old = sorted(
            (rs for rs in owned if rs is not new),
            key=lambda rs: int((rs["metadata"].get("annotations") or {}).get(REVISION, "0")),
        )
        if not _deleting(deployment) and not spec.get("paused"):
            if new is None:
                new = self._create_replicaset(deployment, template, digest, old, key)
            if (spec.get("strategy") or {}).get("type") == "Recreate":
                self._recreate(deployment, new, old)
            else:
                self._rolling(deployment, new, old)
            self._cleanup_history(deployment, old)
        self._write_status(deployment, new, old)

    def _create_replicaset(
        self,
        deployment: dict[str, Any],
        template: dict[str, Any],
        digest: str,
        old: list[dict[str, Any]],
        key: Key,
    ) -> dict[str, Any]:
        spec = deployment.get("spec") or {}
        revision = 1 + max(
            (int((rs["metadata"].get("annotations") or {}).get(REVISION, "0")) for rs in old),
            default=0,
        )
        template_meta = template.get("metadata") or {}
        labels = {**(template_meta.get("labels") or {}), POD_TEMPLATE_HASH: digest}
        selector = dict(spec.get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), POD_TEMPLATE_HASH: digest}
        has_old_pods = any(_replicas(rs) > 0 for rs in old)
        replicaset = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{key[1]}-{digest}",
                "namespace": key[0],
                "labels": labels,
                "annotations": {
                    REVISION: str(revision),
                    "deployment.kubernetes.io/desired-replicas": str(_replicas(deployment)),
                },
                "ownerReferences": [pods.owner_reference(deployment)],
            },
            "spec": {
                "replicas": 0 if has_old_pods else _replicas(deployment),
                "minReadySeconds": spec.get("minReadySeconds", 0),
                "selector": selector,
                "template": {**template, "metadata": {**template_meta, "labels": labels}},
            },
        }
        try:
            return self.ctx.store.create(self.rs_rt, replicaset)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
            return self.ctx.store.get(self.rs_rt, key[0], f"{key[1]}-{digest}")

    def _scale(self, rs: dict[str, Any], replicas: int, deployment: dict[str, Any]) -> None:
        annotations = rs["metadata"].get("annotations") or {}
        desired = str(_replicas(deployment))
        if (
            _replicas(rs) == replicas
            and annotations.get("deployment.kubernetes.io/desired-replicas") == desired
        ):
            return
        updated = {
            **rs,
            "metadata": {
                **rs["metadata"],
                "annotations": {
                    **annotations,
                    "deployment.kubernetes.io/desired-replicas": desired,
                },
            },
            "spec": {**(rs.get("spec") or {}), "replicas": replicas},
        }
        self.ctx.store.update(self.rs_rt, updated)

    def _recreate(
        self, deployment: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]]
    ) -> None:
        for rs in old:
            if _replicas(rs) > 0:
                self._scale(rs, 0, deployment)
        old_pods = sum(
            1
            for rs in old
            for p in self.ctx.state.owned_pods(rs["metadata"]["uid"])
            if not p.deleting
        )
        if old_pods == 0:
            self._scale(new, _replicas(deployment), deployment)

    def _rolling(
        self, deployment: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]]
    ) -> None:
        replicas = _replicas(deployment)
        rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
        max_surge = _int_or_percent(rolling.get("maxSurge", "25%"), replicas, round_up=True)
        max_unavailable = _int_or_percent(
            rolling.get("maxUnavailable", "25%"), replicas, round_up=False
        )
        if max_surge == 0 and max_unavailable == 0:
            max_unavailable = 1
        active_old = [rs for rs in old if _replicas(rs) > 0]
        if not active_old:
            self._scale(new, replicas, deployment)
            return
        everything = [new, *old]
        # Count pods a ReplicaSet still has beyond its (just lowered) spec, and trust
        # availability only up to the spec: both keep a stale RS status from letting
        # the rollout overshoot maxSurge or undershoot maxUnavailable.
        total = sum(max(_replicas(rs), _status_int(rs, "replicas")) for rs in everything)
        new_replicas = _replicas(new)
        if new_replicas > replicas:
            new_replicas = replicas
        elif new_replicas < replicas:
            room = replicas + max_surge - total
            if room > 0:
                new_replicas += min(room, replicas - new_replicas)
        if new_replicas != _replicas(new):
            self._scale(new, new_replicas, deployment)
            total += new_replicas - _replicas(new)
        # Upstream reconcileOldReplicaSets: never let availability drop below
        # replicas - maxUnavailable; unhealthy old replicas go first, then available ones.
        min_available = replicas - max_unavailable
        new_unavailable = new_replicas - _status_int(new, "availableReplicas")
        budget = total - min_available - new_unavailable
        if budget <= 0:
            return
        targets = {rs["metadata"]["name"]: _replicas(rs) for rs in active_old}
        for rs in active_old:
            unhealthy = targets[rs["metadata"]["name"]] - _available(rs)
            cut = min(budget, max(unhealthy, 0))
            if cut > 0:
                targets[rs["metadata"]["name"]] -= cut
                budget -= cut
        available = sum(_available(rs) for rs in everything)
        spare = available - min_available
        for rs in active_old:
            if spare <= 0:
                break
            cut = min(targets[rs["metadata"]["name"]], spare)
            targets[rs["metadata"]["name"]] -= cut
            spare -= cut
        for rs in active_old:
            if targets[rs["metadata"]["name"]] != _replicas(rs):
                self._scale(rs, targets[rs["metadata"]["name"]], deployment)

    def _cleanup_history(self, deployment: dict[str, Any], old: list[dict[str, Any]]) -> None:
        limit = (deployment.get("spec") or {}).get("revisionHistoryLimit", 10)
        idle = [
            rs
            for rs in old
            if _replicas(rs) == 0 and _status_int(rs, "replicas") == 0 and not _deleting(rs)
        ]
        for rs in idle[: max(len(idle) - int(limit), 0)]:
            try:
                self.ctx.store.delete(
                    self.rs_rt, rs["metadata"]["namespace"], rs["metadata"]["name"]
                )
            except ApiError as exc:
                if exc.code != 404:
                    raise

    def _progressing(
        self,
        deployment: dict[str, Any],
        conditions: list[dict[str, Any]],
        name: str,
        progressed: bool,
    ) -> list[dict[str, Any]]:
        """Progressing while pods move; False (ProgressDeadlineExceeded) once they stop."""
        spec = deployment.get("spec") or {}
        deadline = int(spec.get("progressDeadlineSeconds", 600))
        current = next((c for c in conditions if c.get("type") == "Progressing"), None)
        if current and current.get("reason") == "ProgressDeadlineExceeded" and not progressed:
            return conditions
        stalled_for = 0.0 if progressed else _seconds_since((current or {}).get("lastUpdateTime"))
        if current and not spec.get("paused") and stalled_for >= deadline:
            return set_condition(
                conditions,
                "Progressing",
                "False",
                "ProgressDeadlineExceeded",
                f'ReplicaSet "{name}" has timed out progressing.',
            )
        meta = deployment["metadata"]
        self.ctx.requeue(self.kind, (meta["namespace"], meta["name"]), deadline - stalled_for + 1)
        return set_condition(
            conditions,
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            f'ReplicaSet "{name}" is progressing.',
            touch=progressed,
        )

    def _write_status(
        self,
        deployment: dict[str, Any],
        new: dict[str, Any] | None,
        old: list[dict[str, Any]],
    ) -> None:
        # Re-read: scaling above changed the cached ReplicaSets.
        cache = self.ctx.state.cache("ReplicaSet")
        everything = [
            cache.get((rs["metadata"]["namespace"], rs["metadata"]["name"])) or rs
            for rs in ([new] if new else []) + old
        ]
        fresh_new = everything[0] if new else None
        replicas = _replicas(deployment)
        total = sum(_status_int(rs, "replicas") for rs in everything)
        updated = _status_int(fresh_new, "replicas") if fresh_new else 0
        ready = sum(_status_int(rs, "readyReplicas") for rs in everything)
        available = sum(_status_int(rs, "availableReplicas") for rs in everything)
        rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
        max_unavailable = _int_or_percent(
            rolling.get("maxUnavailable", "25%"), replicas, round_up=False
        )
        if (deployment.get("spec") or {}).get("strategy", {}).get("type") == "Recreate":
            max_unavailable = replicas
        previous = deployment.get("status") or {}
        conditions = list(previous.get("conditions") or [])
        if available >= replicas - max_unavailable:
            conditions = set_condition(
                conditions,
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        else:
            conditions = set_condition(
                conditions,
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        name = fresh_new["metadata"]["name"] if fresh_new else ""
        counts = {
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
        }
        progressed = any(previous.get(k, 0) != v for k, v in counts.items())
        if fresh_new and updated == replicas and available >= replicas and total == replicas:
            conditions = set_condition(
                conditions,
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                f'ReplicaSet "{name}" has successfully progressed.',
            )
        elif fresh_new:
            conditions = self._progressing(deployment, conditions, name, progressed)
        status: dict[str, Any] = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            **counts,
            "unavailableReplicas": max(replicas - available, 0),
            "conditions": conditions,
        }
        write_status(self.ctx.store, self.rt, deployment, status)
        if fresh_new:
            revision = (fresh_new["metadata"].get("annotations") or {}).get(REVISION)
            annotations = deployment["metadata"].get("annotations") or {}
            if revision and annotations.get(REVISION) != revision:
                latest = self.ctx.store.get(
                    self.rt, deployment["metadata"]["namespace"], deployment["metadata"]["name"]
                )
                latest["metadata"].setdefault("annotations", {})[REVISION] = revision
                self.ctx.store.update(self.rt, latest)


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _status_int(obj: dict[str, Any] | None, field: str) -> int:
    if obj is None:
        return 0
    return int((obj.get("status") or {}).get(field) or 0)


def _available(rs: dict[str, Any]) -> int:
    return min(_status_int(rs, "availableReplicas"), _replicas(rs))


def _ordinal(name: str, set_name: str) -> int | None:
    suffix = name[len(set_name) + 1 :] if name.startswith(f"{set_name}-") else ""
    return int(suffix) if suffix.isdigit() else None


class StatefulSetController:
    """Pods `<name>-0..N-1`, created in order (OrderedReady) or all at once (Parallel)."""

    kind = "StatefulSet"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]
        self.pvc_rt = ctx.types["PersistentVolumeClaim"]

    def _ensure_claims(self, sts: dict[str, Any], ordinal: int) -> dict[str, str]:
        """Create the ordinal's PVCs from volumeClaimTemplates (Bound); volume -> claim."""
        spec = sts.get("spec") or {}
        namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
        claims: dict[str, str] = {}
        for claim_template in spec.get("volumeClaimTemplates") or ():
            volume = (claim_template.get("metadata") or {}).get("name")
            if not volume:
                continue
            claim = f"{volume}-{name}-{ordinal}"
            claims[volume] = claim
            metadata: dict[str, Any] = {
                "name": claim,
                "namespace": namespace,
                "labels": dict(((spec.get("selector") or {}).get("matchLabels")) or {}),
            }
            if retention.get("whenDeleted") == "Delete":
                metadata["ownerReferences"] = [pods.owner_reference(sts)]
            pvc = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": metadata,
                "spec": {
                    **(claim_template.get("spec") or {}),
                    "volumeName": f"pv-{namespace}-{claim}",
                },
                "status": {
                    "phase": "Bound",
                    "accessModes": list(
                        (claim_template.get("spec") or {}).get("accessModes") or ["ReadWriteOnce"]
                    ),
                    "capacity": dict(
                        ((claim_template.get("spec") or {}).get("resources") or {}).get("requests")
                        or {}
                    ),
                },
            }
            try:
                self.ctx.store.create(self.pvc_rt, pvc)
            except ApiError as exc:
                if exc.reason != "AlreadyExists":
                    raise
        return claims

    def reconcile(self, key: Key) -> None:
        sts = self.ctx.state.cache(self.kind).get(key)
        if sts is None:
            return
        spec = sts.get("spec") or {}
        uid = sts["metadata"]["uid"]
        name = key[1]
        template = spec.get("template") or {}
        revision = f"{name}-{pods.template_hash(template)}"
        ordered = spec.get("podManagementPolicy", "OrderedReady") != "Parallel"
        replicas = _replicas(sts)
        by_ordinal: dict[int, PodRecord] = {}
        for record in self.ctx.state.owned_pods(uid):
            ordinal = _ordinal(record.name, name)
            if ordinal is not None:
                by_ordinal[ordinal] = record
        if not _deleting(sts):
            self._sync(sts, template, revision, ordered, replicas, by_ordinal)
        live = [
            r
            for r in self.ctx.state.owned_pods(uid)
            if not r.deleting and _ordinal(r.name, name) is not None
        ]
        ready = sum(1 for r in live if r.ready)
        updated = sum(1 for r in live if r.labels.get(CONTROLLER_REVISION_HASH) == revision)
        previous = sts.get("status") or {}
        current_revision = previous.get("currentRevision") or revision
        if updated == len(live) == replicas:
            current_revision = revision
        current = sum(1 for r in live if r.labels.get(CONTROLLER_REVISION_HASH) == current_revision)
        status: dict[str, Any] = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(live),
            "readyReplicas": ready,
            "availableReplicas": count_available(self.ctx, live, _min_ready(sts), self.kind, key),
            "currentReplicas": current,
            "updatedReplicas": updated,
            "currentRevision": current_revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        write_status(self.ctx.store, self.rt, sts, status)

    def _sync(
        self,
        sts: dict[str, Any],
        template: dict[str, Any],
        revision: str,
        ordered: bool,
        replicas: int,
        by_ordinal: dict[int, PodRecord],
    ) -> None:
        namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        spec = sts.get("spec") or {}
        for ordinal in range(replicas):
            record = by_ordinal.get(ordinal)
            if record is None:
                pod_name = f"{name}-{ordinal}"
                overrides: dict[str, Any] = {"hostname": pod_name}
                if spec.get("serviceName"):
                    overrides["subdomain"] = spec["serviceName"]
                claims = self._ensure_claims(sts, ordinal)
                if claims:
                    volumes = [
                        v
                        for v in (template.get("spec") or {}).get("volumes") or []
                        if v.get("name") not in claims
                    ]
                    overrides["volumes"] = volumes + [
                        {"name": volume, "persistentVolumeClaim": {"claimName": claim}}
                        for volume, claim in claims.items()
                    ]
                self.ctx.create_pod(
                    pods.pod_from_template(
                        template,
                        namespace=namespace,
                        name=pod_name,
                        owner=sts,
                        labels={
                            "statefulset.kubernetes.io/pod-name": pod_name,
                            "apps.kubernetes.io/pod-index": str(ordinal),
                            CONTROLLER_REVISION_HASH: revision,
                        },
                        spec_overrides=overrides,
                    )
                )
                if ordered:
                    return
            elif ordered and (record.deleting or not record.ready):
                return
        condemned = sorted((o for o in by_ordinal if o >= replicas), reverse=True)
        for ordinal in condemned:
            record = by_ordinal[ordinal]
            if not record.deleting:
                self.ctx.delete_pod(record)
            if ordered:
                return
        # RollingUpdate: replace the highest-ordinal outdated pod once all are ready.
        strategy = spec.get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        live = [by_ordinal[o] for o in range(replicas) if o in by_ordinal]
        if len(live) < replicas or any(r.deleting or not r.ready for r in live):
            return
        for ordinal in range(replicas - 1, partition - 1, -1):
            record = by_ordinal[ordinal]
            if record.labels.get(CONTROLLER_REVISION_HASH) != revision:
                self.ctx.delete_pod(record)
                return


def daemon_pod_scheduling(template: dict[str, Any], node: str) -> PodSchedulingSpec:
    spec = daemon_pod_spec(template, node)
    return PodSchedulingSpec.from_pod_spec(spec)


def daemon_pod_spec(template: dict[str, Any], node: str) -> dict[str, Any]:
    """The template's pod spec pinned to `node` the way upstream pins daemon pods."""
    spec = dict(template.get("spec") or {})
    tolerations = list(spec.get("tolerations") or [])
    for default in DAEMONSET_TOLERATIONS:
        if default not in tolerations:
            tolerations.append(dict(default))
    spec["tolerations"] = tolerations
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = [{**term, "matchFields": [pin]} for term in (required.get("nodeSelectorTerms") or [{}])]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    return spec


def daemon_should_run(template: dict[str, Any], node: NodeInfo) -> tuple[bool, bool]:
    """Upstream `nodeShouldRunDaemonPod`: (should run, should keep running) on `node`.

    A new daemon pod needs the selector/affinity to match and every NoSchedule and
    NoExecute taint tolerated; an existing one is only evicted by NoExecute taints.
    """
    pod = daemon_pod_scheduling(template, node.name)
    if not scheduling.matches_node_affinity(pod, node):
        return False, False
    if scheduling.untolerated_taint(node.taints, pod.tolerations, frozenset({"NoExecute"})):
        return False, False
    return scheduling.untolerated_taint(node.taints, pod.tolerations) is None, True


class DaemonSetController:
    """One pod per eligible node; pods on nodes they may no longer run on are removed."""

    kind = "DaemonSet"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]

    def reconcile(self, key: Key) -> None:
        ds = self.ctx.state.cache(self.kind).get(key)
        if ds is None:
            return
        uid = ds["metadata"]["uid"]
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        generation = str(ds["metadata"].get("generation", 1))
        eligible: list[str] = []
        keep: set[str] = set()
        for node in self.ctx.state.nodes.values():
            should_run, should_continue = daemon_should_run(template, node)
            if should_run:
                eligible.append(node.name)
            if should_continue:
                keep.add(node.name)
        eligible.sort()
        if not _deleting(ds):
            self._sync(ds, template, generation, eligible, keep)
        by_node: dict[str, list[PodRecord]] = {}
        for record in self.ctx.state.owned_pods(uid):
            target = record.target_node
            if target is not None and record.active:
                by_node.setdefault(target, []).append(record)
        eligible_set = set(eligible)
        scheduled = [n for n in eligible if n in by_node]
        ready_nodes = [n for n in scheduled if any(r.ready for r in by_node[n])]
        available = count_available(
            self.ctx,
            (next(r for r in by_node[n] if r.ready) for n in ready_nodes),
            _min_ready(ds),
            self.kind,
            key,
        )
        updated = [
            n
            for n in scheduled
            if any(r.labels.get(DAEMONSET_HASH) == generation for r in by_node[n])
        ]
        status: dict[str, Any] = {
            "observedGeneration": ds["metadata"].get("generation", 1),
            "desiredNumberScheduled": len(eligible),
            "currentNumberScheduled": len(scheduled),
            "numberMisscheduled": sum(1 for n in by_node if n not in eligible_set),
            "numberReady": len(ready_nodes),
            "numberAvailable": available,
            "updatedNumberScheduled": len(updated),
        }
        unavailable = len(eligible) - available
        if unavailable:
            status["numberUnavailable"] = unavailable
        write_status(self.ctx.store, self.rt, ds, status)

    def _sync(
        self,
        ds: dict[str, Any],
        template: dict[str, Any],
        generation: str,
        eligible: list[str],
        keep: set[str],
    ) -> None:
        namespace, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        by_node: dict[str, list[PodRecord]] = {}
        for record in self.ctx.state.owned_pods(ds["metadata"]["uid"]):
            target = record.target_node
            if record.active and target is not None:
                by_node.setdefault(target, []).append(record)
        for node, records in by_node.items():
            if node not in keep:
                for record in records:
                    self.ctx.delete_pod(record)
            else:
                for record in sorted(records, key=_deletion_rank)[: len(records) - 1]:
                    self.ctx.delete_pod(record)
        for node in eligible:
            if node in by_node:
                continue
            spec = daemon_pod_spec(template, node)
            _create_with_fresh_name(
                self.ctx,
                pods.pod_from_template(
                    {**template, "spec": spec},
                    namespace=namespace,
                    name="",
                    owner=ds,
                    labels={DAEMONSET_HASH: generation},
                ),
                name,
            )
        # RollingUpdate: replace outdated pods while at most maxUnavailable nodes lack a
        # ready daemon pod (a node whose new pod was just created counts as unavailable).
        strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return
        max_unavailable = max(
            _int_or_percent(
                (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1),
                len(eligible),
                round_up=True,
            ),
            1,
        )
        ready_nodes = {n for n in eligible if any(r.ready for r in by_node.get(n, ()))}
        budget = max_unavailable - (len(eligible) - len(ready_nodes))
        for node in eligible:
            if budget <= 0:
                return
            outdated = [
                r for r in by_node.get(node, ()) if r.labels.get(DAEMONSET_HASH) != generation
            ]
            if outdated and node in ready_nodes:
                for record in outdated:
                    self.ctx.delete_pod(record)
                budget -= 1


class JobController:
    """Runs pods until `completions` succeeded, at most `parallelism` at a time."""

    kind = "Job"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]

    def reconcile(self, key: Key) -> None:
        job = self.ctx.state.cache(self.kind).get(key)
        if job is None:
            return
        spec = job.get("spec") or {}
        previous = job.get("status") or {}
        uid = job["metadata"]["uid"]
        owned = self.ctx.state.owned_pods(uid)
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in previous.get("conditions") or ()
        )
        succeeded_pods = [p for p in owned if p.phase == "Succeeded"]
        succeeded = max(len(succeeded_pods), int(previous.get("succeeded") or 0))
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1) or 0)
        indexed = spec.get("completionMode") == "Indexed" and completions is not None
        active = [p for p in owned if p.active]
        if finished or _deleting(job) or spec.get("suspend"):
            want_active = 0
        elif completions is not None:
            want_active = min(parallelism, int(completions) - succeeded)
        else:
            want_active = parallelism if succeeded == 0 else 0
        want_active = max(want_active, 0)
        if not finished and not _deleting(job):
            if len(active) < want_active:
                self._create(job, key, want_active - len(active), owned, indexed)
            elif len(active) > want_active and not finished:
                for record in sorted(active, key=_deletion_rank)[: len(active) - want_active]:
                    self.ctx.delete_pod(record)
            active = [p for p in self.ctx.state.owned_pods(uid) if p.active]
        now = now_rfc3339()
        status: dict[str, Any] = {
            key_: value
            for key_, value in previous.items()
            if key_ in ("startTime", "conditions", "completionTime")
        }
        status.setdefault("startTime", now)
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if p.ready)
        status["succeeded"] = succeeded
        status["failed"] = int(previous.get("failed") or 0)
        status["terminating"] = 0
        status["uncountedTerminatedPods"] = {}
        if indexed:
            done = sorted(
                int(p.labels.get(JOB_INDEX, "-1"))
                for p in succeeded_pods
                if p.labels.get(JOB_INDEX, "").isdigit()
            )
            status["completedIndexes"] = ",".join(str(i) for i in done)
        complete = (completions is not None and succeeded >= int(completions)) or (
            completions is None and succeeded > 0 and not active
        )
        if complete and not finished:
            conditions = list(previous.get("conditions") or [])
            for kind, reason in (
                ("SuccessCriteriaMet", "CompletionsReached"),
                ("Complete", "CompletionsReached"),
            ):
                conditions = [c for c in conditions if c.get("type") != kind]
                conditions.append(
                    {
                        "type": kind,
                        "status": "True",
                        "reason": reason,
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    }
                )
            status["conditions"] = conditions
            status["completionTime"] = now
        if status.get("startTime") and previous.get("startTime"):
            status["startTime"] = previous["startTime"]
        write_status(self.ctx.store, self.rt, job, status)

    def _create(
        self,
        job: dict[str, Any],
        key: Key,
        count: int,
        owned: Iterable[PodRecord],
        indexed: bool,
    ) -> None:
        uid = job["metadata"]["uid"]
        template = (job.get("spec") or {}).get("template") or {}
        labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": key[1],
            "controller-uid": uid,
            "job-name": key[1],
        }
        pending: Sequence[int | None] = [None] * count
        if indexed:
            taken = {
                int(p.labels[JOB_INDEX])
                for p in owned
                if (p.active or p.phase == "Succeeded") and p.labels.get(JOB_INDEX, "").isdigit()
            }
            completions = int((job.get("spec") or {}).get("completions") or 0)
            pending = [i for i in range(completions) if i not in taken][:count]
        for index in pending:
            pod_labels = dict(labels)
            annotations: dict[str, str] = {}
            prefix = key[1]
            if index is not None:
                pod_labels[JOB_INDEX] = str(index)
                annotations[JOB_INDEX] = str(index)
                prefix = f"{key[1]}-{index}"
            _create_with_fresh_name(
                self.ctx,
                pods.pod_from_template(
                    template,
                    namespace=key[0],
                    name="",
                    owner=job,
                    labels=pod_labels,
                    annotations=annotations,
                ),
                prefix,
            )


CONTROLLERS = (
    DeploymentController,
    ReplicaSetController,
    StatefulSetController,
    DaemonSetController,
    JobController,
)
