"""Builders of Kubernetes manifests and ResourceInterpreters for tests.

Shared by every package whose tests read user objects through the interpreters
(`flotilla.common.interpreters`). After Kubernetes
``pkg/scheduler/testing/wrappers.go``: a test names only what it is about
(``manifest("v1", "Pod", pod_spec(container(requests={"cpu": "1"})))``) and gets a
complete object.
"""

from __future__ import annotations

import copy
from typing import Any

from flotilla.common import api
from flotilla.common.api import PlacementState, ResourceInterpreter
from flotilla.common.events import ClusterPlacement, ObjectRef, PlacementDecided


def manifest(
    api_version: str,
    kind: str,
    spec: dict[str, Any] | None = None,
    *,
    name: str = "web",
    namespace: str | None = "shop",
    annotations: dict[str, str] | None = None,
    **top: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = annotations
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **top}
    if spec is not None:
        obj["spec"] = spec
    return obj


def container(name: str = "app", **resources: dict[str, Any]) -> dict[str, Any]:
    """A container; ``requests={...}`` / ``limits={...}`` become its resources."""
    return {"name": name, "image": f"{name}:1", "resources": resources}


def pod_spec(*containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"containers": list(containers) or [container()], **fields}


def template(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "web"}}, "spec": spec or pod_spec()}


def deployment(
    name: str = "web",
    namespace: str = "shop",
    *,
    replicas: int = 1,
    requests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Deployment whose selector and pod labels are its own (``app: <name>``), so
    several of them can share a namespace."""
    pods = {
        "metadata": {"labels": {"app": name}},
        "spec": pod_spec(container(requests=requests or {})),
    }
    spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": pods}
    return manifest("apps/v1", "Deployment", spec, name=name, namespace=namespace)


def rendered(
    obj: dict[str, Any], *, decision: str = "d1", hub_generation: int = 1
) -> dict[str, Any]:
    """`obj` marked as the transformer marks every object it renders for a member: the
    ``flotilla.io/origin`` label and the origin, decision and hub-generation annotations."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    namespace = meta.get("namespace") or "_"
    key = f"{out['apiVersion']}/{out['kind']}/{namespace}/{meta['name']}"
    meta.setdefault("labels", {})[api.ORIGIN_LABEL] = api.origin_label(key)
    meta.setdefault("annotations", {}).update(
        {
            api.ORIGIN_ANNOTATION: key,
            api.DECISION_ANNOTATION: decision,
            api.HUB_GENERATION_ANNOTATION: str(hub_generation),
        }
    )
    return out


# A multi-component workload: a FlinkDeployment with a job manager and task managers.
FLINK_INTERPRETER: dict[str, Any] = {
    "apiVersion": "flotilla.io/v1alpha1",
    "kind": "ResourceInterpreter",
    "metadata": {"name": "flink"},
    "spec": {
        "target": {"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment"},
        "strategy": "any",
        "replicas": {"path": ".spec.replicas"},
        "components": [
            {
                "name": "jobmanager",
                "replicasPath": ".spec.jobManager.replicas",
                "podTemplatePath": ".spec.jobManager.podTemplate",
            },
            {
                "name": "taskmanager",
                "replicasPath": ".spec.taskManager.replicas",
                "podTemplatePath": ".spec.taskManager.podTemplate",
            },
        ],
        "statusAggregation": [{"path": ".status.readyReplicas", "op": "sum"}],
        "dependencies": [
            {"path": ".spec.serviceAccount", "apiVersion": "v1", "kind": "ServiceAccount"}
        ],
    },
}


def resource_interpreter(name: str = "flink", **spec: Any) -> ResourceInterpreter:
    """The FlinkDeployment interpreter, renamed and with ``spec`` fields replaced."""
    body = copy.deepcopy(FLINK_INTERPRETER)
    body["metadata"]["name"] = name
    body["spec"].update(spec)
    return ResourceInterpreter.model_validate(body)


def decided(
    obj: dict[str, Any],
    *clusters: tuple[str, int | None, PlacementState],
    decision_id: str = "d1",
    reason: str = "",
) -> PlacementDecided:
    """The ``PlacementDecided`` a scheduler would publish for `obj` placed on
    ``(cluster, replicas, state)`` entries."""
    return PlacementDecided(
        ref=ObjectRef.of(obj),
        decision_id=decision_id,
        clusters=[ClusterPlacement(cluster=c, replicas=n, state=s) for c, n, s in clusters],
        reason=reason,
    )
