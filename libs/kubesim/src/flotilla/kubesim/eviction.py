"""The `pods/eviction` subresource: delete a pod unless a PodDisruptionBudget forbids it.

`kubectl drain` evicts instead of deleting so that PodDisruptionBudgets hold; this
follows upstream's eviction REST handler (`pkg/registry/core/pod/storage/eviction.go`):
pods that are not running, already terminating or whose budget allows a disruption
are deleted; otherwise the answer is 429 TooManyRequests with upstream's message and
a `DisruptionBudget` cause, which drain turns into "will retry after 5s". Each allowed
eviction spends one of the budget's `disruptionsAllowed` and records the pod in
`status.disruptedPods` until the disruption controller (in the simulator) recounts.

It lives beside the store rather than in the simulator because a hub, which has no
simulator, serves the subresource too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from flotilla.kubesim.errors import ApiError, bad_request
from flotilla.kubesim.resources import ResourceType
from flotilla.kubesim.selectors import labels_of, parse_label_selector, selector_from_label_selector
from flotilla.kubesim.store import Store

TOO_MANY_REQUESTS = "Cannot evict pod as it would violate the pod's disruption budget."
EVICTION_KINDS = frozenset({("policy/v1", "Eviction"), ("policy/v1beta1", "Eviction")})
# The `pods/eviction` discovery entry kubectl drain looks for before it evicts.
DISCOVERY: dict[str, Any] = {
    "name": "pods/eviction",
    "singularName": "",
    "namespaced": True,
    "group": "policy",
    "version": "v1",
    "kind": "Eviction",
    "verbs": ["create"],
}


def _ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """policy/v1 semantics: an empty selector selects every pod, a missing one none."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    matcher = parse_label_selector(selector_from_label_selector(selector))
    return matcher is None or matcher(labels_of(pod))


def _budget_error(pdb: Mapping[str, Any], cause: str) -> ApiError:
    name = pdb["metadata"]["name"]
    return ApiError(
        429,
        "TooManyRequests",
        TOO_MANY_REQUESTS,
        {"causes": [{"reason": "DisruptionBudget", "message": cause.format(name=name)}]},
    )


def evict(
    store: Store,
    pod_rt: ResourceType,
    pdb_rt: ResourceType,
    namespace: str,
    name: str,
    body: Any,
) -> dict[str, Any]:
    """Evict one pod; returns the `Success` Status upstream answers with (201)."""
    if not isinstance(body, dict) or (body.get("apiVersion"), body.get("kind")) not in (
        EVICTION_KINDS
    ):
        raise bad_request("the request body must be a policy/v1 Eviction")
    meta = body.get("metadata") or {}
    if meta.get("name") not in (None, "", name):
        raise bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    pod = store.get_frozen(pod_rt, namespace, name)
    phase = (pod.get("status") or {}).get("phase")
    exempt = phase in ("Succeeded", "Failed", "Pending") or bool(
        pod["metadata"].get("deletionTimestamp")
    )
    if not exempt:
        _spend_budget(store, pdb_rt, namespace, pod)
    preconditions = options.get("preconditions")
    store.delete(
        pod_rt,
        namespace,
        name,
        propagation=str(options.get("propagationPolicy") or "Background"),
        preconditions=preconditions if isinstance(preconditions, dict) else None,
    )
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _spend_budget(store: Store, pdb_rt: ResourceType, namespace: str, pod: dict[str, Any]) -> None:
    if pdb_rt not in store.registry:
        return
    budgets, _ = store.list_frozen(pdb_rt, namespace)
    matching = [pdb for pdb in budgets if selects(pdb, pod)]
    if not matching:
        return
    if len(matching) > 1:
        raise ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support.",
        )
    pdb = matching[0]
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation") or 1):
        raise _budget_error(
            pdb, "The disruption budget {name} is still being processed by the server."
        )
    healthy, desired = (
        int(status.get("currentHealthy") or 0),
        int(status.get("desiredHealthy") or 0),
    )
    if not _ready(pod):
        policy = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if policy == "AlwaysAllow" or (healthy >= desired and desired > 0):
            return  # evicting a pod that is not healthy costs the budget nothing
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise ApiError(403, "Forbidden", "pdb disruptions allowed is negative")
    if allowed == 0:
        raise _budget_error(
            pdb,
            f"The disruption budget {{name}} needs {desired} healthy pods and has {healthy} "
            "currently",
        )
    disrupted = dict(status.get("disruptedPods") or {})
    disrupted[pod["metadata"]["name"]] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    store.update(
        pdb_rt,
        {
            "metadata": {
                "name": pdb["metadata"]["name"],
                "namespace": namespace,
                "resourceVersion": pdb["metadata"]["resourceVersion"],
            },
            "status": {**status, "disruptionsAllowed": allowed - 1, "disruptedPods": disrupted},
        },
        subresource="status",
    )
