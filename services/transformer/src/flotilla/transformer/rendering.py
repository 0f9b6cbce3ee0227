"""The transformer's pure core: a decision and an analysis in, manifests out.

For one placed object it renders one manifest per cluster of its decision
(`render_placement`), and for each of its ``as-needed`` dependencies one per
cluster the object runs on (`render_dependency`), each through the sync pipeline
(`flotilla.transformer.steps`). A cluster that does not serve the object's type
(its reported ``apiResources`` lack the group/version/kind; a cluster that has
reported none yet is not judged) gets no work and a `Failure` saying so, like a
failed transformation; the other clusters are rendered all the same.

Which dependents need a dependency on which cluster is cross-object state; how
one object's change moves it is `dependents_after` (the service keeps it in a
store bucket and writes it by compare-and-set).

Rendering is deterministic: the same inputs give the same manifest, byte for byte
in `canonical` form, which is what `digest` (part of each work's event id) and a
replay compare.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from flotilla.common.api import GroupVersionKind, ResourceInterpreterSpec, Strategy
from flotilla.common.api import PlacementState as WorkState
from flotilla.common.events import ObjectRef, PlacementDecided, ResourceAnalyzed
from flotilla.common.interpreters import InterpretationError, Interpreter, Registry
from flotilla.transformer.steps import PIPELINE, ClusterFacts, Work
from flotilla.transformer.transformations import NamedTransformation, RenderError, copy_json

JsonObject = dict[str, Any]

BUILTINS = Registry.with_builtins()

INSTALL_ORDER = (
    "Namespace",
    "ResourceQuota",
    "LimitRange",
    "PriorityClass",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
)
"""Kinds a member needs before what refers to them (Helm's install order); other
kinds come after these."""


@dataclass(frozen=True)
class Rendered:
    """One work: `manifest` for `ref` on `cluster`."""

    ref: ObjectRef
    cluster: str
    manifest: JsonObject
    state: WorkState = WorkState.ACTIVE

    @property
    def digest(self) -> str:
        return digest(self.manifest)


@dataclass(frozen=True)
class Failure:
    """A work that could not be rendered, and why (for a Warning Event)."""

    cluster: str
    reason: str
    message: str


def canonical(manifest: Mapping[str, Any]) -> bytes:
    """The manifest as compact JSON with sorted keys: equal manifests, equal bytes."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(manifest)).hexdigest()[:32]


@functools.lru_cache(maxsize=256)
def _compiled(spec_json: str) -> Interpreter:
    spec = ResourceInterpreterSpec.model_validate_json(spec_json)
    return Interpreter.compile(spec, "analysis")


def interpreter_of(analyzed: ResourceAnalyzed) -> Interpreter:
    """The interpreter the object was analysed with (a built-in one for producers
    that did not carry it)."""
    if analyzed.interpreter is None:
        return BUILTINS.for_object(analyzed.object)
    return _compiled(analyzed.interpreter.model_dump_json(by_alias=True))


def is_as_needed(obj: Mapping[str, Any]) -> bool:
    """Whether a dependency goes along with its dependents (rather than being placed
    by itself): its type's strategy, or its own ``flotilla.io/strategy``."""
    try:
        return BUILTINS.interpret(obj).strategy is Strategy.AS_NEEDED
    except InterpretationError:
        return False


def hub_generation(obj: Mapping[str, Any]) -> int | None:
    metadata = obj.get("metadata")
    generation = metadata.get("generation") if isinstance(metadata, Mapping) else None
    return generation if isinstance(generation, int) else None


def render(obj: Mapping[str, Any], work: Work) -> JsonObject:
    """One manifest: `obj` through the pipeline for `work`; `RenderError` when the
    cluster does not serve its type or a step fails."""
    gvk = GroupVersionKind.from_api_version(str(obj.get("apiVersion", "")), str(obj.get("kind")))
    if not serves(work.cluster, gvk):
        raise RenderError(
            "IncompatibleCluster",
            f"cluster {work.cluster.name} does not serve {gvk}; no work is sent there",
        )
    return PIPELINE.run(working_copy(obj, work), work)


def working_copy(obj: Mapping[str, Any], work: Work) -> JsonObject:
    """The cluster's own copy of `obj`, with its share of the replicas when it has one
    (`Interpreter.with_replicas` copies anyway, so the object is copied only once)."""
    if work.replicas is None or work.interpreter.replicas is None:
        copied: JsonObject = copy_json(dict(obj))
        return copied
    try:
        return work.interpreter.with_replicas(obj, work.replicas)
    except InterpretationError as exc:
        raise RenderError("InvalidObject", str(exc)) from None


def serves(cluster: ClusterFacts, gvk: GroupVersionKind) -> bool:
    """Whether `cluster` serves `gvk` (yes while it has reported no API resources)."""
    return not cluster.api_resources or gvk in cluster.api_resources


def incompatible(
    gvk: GroupVersionKind, clusters: Mapping[str, ClusterFacts], names: Iterable[str]
) -> list[str]:
    """Those of `names` that are known not to serve `gvk`, sorted."""
    return sorted(n for n in names if n in clusters and not serves(clusters[n], gvk))


def facts(clusters: Mapping[str, ClusterFacts], name: str) -> ClusterFacts:
    """A cluster's facts, or none known (no labels, API resources not reported)."""
    return clusters.get(name) or ClusterFacts(name)


def render_placement(
    analyzed: ResourceAnalyzed,
    decision: PlacementDecided,
    clusters: Mapping[str, ClusterFacts],
    chosen: tuple[NamedTransformation, ...] = (),
) -> tuple[list[Rendered], list[Failure]]:
    """The object's own work on every cluster of `decision` (Retiring ones keep
    theirs, marked Retiring), and the clusters that could not get one."""
    interpreter = interpreter_of(analyzed)
    rendered: list[Rendered] = []
    failed: list[Failure] = []
    for placement in sorted(decision.clusters, key=lambda p: p.cluster):
        work = Work(
            ref=analyzed.ref,
            cluster=facts(clusters, placement.cluster),
            decision_id=decision.decision_id,
            interpreter=interpreter,
            hub_generation=hub_generation(analyzed.object),
            replicas=placement.replicas,
            transformations=chosen,
        )
        try:
            manifest = render(analyzed.object, work)
        except RenderError as exc:
            failed.append(Failure(placement.cluster, exc.reason, exc.message))
            continue
        rendered.append(Rendered(analyzed.ref, placement.cluster, manifest, placement.state))
    return rendered, failed


def render_dependency(
    dependency: Mapping[str, Any], cluster: ClusterFacts, decision_id: str
) -> JsonObject:
    """An ``as-needed`` dependency's manifest for one cluster (no replicas, no
    transformations: those belong to the objects that are placed)."""
    ref = ObjectRef.of(dict(dependency))
    work = Work(
        ref=ref,
        cluster=cluster,
        decision_id=decision_id,
        interpreter=BUILTINS.for_object(dependency),
        hub_generation=hub_generation(dependency),
    )
    return render(dependency, work)


def install_rank(ref: ObjectRef) -> tuple[int, str]:
    """Sort key putting what others need first (Namespace first), then by key."""
    rank = INSTALL_ORDER.index(ref.kind) if ref.kind in INSTALL_ORDER else len(INSTALL_ORDER)
    return rank, ref.key


def needed_clusters(decision: PlacementDecided | None) -> Set[str]:
    """Where an object's dependencies are needed: every cluster it is on, Retiring too."""
    return frozenset(p.cluster for p in decision.clusters) if decision else frozenset()


def dependents_after(
    current: Mapping[str, Sequence[ObjectRef]], dependent: ObjectRef, needed_on: Iterable[str]
) -> dict[str, list[ObjectRef]]:
    """Cluster → the objects needing a dependency there, after `dependent` needs it
    exactly on `needed_on`; clusters nobody needs it on are left out."""
    needed = set(needed_on)
    result: dict[str, list[ObjectRef]] = {}
    for cluster in sorted(set(current) | needed):
        others = [ref for ref in current.get(cluster, ()) if ref.key != dependent.key]
        if cluster in needed:
            others.append(dependent)
        if others:
            result[cluster] = sorted(others, key=lambda ref: ref.key)
    return result
