"""Pod objects as controllers create them, and pod status as a kubelet would report it.

Controllers turn a pod template into a Pod (`pod_from_template`); the simulated
kubelet writes the status transitions a client watches for: scheduled, then Running
with Ready/ContainersReady, then (for Job pods) Succeeded.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from flotilla.kubesim.sim.scheduling import CPU, MEMORY
from flotilla.kubesim.store import now_rfc3339

# Upstream `rand.String` alphabet: no vowels (no accidental words), no look-alikes.
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"


def random_suffix(length: int = 5) -> str:
    return "".join(secrets.choice(_ALPHANUMS) for _ in range(length))


def template_hash(template: dict[str, Any]) -> str:
    """A stable short hash of a pod template (the `pod-template-hash` label value)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    number = int.from_bytes(digest[:8], "big")
    out = []
    for _ in range(10):
        number, index = divmod(number, len(_ALPHANUMS))
        out.append(_ALPHANUMS[index])
    return "".join(out)


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", ""),
        "kind": owner.get("kind", ""),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_from_template(
    template: dict[str, Any],
    *,
    namespace: str,
    name: str,
    owner: dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod for `owner` built from its pod template (the store copies it on create)."""
    template_meta = template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**(template_meta.get("labels") or {}), **(labels or {})},
        "ownerReferences": [owner_reference(owner)],
    }
    merged_annotations = {**(template_meta.get("annotations") or {}), **(annotations or {})}
    if merged_annotations:
        metadata["annotations"] = merged_annotations
    spec = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "securityContext": {},
        **(template.get("spec") or {}),
        **(spec_overrides or {}),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def qos_class(spec: dict[str, Any]) -> str:
    """Upstream QoS: Guaranteed if every container's cpu+memory limits equal requests."""
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        for name in (CPU, MEMORY):
            if name in requests or name in limits:
                any_set = True
            if name not in limits or requests.get(name) != limits.get(name):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _condition(
    kind: str, status: str, now: str, reason: str | None = None, message: str | None = None
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _waiting_containers(spec: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason}},
            "lastState": {},
        }
        for c in spec.get("containers") or ()
    ]


def scheduled_status(spec: dict[str, Any], status: dict[str, Any], host_ip: str) -> dict[str, Any]:
    """Status right after binding, as the kubelet first reports it: Pending, creating."""
    now = now_rfc3339()
    not_ready = (
        "containers with unready status: ["
        + " ".join(c.get("name", "") for c in spec.get("containers") or ())
        + "]"
    )
    return {
        **status,
        "phase": "Pending",
        "conditions": [
            _condition("PodReadyToStartContainers", "False", now),
            _condition("Initialized", "True", now),
            _condition("Ready", "False", now, "ContainersNotReady", not_ready),
            _condition("ContainersReady", "False", now, "ContainersNotReady", not_ready),
            _condition("PodScheduled", "True", now),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": now,
        "containerStatuses": _waiting_containers(spec, "ContainerCreating"),
        "qosClass": qos_class(spec),
    }


def unschedulable_status(spec: dict[str, Any], message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [
            _condition("PodScheduled", "False", now_rfc3339(), "Unschedulable", message)
        ],
        "qosClass": qos_class(spec),
    }


def gated_status(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [
            _condition(
                "PodScheduled",
                "False",
                now_rfc3339(),
                "SchedulingGated",
                "Scheduling is blocked due to non-empty scheduling gates",
            )
        ],
        "qosClass": qos_class(spec),
    }


def _container_id() -> str:
    return f"containerd://{secrets.token_hex(32)}"


def running_status(
    spec: dict[str, Any], status: dict[str, Any], host_ip: str, pod_ip: str
) -> dict[str, Any]:
    """Running and Ready: every container started, init containers completed."""
    now = now_rfc3339()
    scheduled_at = now
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled":
            scheduled_at = condition.get("lastTransitionTime") or now
    started_at = status.get("startTime") or now
    out: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            _condition("PodReadyToStartContainers", "True", now),
            _condition("Initialized", "True", now),
            _condition("Ready", "True", now),
            _condition("ContainersReady", "True", now),
            _condition("PodScheduled", "True", scheduled_at),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": started_at,
        "qosClass": status.get("qosClass") or qos_class(spec),
        "containerStatuses": [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                "containerID": _container_id(),
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
                "lastState": {},
            }
            for c in spec.get("containers") or ()
        ],
    }
    if spec.get("initContainers"):
        out["initContainerStatuses"] = [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                "containerID": _container_id(),
                "ready": True,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
                "lastState": {},
            }
            for c in spec["initContainers"]
        ]
    return out


def succeeded_status(status: dict[str, Any]) -> dict[str, Any]:
    """A finished Job pod: every container exited 0."""
    now = now_rfc3339()
    conditions = []
    for condition in status.get("conditions") or ():
        if condition.get("type") in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
            condition = {
                **condition,
                "status": "False",
                "lastTransitionTime": now,
                "reason": "PodCompleted",
            }
        conditions.append(condition)
    containers = []
    for container in status.get("containerStatuses") or ():
        started = ((container.get("state") or {}).get("running") or {}).get("startedAt", now)
        containers.append(
            {
                **container,
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": started,
                        "finishedAt": now,
                        "containerID": container.get("containerID", ""),
                    }
                },
            }
        )
    return {
        **status,
        "phase": "Succeeded",
        "conditions": conditions,
        "containerStatuses": containers,
    }


def with_readiness(status: dict[str, Any], ready: bool) -> dict[str, Any]:
    """A running pod's status with Ready/ContainersReady (and containers) set to `ready`."""
    now = now_rfc3339()
    value = "True" if ready else "False"
    conditions = []
    for condition in status.get("conditions") or ():
        if (
            condition.get("type") in ("Ready", "ContainersReady")
            and condition.get("status") != value
        ):
            condition = {
                "type": condition["type"],
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
            if not ready:
                condition["reason"] = "NodeNotReady"
        conditions.append(condition)
    containers = [{**c, "ready": ready} for c in status.get("containerStatuses") or ()]
    return {**status, "conditions": conditions, "containerStatuses": containers}
