"""A member cluster's capacity from its Nodes and Pods: what the scheduler reads.

Per node, ``free = allocatable - requests of the pods bound there`` (pods that
finished, Succeeded or Failed, hold nothing), kept node by node so the scheduler
can judge whether a pod shape fits on one node; the cluster's `available` is the
sum over schedulable, Ready nodes. A cordoned or not-Ready node offers nothing
new (its `free` is reported as zero) but its allocatable still counts, as
``kubectl describe`` shows it. Pure: the agent lists, this computes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flotilla.common import capacity, interpreters, quantity
from flotilla.common.capacity import ClusterCapacity, NodeCapacity
from flotilla.common.events import Requests

_FINISHED = frozenset({"Succeeded", "Failed"})


def _allocatable(node: Mapping[str, Any]) -> Requests:
    status = node.get("status") or {}
    units: Requests = {}
    for resource, amount in (status.get("allocatable") or {}).items():
        try:
            units[str(resource)] = quantity.to_units(str(resource), amount)
        except (quantity.QuantityError, TypeError):
            continue  # a resource we cannot read is one we cannot offer
    return units


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


def pod_usage(pod: Mapping[str, Any]) -> Requests | None:
    """What a bound, unfinished pod holds on its node (one pod slot included); None
    for a pod that holds nothing (unbound or finished)."""
    if ((pod.get("status") or {}).get("phase")) in _FINISHED:
        return None
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    try:
        requests = interpreters.pod_requests(pod.get("spec") or {})
    except interpreters.InterpretationError:
        requests = {}
    return capacity.pod_shape(requests)


def cluster_capacity(
    cluster: str,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    observed_at: float,
) -> ClusterCapacity:
    """The capacity record of `cluster` from everything listed on it."""
    used: dict[str, list[Requests]] = {}
    for pod in pods:
        usage = pod_usage(pod)
        if usage is not None:
            used.setdefault(str(pod["spec"]["nodeName"]), []).append(usage)
    records: list[NodeCapacity] = []
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name"))):
        name = str((node.get("metadata") or {}).get("name"))
        allocatable = _allocatable(node)
        taken = capacity.add(*used.get(name, []))
        if _schedulable(node):
            free = {r: max(amount - taken.get(r, 0), 0) for r, amount in allocatable.items()}
        else:
            free = {r: 0 for r in allocatable}
        records.append(NodeCapacity(name=name, allocatable=allocatable, free=free))
    return ClusterCapacity(
        cluster=cluster,
        allocatable=capacity.add(*(n.allocatable for n in records)),
        available=capacity.add(*(n.free for n in records)),
        nodes=records,
        observed_at=observed_at,
    )
