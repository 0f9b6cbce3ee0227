"""Transformations: per-cluster patches named by a policy or an object's annotation.

An object names its transformations in its policy's ``transformations`` and in
its ``flotilla.io/transformations`` annotation; the policy's come first, then the
annotation's, a name named twice once (`names`). A name is a ``Transformation`` in
the object's namespace, else a ``ClusterTransformation`` of that name (`resolve`),
so a team can shadow a fleet-wide one in its own namespace.

Each rule of a transformation targets clusters by name (``targetClusters``) or by
a label selector over the `Cluster` labels (``targetSelector``) and is applied in
order with its patch type: ``strategic`` (Kubernetes strategic merge patch),
``merge`` (RFC 7386) or ``json`` (RFC 6902), all from `flotilla.common.patches`.
A patch that fails, or that changes the object's apiVersion, kind, name or
namespace, raises `RenderError` naming the transformation and the cluster: that
one work fails, every other cluster's goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flotilla.common import labels, patches
from flotilla.common.api import (
    TRANSFORMATIONS_ANNOTATION,
    PatchType,
    PlacementPolicySpec,
    TransformationRule,
    TransformationSpec,
    parse_transformations,
)

if TYPE_CHECKING:
    from flotilla.transformer.steps import ClusterFacts

JsonObject = dict[str, Any]

TRANSFORMATION = "Transformation"
CLUSTER_TRANSFORMATION = "ClusterTransformation"


class RenderError(Exception):
    """One work cannot be rendered; `reason` is the Warning Event's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class NamedTransformation:
    kind: str
    name: str
    spec: TransformationSpec

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


Catalog = Mapping[tuple[str, str | None, str], TransformationSpec]
"""(kind, namespace or None, name) → spec: the transformations the hub holds."""


def names(obj: Mapping[str, Any], policy: PlacementPolicySpec | None) -> list[str]:
    """The transformation names for ``obj``, in the order they apply."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    annotated = (
        annotations.get(TRANSFORMATIONS_ANNOTATION) if isinstance(annotations, Mapping) else None
    )
    named = list(policy.transformations) if policy is not None else []
    if isinstance(annotated, str):
        named += parse_transformations(annotated)
    return list(dict.fromkeys(named))


def resolve(
    wanted: Sequence[str], namespace: str | None, catalog: Catalog
) -> tuple[tuple[NamedTransformation, ...], list[str]]:
    """The transformations `wanted` names (namespace first, then cluster-wide) and
    the names nothing answers to."""
    found: list[NamedTransformation] = []
    missing: list[str] = []
    for name in wanted:
        spec = catalog.get((TRANSFORMATION, namespace, name)) if namespace else None
        if spec is not None:
            found.append(NamedTransformation(TRANSFORMATION, name, spec))
            continue
        spec = catalog.get((CLUSTER_TRANSFORMATION, None, name))
        if spec is not None:
            found.append(NamedTransformation(CLUSTER_TRANSFORMATION, name, spec))
        else:
            missing.append(name)
    return tuple(found), missing


def targets(rule: TransformationRule, cluster: ClusterFacts) -> bool:
    if rule.target_clusters is not None:
        return cluster.name in rule.target_clusters
    return labels.matches(rule.target_selector, cluster.labels)


def _identity(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return (
        obj.get("apiVersion"),
        obj.get("kind"),
        metadata.get("name"),
        metadata.get("namespace") or None,
    )


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (several times faster than `copy.deepcopy`)."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value


def patched(manifest: JsonObject, rule: TransformationRule) -> Any:
    """`manifest` with one rule's patch applied; `PatchError` on failure (the
    manifest, edited in place by a JSON patch, is then to be discarded).

    The result may share values with `manifest` (the caller's own working copy) but
    never with the rule: later steps edit the manifest in place, which must not
    reach into a transformation shared by every render."""
    patch = copy_json(rule.patch)
    match rule.patch_type:
        case PatchType.STRATEGIC:
            return patches.strategic_merge_patch(manifest, patch)
        case PatchType.MERGE:
            return patches.merge_patch(manifest, patch)
        case PatchType.JSON:
            return patches.json_patch(manifest, patch, in_place=True)


def apply_all(
    manifest: JsonObject, chosen: Sequence[NamedTransformation], cluster: ClusterFacts
) -> JsonObject:
    """Every rule of `chosen` that targets `cluster`, in order."""
    before = _identity(manifest)
    for transformation in chosen:
        for index, rule in enumerate(transformation.spec.transformations):
            if not targets(rule, cluster):
                continue
            where = f"{transformation} (rule {index}) on cluster {cluster.name}"
            try:
                result = patched(manifest, rule)
            except patches.PatchError as exc:
                raise RenderError("TransformationFailed", f"{where}: {exc}") from None
            if not isinstance(result, dict):
                raise RenderError(
                    "TransformationFailed",
                    f"{where}: the patch replaced the object with a non-object",
                )
            if _identity(result) != before:
                raise RenderError(
                    "TransformationFailed",
                    f"{where}: the patch changes apiVersion, kind, name or namespace, "
                    "which a transformation may not",
                )
            manifest = result
    return manifest
