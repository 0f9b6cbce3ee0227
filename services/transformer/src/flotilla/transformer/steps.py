"""The sync pipeline: the small steps that turn a hub object into a member manifest.

Each step is a function registered by name in `PIPELINE` (a duplicate name is an
error) and runs, in registration order, on the working copy of one work's
manifest with the facts of that work (`Work`): which hub object it comes from,
the cluster it goes to, the decision, the replicas and the transformations.
A step that cannot do its part raises `RenderError`, which fails that one work.

The manifest the steps edit is already the cluster's own copy, with its share of
a split object's replicas (`flotilla.transformer.rendering.render`). Steps, in order:

* ``strip-server-fields`` — what the hub's API server owns and a member's must set
  itself (uid, resourceVersion, status, a Service's cluster IPs, a Job's selector …);
* ``transformations`` — the Transformations that target the cluster, in order
  (`flotilla.transformer.transformations`);
* ``origin`` — the ``flotilla.io/origin`` label and annotation, the decision id and
  the hub generation the manifest was rendered from (the syncer touches no
  member object without that label);
* ``namespace-mapping`` — a cluster labelled ``flotilla.io/namespace-prefix: <p>``
  gets every namespace as ``<p><namespace>`` (the object's, a Namespace's own
  name, RoleBinding subjects'); the result must still be a valid namespace name;
* ``security-defaults`` — a cluster labelled ``flotilla.io/security-defaults:
  restricted`` gets the restricted Pod Security defaults filled in where the pod
  or container leaves them unset: runAsNonRoot, seccomp RuntimeDefault,
  allowPrivilegeEscalation false, and ALL capabilities dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flotilla.common import api
from flotilla.common.api import GroupVersionKind
from flotilla.common.events import ObjectRef
from flotilla.common.interpreters import Interpreter
from flotilla.transformer import transformations
from flotilla.transformer.transformations import NamedTransformation, RenderError

JsonObject = dict[str, Any]

NAMESPACE_PREFIX_LABEL = "flotilla.io/namespace-prefix"
SECURITY_DEFAULTS_LABEL = "flotilla.io/security-defaults"
RESTRICTED = "restricted"

HUB_ONLY_ANNOTATIONS = (
    "flotilla.io/placement",
    "flotilla.io/cluster-status",
    "flotilla.io/failover-history",
    "kubectl.kubernetes.io/last-applied-configuration",
)
"""Annotations about the hub copy (written there by Flotilla or kubectl), which
would only make every status change re-render every member copy."""

SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "managedFields",
    "creationTimestamp",
    "generation",
    "ownerReferences",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
JOB_LABELS = (
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
)
"""Labels the Job controller stamps on a Job and its pod template from its uid."""

MAX_NAMESPACE = 63
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class ClusterFacts:
    """What rendering reads about a member cluster."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    api_resources: frozenset[GroupVersionKind] = frozenset()
    """Empty when the cluster has not reported its API resources yet."""


@dataclass(frozen=True)
class Work:
    """The facts one work is rendered from (besides the object itself)."""

    ref: ObjectRef
    cluster: ClusterFacts
    decision_id: str
    interpreter: Interpreter
    hub_generation: int | None = None
    replicas: int | None = None
    transformations: tuple[NamedTransformation, ...] = ()


Step = Callable[[JsonObject, Work], JsonObject]


class Pipeline:
    """Steps by name, run in registration order; registering a name twice is an error."""

    def __init__(self) -> None:
        self._steps: dict[str, Step] = {}

    def register(self, name: str) -> Callable[[Step], Step]:
        def add(step: Step) -> Step:
            if name in self._steps:
                raise ValueError(f"pipeline step {name!r} is already registered")
            self._steps[name] = step
            return step

        return add

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._steps)

    def run(self, manifest: JsonObject, work: Work) -> JsonObject:
        """`manifest` through every step; the caller hands over a copy it owns."""
        for step in self._steps.values():
            manifest = step(manifest, work)
        return manifest


PIPELINE = Pipeline()


def _map(parent: JsonObject, name: str) -> JsonObject:
    value = parent.get(name)
    if not isinstance(value, dict):
        value = {}
        parent[name] = value
    return value


def _dicts(value: Any) -> Iterator[JsonObject]:
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, dict))


@PIPELINE.register("strip-server-fields")
def strip_server_fields(manifest: JsonObject, work: Work) -> JsonObject:
    manifest.pop("status", None)
    metadata = _map(manifest, "metadata")
    for name in SERVER_METADATA:
        metadata.pop(name, None)
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        for name in HUB_ONLY_ANNOTATIONS:
            annotations.pop(name, None)
        if not annotations:
            metadata.pop("annotations")
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        return manifest
    group = GroupVersionKind.from_api_version(str(manifest.get("apiVersion", "")), "").group
    kind = manifest.get("kind")
    if kind == "Service" and group == "":
        # "None" is the user's choice of a headless Service, not an allocated address.
        if spec.get("clusterIP") != "None":
            spec.pop("clusterIP", None)
            spec.pop("clusterIPs", None)
        for port in _dicts(spec.get("ports")):
            port.pop("nodePort", None)
    elif kind == "PersistentVolumeClaim" and group == "":
        spec.pop("volumeName", None)
    elif kind == "Job" and group == "batch":
        # A generated selector names the hub Job's uid; a manual one is the user's.
        if not spec.get("manualSelector"):
            spec.pop("selector", None)
        _drop_labels(metadata)
        template = spec.get("template")
        if isinstance(template, dict) and isinstance(template.get("metadata"), dict):
            _drop_labels(template["metadata"])
    return manifest


def _drop_labels(metadata: JsonObject) -> None:
    labels = metadata.get("labels")
    if isinstance(labels, dict):
        for name in JOB_LABELS:
            labels.pop(name, None)
        if not labels:
            metadata.pop("labels")


@PIPELINE.register("transformations")
def transform(manifest: JsonObject, work: Work) -> JsonObject:
    return transformations.apply_all(manifest, work.transformations, work.cluster)


@PIPELINE.register("origin")
def origin(manifest: JsonObject, work: Work) -> JsonObject:
    metadata = _map(manifest, "metadata")
    _map(metadata, "labels")[api.ORIGIN_LABEL] = api.origin_label(work.ref.key)
    annotations = _map(metadata, "annotations")
    annotations[api.ORIGIN_ANNOTATION] = work.ref.key
    annotations[api.DECISION_ANNOTATION] = work.decision_id
    if work.hub_generation is not None:
        annotations[api.HUB_GENERATION_ANNOTATION] = str(work.hub_generation)
    else:
        annotations.pop(api.HUB_GENERATION_ANNOTATION, None)
    return manifest


def _prefixed(prefix: str, namespace: str, cluster: str) -> str:
    mapped = prefix + namespace
    if len(mapped) > MAX_NAMESPACE or not _NAMESPACE.fullmatch(mapped):
        raise RenderError(
            "NamespaceMapping",
            f"cluster {cluster}: {NAMESPACE_PREFIX_LABEL}={prefix!r} maps namespace "
            f"{namespace!r} to {mapped!r}, which is not a valid namespace name",
        )
    return mapped


@PIPELINE.register("namespace-mapping")
def namespace_mapping(manifest: JsonObject, work: Work) -> JsonObject:
    prefix = work.cluster.labels.get(NAMESPACE_PREFIX_LABEL)
    if not prefix:
        return manifest
    metadata = _map(manifest, "metadata")
    cluster = work.cluster.name
    if manifest.get("kind") == "Namespace" and manifest.get("apiVersion") == "v1":
        metadata["name"] = _prefixed(prefix, str(metadata.get("name", "")), cluster)
    namespace = metadata.get("namespace")
    if isinstance(namespace, str) and namespace:
        metadata["namespace"] = _prefixed(prefix, namespace, cluster)
    if manifest.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
        for subject in _dicts(manifest.get("subjects")):
            if isinstance(subject.get("namespace"), str) and subject["namespace"]:
                subject["namespace"] = _prefixed(prefix, subject["namespace"], cluster)
    return manifest


@PIPELINE.register("security-defaults")
def security_defaults(manifest: JsonObject, work: Work) -> JsonObject:
    if work.cluster.labels.get(SECURITY_DEFAULTS_LABEL) != RESTRICTED:
        return manifest
    for _, pod_spec in work.interpreter.pod_specs(manifest):
        if not isinstance(pod_spec, dict):
            continue
        pod_context = _map(pod_spec, "securityContext")
        pod_context.setdefault("runAsNonRoot", True)
        pod_context.setdefault("seccompProfile", {"type": "RuntimeDefault"})
        for name in ("initContainers", "containers", "ephemeralContainers"):
            for container in _dicts(pod_spec.get(name)):
                context = _map(container, "securityContext")
                context.setdefault("allowPrivilegeEscalation", False)
                capabilities = _map(context, "capabilities")
                drop = capabilities.get("drop")
                drop = list(drop) if isinstance(drop, list) else []
                if "ALL" not in drop:
                    drop.append("ALL")
                capabilities["drop"] = drop
    return manifest
