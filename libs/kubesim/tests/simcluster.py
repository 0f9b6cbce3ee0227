"""A Store plus a started Simulator, shared by the simulator tests (fixtures in conftest)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from flotilla.kubesim.sim import Simulator
from flotilla.kubesim.store import Store

FAST: dict[str, Any] = {"pod_ready_seconds": 0.05, "job_seconds": 0.05}


async def eventually(condition: Callable[[], Any], within: float = 5.0) -> Any:
    """Poll `condition` until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.01)


class Cluster:
    """A Store plus a started Simulator, with shortcuts the tests read well with."""

    def __init__(self, store: Store, sim: Simulator) -> None:
        self.store = store
        self.sim = sim

    def rt(self, kind: str) -> Any:
        api = {
            "Deployment": "apps/v1",
            "ReplicaSet": "apps/v1",
            "StatefulSet": "apps/v1",
            "DaemonSet": "apps/v1",
            "Job": "batch/v1",
            "CronJob": "batch/v1",
            "PodDisruptionBudget": "policy/v1",
            "Lease": "coordination.k8s.io/v1",
        }
        return self.store.resource_type(api.get(kind, "v1"), kind)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.create(self.rt(obj["kind"]), obj)

    def get(self, kind: str, name: str, namespace: str | None = "default") -> dict[str, Any]:
        return self.store.get(self.rt(kind), namespace, name)

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return dict(self.get(kind, name).get("status") or {})

    def pods(self, phase: str | None = None) -> list[dict[str, Any]]:
        items, _ = self.store.list(self.rt("Pod"), "default")
        return [p for p in items if phase is None or p["status"].get("phase") == phase]

    def update_spec(self, kind: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        obj = self.get(kind, name, None if kind == "Node" else "default")
        change(obj)
        self.store.update(self.rt(kind), obj)


def container(cpu: str = "100m", memory: str = "64Mi", **extra: str) -> dict[str, Any]:
    return {
        "name": "app",
        "image": "nginx:1.27",
        "resources": {"requests": {"cpu": cpu, "memory": memory, **extra}},
    }


def template(app: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [container()])
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def deployment(name: str = "web", replicas: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name, **spec),
        },
    }


def bare_pod(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [container()])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind)
