"""Pure placement logic of the simulated kube-scheduler: does a pod fit a node, and which node.

The simulator keeps one `NodeInfo` per node (what the node offers and what bound pods
already take) and asks `filter_node` / `choose_node` here; nothing in this module does
I/O, so the rules are table-tested directly. The rules follow the upstream default
plugins closely enough for a client to get the same answer it would from a real
cluster: `NodeResourcesFit` (requests = sum of containers, max'ed with each init
container, sidecars counted like upstream, plus pod overhead), `NodeName`,
`NodeSelector`/`NodeAffinity` (required terms only), `TaintToleration` (NoSchedule and
NoExecute) and `NodeUnschedulable`; scoring is `NodeResourcesLeastAllocated`.

Rejections are values: `filter_node` returns the upstream reason strings, and
`unschedulable_message` folds them into the familiar "0/3 nodes are available: …".
Hand-written because the only implementation is kube-scheduler itself (Go).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla.common import quantity

PODS = "pods"
CPU = "cpu"
MEMORY = "memory"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
DEFAULT_SCHEDULER = "default-scheduler"
_FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

Resources = dict[str, int]


@functools.lru_cache(maxsize=4096)
def _units(resource: str, value: str | int | float) -> int:
    # Thousands of pods repeat the same few quantity strings; parse each once.
    return quantity.to_units(resource, value)


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    # Upstream defaults a missing request to the limit, so do the same.
    merged: dict[str, Any] = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return {name: _units(name, value) for name, value in merged.items()}


def _add(total: Resources, extra: Mapping[str, int]) -> None:
    for name, value in extra.items():
        total[name] = total.get(name, 0) + value


def _max_into(total: Resources, other: Mapping[str, int]) -> None:
    for name, value in other.items():
        if value > total.get(name, 0):
            total[name] = value


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What a pod takes from a node, in `quantity.to_units` units, always with `pods: 1`.

    Upstream `resource.PodRequests`: the sum over app containers plus restartable
    (sidecar) init containers, max'ed with the peak of every ordinary init container
    (which runs alongside the sidecars started before it), plus `spec.overhead`.
    """
    total: Resources = {}
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _max_into(init_peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, requests)
            _max_into(init_peak, running)
    _add(total, sidecars)
    _max_into(total, init_peak)
    overhead = spec.get("overhead") or {}
    _add(total, {name: _units(name, value) for name, value in overhead.items()})
    total[PODS] = 1
    return {name: value for name, value in total.items() if value or name == PODS}


@dataclass(slots=True)
class PodSchedulingSpec:
    """The parts of a pod spec the scheduler reads, parsed once per pod."""

    requests: Resources
    node_name: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    required_terms: list[dict[str, Any]] | None = None
    scheduler_name: str = DEFAULT_SCHEDULER
    gated: bool = False

    @property
    def ours(self) -> bool:
        """Pods naming another scheduler are left alone, as upstream's default one does."""
        return self.scheduler_name == DEFAULT_SCHEDULER

    @classmethod
    def from_pod_spec(cls, spec: Mapping[str, Any]) -> PodSchedulingSpec:
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        terms = None if affinity is None else list(affinity.get("nodeSelectorTerms") or [])
        return cls(
            requests=pod_requests(spec),
            node_name=spec.get("nodeName") or None,
            node_selector=dict(spec.get("nodeSelector") or {}),
            tolerations=list(spec.get("tolerations") or []),
            required_terms=terms,
            scheduler_name=spec.get("schedulerName") or DEFAULT_SCHEDULER,
            gated=bool(spec.get("schedulingGates")),
        )


@dataclass
class NodeInfo:
    """One node as the scheduler sees it: what it offers and what is already bound to it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    allocatable: Resources = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)
    unschedulable: bool = False
    requested: Resources = field(default_factory=dict)

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)

    def reserve(self, requests: Mapping[str, int]) -> None:
        _add(self.requested, requests)

    def release(self, requests: Mapping[str, int]) -> None:
        for name, value in requests.items():
            self.requested[name] = self.requested.get(name, 0) - value


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Upstream `Toleration.ToleratesTaint`."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return False


def untolerated_taint(
    taints: Iterable[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    effects: frozenset[str] = _FILTERED_EFFECTS,
) -> Mapping[str, Any] | None:
    """The first taint with one of `effects` that no toleration tolerates, if any."""
    for taint in taints:
        if taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _expression_matches(expression: Mapping[str, Any], value: str | None) -> bool:
    operator = expression.get("operator")
    values = expression.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], node: NodeInfo) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # upstream: an empty term matches no node
    for expression in expressions:
        if not _expression_matches(expression, node.labels.get(expression.get("key", ""))):
            return False
    for expression in fields:
        value = node.name if expression.get("key") == "metadata.name" else None
        if not _expression_matches(expression, value):
            return False
    return True


def matches_node_affinity(pod: PodSchedulingSpec, node: NodeInfo) -> bool:
    """nodeSelector (exact label equality) AND any required nodeAffinity term."""
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return False
    if pod.required_terms is None:
        return True
    return any(_term_matches(term, node) for term in pod.required_terms)


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    key = taint.get("key", "")
    return f"{{{key}: {value}}}" if value else f"{{{key}: }}"


def filter_node(pod: PodSchedulingSpec, node: NodeInfo) -> list[str]:
    """Why `pod` cannot go to `node` (upstream reason strings); empty when it fits."""
    if pod.node_name is not None and pod.node_name != node.name:
        return ["node(s) didn't match the requested node name"]
    if node.unschedulable and not any(
        tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in pod.tolerations
    ):
        return ["node(s) were unschedulable"]
    if (pod.node_selector or pod.required_terms is not None) and not matches_node_affinity(
        pod, node
    ):
        return ["node(s) didn't match Pod's node affinity/selector"]
    if node.taints:
        taint = untolerated_taint(node.taints, pod.tolerations)
        if taint is not None:
            return [f"node(s) had untolerated taint {_taint_text(taint)}"]
    # The hot loop of every scheduling attempt (nodes x pods): plain dict reads only.
    allocatable, requested = node.allocatable, node.requested
    reasons: list[str] = []
    for name, wanted in pod.requests.items():
        if wanted > allocatable.get(name, 0) - requested.get(name, 0):
            reasons.append("Too many pods" if name == PODS else f"Insufficient {name}")
    return reasons


def score_node(pod: PodSchedulingSpec, node: NodeInfo) -> float:
    """Upstream LeastAllocated over cpu and memory: the emptier node after binding wins."""
    allocatable, requested, wanted = node.allocatable, node.requested, pod.requests
    total = 0.0
    for name in (CPU, MEMORY):
        capacity = allocatable.get(name, 0)
        if capacity > 0:
            total += (capacity - requested.get(name, 0) - wanted.get(name, 0)) / capacity
    pods = allocatable.get(PODS, 0)
    if pods > 0:
        # A small pod-count term spreads request-less pods instead of piling them up.
        total += 0.01 * (pods - requested.get(PODS, 0)) / pods
    return total


@dataclass(frozen=True)
class Decision:
    """Where a pod goes, or why it goes nowhere."""

    node: str | None
    reasons: Counter[str]

    @property
    def scheduled(self) -> bool:
        return self.node is not None


def choose_node(pod: PodSchedulingSpec, nodes: Iterable[NodeInfo]) -> Decision:
    """The feasible node with the best score (ties broken by name), or the reasons per node."""
    best: NodeInfo | None = None
    best_score = 0.0
    reasons: Counter[str] = Counter()
    for node in nodes:
        rejected = filter_node(pod, node)
        if rejected:
            reasons.update(rejected)
            continue
        score = score_node(pod, node)
        if best is None or score > best_score or (score == best_score and node.name < best.name):
            best, best_score = node, score
    return Decision(node=best.name if best else None, reasons=reasons)


def unschedulable_message(total_nodes: int, reasons: Counter[str]) -> str:
    """The kube-scheduler `FailedScheduling` text: "0/3 nodes are available: 3 Too many pods."."""
    if not reasons:
        return f"0/{total_nodes} nodes are available: no nodes available to schedule pods."
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    return f"0/{total_nodes} nodes are available: {parts}."
