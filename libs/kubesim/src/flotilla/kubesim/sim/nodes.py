"""Simulated Nodes and their Leases: the objects a kubelet would register and renew.

`node_object` renders a Node the way a real kubelet reports one (well-known labels,
capacity = allocatable, Ready and pressure conditions, addresses, nodeInfo) so that
clients reading nodes see nothing unusual; `node_info` reads any Node back, whoever
wrote it, into the scheduler's `NodeInfo`. Leases in `kube-node-lease` carry the
heartbeat, as with upstream's NodeLease feature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flotilla.common import quantity
from flotilla.kubesim.sim.scheduling import NodeInfo

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
GPU = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
KUBELET_VERSION = "v1.34.0-kubesim"
_SHORT_TOPOLOGY = {"region": REGION_LABEL, "zone": ZONE_LABEL}
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """`MicroTime`, the format Lease `renewTime` uses."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_name_prefix(cluster_name: str) -> str:
    """`<cluster>-node`, reduced to what a DNS-1123 subdomain allows."""
    cleaned = _INVALID_NAME_CHARS.sub("-", cluster_name.lower()).strip("-.") or "kubesim"
    return f"{cleaned}-node"


def node_labels(name: str, extra: dict[str, str]) -> dict[str, str]:
    """Well-known labels plus the user's; `region`/`zone` also set the topology labels."""
    labels = {
        HOSTNAME_LABEL: name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "kubesim",
    }
    for key, value in extra.items():
        labels[key] = value
        if key in _SHORT_TOPOLOGY:
            labels.setdefault(_SHORT_TOPOLOGY[key], value)
    return labels


@dataclass
class NodeShape:
    """What one simulated node offers (flag values, quantity strings)."""

    cpu: str = "8"
    memory: str = "32Gi"
    pods: int = 110
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)

    def capacity(self) -> dict[str, str]:
        # Validate early so a bad flag fails at start, not at the first scheduling attempt.
        quantity.parse(self.cpu)
        quantity.parse(self.memory)
        capacity = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": "100Gi",
        }
        if self.gpus:
            capacity[GPU] = str(self.gpus)
        return capacity


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def node_conditions(now: str, *, ready: bool = True) -> list[dict[str, Any]]:
    """A healthy kubelet's conditions, or all Unknown once it stopped reporting."""
    healthy = [
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    if ready:
        return [
            _condition(kind, status, reason, message, now)
            for kind, status, reason, message in healthy
        ]
    return [
        _condition(
            kind, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.", now
        )
        for kind, _, _, _ in healthy
    ]


def node_ip(index: int) -> str:
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255 or 1}"


def node_object(name: str, index: int, shape: NodeShape, cluster_name: str) -> dict[str, Any]:
    """A Node as a freshly registered kubelet reports it."""
    now = now_rfc3339()
    capacity = shape.capacity()
    spec: dict[str, Any] = {
        "providerID": f"kubesim://{cluster_name}/{name}",
        "podCIDR": f"10.244.{index % 256}.0/24",
        "podCIDRs": [f"10.244.{index % 256}.0/24"],
    }
    if shape.taints:
        spec["taints"] = [dict(t) for t in shape.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels(name, shape.labels),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "kubesim.flotilla.io/node": "fake",
            },
        },
        "spec": spec,
        "status": node_status(name, index, capacity, now),
    }


def node_status(name: str, index: int, capacity: dict[str, str], now: str) -> dict[str, Any]:
    return {
        "capacity": dict(capacity),
        "allocatable": dict(capacity),
        "conditions": node_conditions(now),
        "addresses": [
            {"type": "InternalIP", "address": node_ip(index)},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": f"kubesim-{index}",
            "systemUUID": f"kubesim-{index}",
            "bootID": f"kubesim-{index}",
            "kernelVersion": "6.1.0-kubesim",
            "osImage": "kubesim",
            "containerRuntimeVersion": "kubesim://1.0",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "phase": "Running",
    }


def node_info(node: dict[str, Any]) -> NodeInfo:
    """The scheduler's view of a Node object; unparseable quantities count as zero."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable: dict[str, int] = {}
    for resource, value in (status.get("allocatable") or status.get("capacity") or {}).items():
        try:
            allocatable[resource] = quantity.to_units(resource, value)
        except quantity.QuantityError:
            allocatable[resource] = 0
    return NodeInfo(
        name=metadata.get("name", ""),
        labels=dict(metadata.get("labels") or {}),
        allocatable=allocatable,
        taints=list(spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
    )


def is_ready(node: dict[str, Any]) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def lease_object(node_name: str, node_uid: str | None) -> dict[str, Any]:
    """The node's heartbeat Lease, owned by the Node so it goes when the node goes."""
    metadata: dict[str, Any] = {"name": node_name, "namespace": LEASE_NAMESPACE}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now_micro(),
        },
    }
