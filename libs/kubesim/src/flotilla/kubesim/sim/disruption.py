"""The disruption controller: PodDisruptionBudget status, which evictions are checked against.

Like upstream's (`pkg/controller/disruption`), it counts the pods a budget selects,
works out how many must stay healthy (`minAvailable`, or the controllers' scale minus
`maxUnavailable`), and writes `currentHealthy`, `desiredHealthy`, `expectedPods`,
`disruptionsAllowed` and the `DisruptionAllowed` condition. Pods an eviction just
took (`status.disruptedPods`) count as unhealthy until they are gone or two minutes
have passed, so two quick evictions cannot both spend the same disruption.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.kubesim.selectors import parse_label_selector, selector_from_label_selector
from flotilla.kubesim.sim.controllers import Context, set_condition, write_status
from flotilla.kubesim.sim.state import Key, PodRecord, controller_ref

# Upstream's DeletionTimeout: how long an evicted pod may take to disappear.
DISRUPTED_POD_TIMEOUT = timedelta(minutes=2)
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def _scaled(value: Any, total: int) -> int:
    """An IntOrString against `total`, percentages rounded up (upstream's choice here)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


class DisruptionController:
    """Keeps every PodDisruptionBudget's status current as its pods come and go."""

    kind = "PodDisruptionBudget"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rt = ctx.types[self.kind]

    def budgets_in(self, namespace: str) -> list[Key]:
        """Budgets to recount when a pod of `namespace` changes."""
        return [key for key in self.ctx.state.cache(self.kind).objects if key[0] == namespace]

    def reconcile(self, key: Key) -> None:
        pdb = self.ctx.state.cache(self.kind).get(key)
        if pdb is None:
            return
        spec = pdb.get("spec") or {}
        previous = pdb.get("status") or {}
        selector = spec.get("selector")
        matcher = parse_label_selector(selector_from_label_selector(selector)) if selector else None
        pods = [
            record
            for record in self.ctx.state.pods.values()
            if record.namespace == key[0]
            and selector is not None
            and (matcher is None or matcher(record.labels))
            and record.phase not in ("Succeeded", "Failed")
        ]
        now = datetime.now(UTC)
        disrupted = self._still_disrupted(previous.get("disruptedPods") or {}, pods, now, key)
        expected, desired = self._expectation(spec, pods)
        healthy = sum(1 for p in pods if p.ready and not p.deleting and p.name not in disrupted)
        allowed = max(healthy - desired, 0)
        status: dict[str, Any] = {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        sufficient = allowed > 0
        conditions = set_condition(
            list(previous.get("conditions") or []),
            "DisruptionAllowed",
            "True" if sufficient else "False",
            "SufficientPods" if sufficient else "InsufficientPods",
            "",
        )
        for condition in conditions:
            condition.pop("lastUpdateTime", None)
            condition["observedGeneration"] = status["observedGeneration"]
        status["conditions"] = conditions
        write_status(self.ctx.store, self.rt, pdb, status)

    def _still_disrupted(
        self, disrupted: dict[str, str], pods: list[PodRecord], now: datetime, key: Key
    ) -> dict[str, str]:
        alive = {p.name for p in pods if not p.deleting}
        kept: dict[str, str] = {}
        for name, stamp in disrupted.items():
            try:
                since = datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC)
            except (TypeError, ValueError):
                continue
            expires = since + DISRUPTED_POD_TIMEOUT
            if name in alive and expires > now:
                kept[name] = stamp
                self.ctx.requeue(self.kind, key, (expires - now).total_seconds())
        return kept

    def _expectation(self, spec: dict[str, Any], pods: list[PodRecord]) -> tuple[int, int]:
        """(expectedPods, desiredHealthy) the way upstream derives them."""
        min_available = spec.get("minAvailable")
        max_unavailable = spec.get("maxUnavailable")
        if isinstance(min_available, int):
            return len(pods), min_available
        expected = self._controllers_scale(pods)
        if max_unavailable is not None:
            return expected, max(expected - _scaled(max_unavailable, expected), 0)
        if min_available is not None:
            return expected, _scaled(min_available, expected)
        return len(pods), 0

    def _controllers_scale(self, pods: list[PodRecord]) -> int:
        """Sum of `spec.replicas` of the pods' controllers (a Deployment's, not its RS's)."""
        seen: dict[tuple[str, str], int] = {}
        uncontrolled = 0
        for record in pods:
            if record.owner_kind is None or record.owner_name is None:
                uncontrolled += 1
                continue
            kind, name = record.owner_kind, record.owner_name
            owner = self.ctx.state.cache(kind).get((record.namespace, name))
            if owner is not None and kind == "ReplicaSet":
                ref = controller_ref(owner)
                if ref and ref.get("kind") == "Deployment":
                    parent = self.ctx.state.cache("Deployment").get((record.namespace, ref["name"]))
                    if parent is not None:
                        kind, name, owner = "Deployment", ref["name"], parent
            if owner is None:
                uncontrolled += 1
                continue
            replicas = (owner.get("spec") or {}).get("replicas")
            seen[(kind, name)] = 1 if replicas is None else int(replicas)
        return sum(seen.values()) + uncontrolled
