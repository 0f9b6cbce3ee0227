"""Which other objects an object needs on every cluster it runs on.

An object placed on a member cluster only works there if what it refers to is
there too: its ServiceAccount, the ConfigMaps and Secrets it mounts or reads,
its PersistentVolumeClaims, pull secrets, owners, and whatever a CRD author
declared. The detector finds these and writes them, together with the user's own
entries, into the ``flotilla.io/dependencies`` annotation; the transformer then
syncs each ``as-needed`` dependency to exactly the clusters that need it.

Detection knows no kinds itself; the interpreter tells it where pod specs and
declared dependency paths are. Sources, in the order they are checked:

1. every PodSpec the interpreter points at: ``serviceAccountName``, ``volumes``
   (configMap, secret, persistentVolumeClaim, projected sources, azureFile; the
   other volume types' ``secretRef``/``nodePublishSecretRef`` fall under 4),
   ``envFrom``/``env[].valueFrom`` of every container kind, ``imagePullSecrets``;
2. ``metadata.ownerReferences``;
3. the interpreter's ``dependencies`` paths;
4. generic heuristics over the rest of the object (``status`` and ``metadata``
   excluded: status reports what is, not what is wanted):

   * a mapping with string ``apiVersion``, ``kind`` and ``name`` is a reference to
     that object (``namespace`` taken from the mapping when present);
   * a mapping under a key that is ``secretRef``/``secretKeyRef`` or ends in
     ``SecretRef``/``SecretKeyRef`` names a Secret, likewise ``configMapRef``/
     ``configMapKeyRef``/``…ConfigMapRef`` a ConfigMap — when it has a string
     ``name`` and no ``kind`` of its own;
   * a string under exactly ``serviceAccountName`` names a ServiceAccount and
     under exactly ``claimName`` a PersistentVolumeClaim.

   The rule is deliberately narrow. Fields such as ``secretName`` are left out:
   they are as often an *output* (cert-manager writes the Secret named in
   ``Certificate.spec.secretName``) as an input, and a false dependency would
   sync a stale copy over the real one. ``{apiGroup, kind, name}`` references
   (TypedLocalObjectReference) are left out because they carry no version; an
   interpreter can declare them with a path.

A reference without a namespace gets the object's namespace unless its kind is a
well-known cluster-scoped kind. The object's own Namespace is not listed: every
namespaced object needs it, so ensuring it on a member belongs to whatever applies
work there, not to each object's dependency list.

Scope (`refusal`, `within_scope`): a dependency is copied to member clusters with
the object, so an object may only depend on what its author could reference in
Kubernetes itself; otherwise anyone allowed to write a Deployment in namespace
``bad`` could have another namespace's Secrets — or the kubeconfigs of the member
clusters in Flotilla's own namespace — synced next to it. The rule:

* a namespaced object's namespaced dependencies are in its own namespace;
* a cluster-scoped dependency is allowed only for the kinds in
  `CLUSTER_SCOPED_ALLOWED`, which hold nothing secret and which workloads
  reference by name — ``Namespace`` (a namespaced object: only its own),
  ``PriorityClass``, ``StorageClass``, ``IngressClass``, ``RuntimeClass``, and
  ``ClusterRole`` for a ``RoleBinding`` or ``ClusterRoleBinding`` (its
  ``roleRef``);
* a cluster-scoped object may depend on namespaced objects in any namespace
  (a ``ClusterIssuer`` naming a Secret): only cluster administrators write those;
* nothing in Flotilla's own namespace (the ``system_namespace`` setting) is ever a
  dependency, not even of a cluster-scoped object, nor that Namespace itself.

A refused reference is left out of the analysis (so nothing syncs it) and named
in a Warning Event; the user's own entries stay in the annotation as written.

The annotation value must be byte-identical when nothing changed, or every
detector run would write the object and wake every watcher: user entries keep
their order, detected entries are sorted, duplicates are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flotilla.common import paths
from flotilla.common.api import (
    DEPENDENCIES_ANNOTATION,
    DependencyEntry,
    dump_dependencies,
    parse_dependencies,
)
from flotilla.common.interpreters import Interpreter

CLUSTER_SCOPED_KINDS = frozenset(
    {
        "APIService",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "IngressClass",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "PersistentVolume",
        "PriorityClass",
        "RuntimeClass",
        "StorageClass",
        "ValidatingWebhookConfiguration",
        "VolumeAttachment",
    }
)
"""Kinds whose references never get a namespace (core and well-known cluster types)."""

CLUSTER_SCOPED_ALLOWED = frozenset(
    {"ClusterRole", "IngressClass", "Namespace", "PriorityClass", "RuntimeClass", "StorageClass"}
)
"""Cluster-scoped kinds an object may depend on (see Scope in the module docstring)."""

_ROLE_BINDINGS = frozenset({"RoleBinding", "ClusterRoleBinding"})

_V1 = "v1"
_SECRET = "Secret"  # noqa: S105 - the kind name, not a credential
_CONFIG_MAP = "ConfigMap"
_SERVICE_ACCOUNT = "ServiceAccount"
_PVC = "PersistentVolumeClaim"

_MAPPING_REF_SUFFIXES = (
    ("secretRef", _SECRET),
    ("SecretRef", _SECRET),
    ("secretKeyRef", _SECRET),
    ("SecretKeyRef", _SECRET),
    ("configMapRef", _CONFIG_MAP),
    ("ConfigMapRef", _CONFIG_MAP),
    ("configMapKeyRef", _CONFIG_MAP),
    ("ConfigMapKeyRef", _CONFIG_MAP),
)
_STRING_REF_KEYS = {"serviceAccountName": _SERVICE_ACCOUNT, "claimName": _PVC}

_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


class _Found:
    """Collects references for one object, filling in namespaces consistently."""

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self.entries: list[DependencyEntry] = []

    def add(self, api_version: Any, kind: Any, name: Any, namespace: Any = None) -> None:
        if not all(isinstance(part, str) and part for part in (api_version, kind, name)):
            return
        if kind in CLUSTER_SCOPED_KINDS:
            namespace = None
        elif not isinstance(namespace, str) or not namespace:
            namespace = self.namespace
        self.entries.append(
            DependencyEntry(
                api_version=api_version, kind=kind, name=name, namespace=namespace, detected=True
            )
        )


def _maps(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def _from_pod_spec(pod_spec: Mapping[str, Any], found: _Found) -> None:
    found.add(_V1, _SERVICE_ACCOUNT, pod_spec.get("serviceAccountName"))
    # The deprecated alias only counts when the current field is absent, as in the API.
    if not pod_spec.get("serviceAccountName"):
        found.add(_V1, _SERVICE_ACCOUNT, pod_spec.get("serviceAccount"))
    for pull_secret in _maps(pod_spec.get("imagePullSecrets")):
        found.add(_V1, _SECRET, pull_secret.get("name"))
    for volume in _maps(pod_spec.get("volumes")):
        found.add(_V1, _CONFIG_MAP, _get(volume, "configMap", "name"))
        found.add(_V1, _SECRET, _get(volume, "secret", "secretName"))
        found.add(_V1, _PVC, _get(volume, "persistentVolumeClaim", "claimName"))
        # The one in-tree volume type that names its Secret without a *SecretRef field.
        found.add(_V1, _SECRET, _get(volume, "azureFile", "secretName"))
        for source in _maps(_get(volume, "projected", "sources")):
            found.add(_V1, _CONFIG_MAP, _get(source, "configMap", "name"))
            found.add(_V1, _SECRET, _get(source, "secret", "name"))
    for container_list in _CONTAINER_LISTS:
        for container in _maps(pod_spec.get(container_list)):
            for env_from in _maps(container.get("envFrom")):
                found.add(_V1, _CONFIG_MAP, _get(env_from, "configMapRef", "name"))
                found.add(_V1, _SECRET, _get(env_from, "secretRef", "name"))
            for env in _maps(container.get("env")):
                found.add(_V1, _CONFIG_MAP, _get(env, "valueFrom", "configMapKeyRef", "name"))
                found.add(_V1, _SECRET, _get(env, "valueFrom", "secretKeyRef", "name"))


def _from_declared(obj: Mapping[str, Any], interpreter: Interpreter, found: _Found) -> None:
    for path, api_version, kind in interpreter.dependencies:
        for value in paths.get_all(obj, path):
            if isinstance(value, Mapping):
                found.add(api_version, kind, value.get("name"), value.get("namespace"))
            else:
                found.add(api_version, kind, value)


def _mapping_ref_kind(key: str) -> str | None:
    for suffix, kind in _MAPPING_REF_SUFFIXES:
        if key.endswith(suffix):
            return kind
    return None


def _walk(node: Any, found: _Found) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, found)
        return
    if not isinstance(node, Mapping):
        return
    found.add(node.get("apiVersion"), node.get("kind"), node.get("name"), node.get("namespace"))
    for key, value in node.items():
        if not isinstance(key, str):
            continue
        ref_kind = _mapping_ref_kind(key)
        if ref_kind is not None and isinstance(value, Mapping) and "kind" not in value:
            found.add(_V1, ref_kind, value.get("name"), value.get("namespace"))
        elif key in _STRING_REF_KEYS and isinstance(value, str):
            found.add(_V1, _STRING_REF_KEYS[key], value)
        _walk(value, found)


def detect(obj: Mapping[str, Any], interpreter: Interpreter) -> list[DependencyEntry]:
    """The dependencies found in ``obj``: ``detected: true``, deduplicated and sorted."""
    raw_metadata = obj.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, Mapping) else {}
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    found = _Found(namespace)
    for _component, pod_spec in interpreter.pod_specs(obj):
        _from_pod_spec(pod_spec, found)
    for owner in _maps(metadata.get("ownerReferences")):
        found.add(owner.get("apiVersion"), owner.get("kind"), owner.get("name"))
    _from_declared(obj, interpreter, found)
    _walk({k: v for k, v in obj.items() if k not in ("metadata", "status")}, found)

    own = (str(obj.get("apiVersion")), str(obj.get("kind")), namespace or "", metadata.get("name"))
    unique = {e.key: e for e in found.entries if e.key != own}
    return [unique[key] for key in sorted(unique)]


def user_dependencies(obj: Mapping[str, Any]) -> list[DependencyEntry]:
    """The user's own entries (``detected: false``) of the object's annotation.

    Raises `ValueError` naming the entry when the annotation is malformed.
    """
    annotations = _get(obj, "metadata", "annotations")
    value = annotations.get(DEPENDENCIES_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not value:
        return []
    return [entry for entry in parse_dependencies(value) if not entry.detected]


def _identity(entry: DependencyEntry, namespace: str | None) -> tuple[str, str, str, str]:
    # A user entry without a namespace means the object's own namespace, as a
    # detected one would say it, unless the kind has no namespaces at all.
    if entry.namespace is None and namespace and entry.kind not in CLUSTER_SCOPED_KINDS:
        return (entry.api_version, entry.kind, namespace, entry.name)
    return entry.key


def merge_dependencies(
    user_entries: Iterable[DependencyEntry],
    detected: Iterable[DependencyEntry],
    *,
    namespace: str | None = None,
) -> list[DependencyEntry]:
    """User entries first, verbatim and in their order; then detected ones, sorted.

    An object listed by the user is not listed again as detected; ``namespace`` (the
    dependent object's) is what a user entry without a namespace refers to. The
    result does not depend on the order of ``detected``, so re-running detection on
    an unchanged object yields the same list.
    """
    merged: list[DependencyEntry] = []
    seen: set[tuple[str, str, str, str]] = set()
    for entry in user_entries:
        identity = _identity(entry, namespace)
        if identity not in seen:
            seen.add(identity)
            merged.append(entry)
    for entry in sorted(detected, key=lambda e: e.key):
        identity = _identity(entry, namespace)
        if identity not in seen:
            seen.add(identity)
            merged.append(entry if entry.detected else entry.model_copy(update={"detected": True}))
    return merged


def dependencies(obj: Mapping[str, Any], interpreter: Interpreter) -> list[DependencyEntry]:
    """Everything ``obj`` depends on: the user's entries and what detection found."""
    namespace = _get(obj, "metadata", "namespace")
    return merge_dependencies(
        user_dependencies(obj),
        detect(obj, interpreter),
        namespace=namespace if isinstance(namespace, str) else None,
    )


def annotation_value(obj: Mapping[str, Any], interpreter: Interpreter) -> str:
    """The ``flotilla.io/dependencies`` value the detector writes for ``obj``."""
    return dump_dependencies(dependencies(obj, interpreter))


def refusal(
    entry: DependencyEntry,
    *,
    kind: str,
    namespace: str | None,
    system_namespace: str,
) -> str | None:
    """Why an object of `kind` in `namespace` (None: cluster-scoped) may not depend on
    `entry`, or None when it may (see Scope in the module docstring)."""
    if entry.kind in CLUSTER_SCOPED_KINDS:
        if entry.kind not in CLUSTER_SCOPED_ALLOWED:
            return f"cluster-scoped {entry.kind} is not a kind objects may depend on"
        if entry.kind == "ClusterRole" and kind not in _ROLE_BINDINGS:
            return "only a RoleBinding or ClusterRoleBinding may depend on a ClusterRole"
        if entry.kind == "Namespace":
            if entry.name == system_namespace:
                return f"namespace {system_namespace} is Flotilla's own"
            if namespace is not None and entry.name != namespace:
                return f"a namespaced object may only depend on its own namespace ({namespace})"
        return None
    target = entry.namespace or namespace
    if target == system_namespace:
        return f"objects in namespace {system_namespace} (Flotilla's own) are never dependencies"
    if namespace is not None and target != namespace:
        return f"a dependency of an object in namespace {namespace} must be in that namespace"
    return None


def within_scope(
    entries: Iterable[DependencyEntry],
    *,
    kind: str,
    namespace: str | None,
    system_namespace: str,
) -> tuple[list[DependencyEntry], list[tuple[DependencyEntry, str]]]:
    """`entries` split into those the object may depend on and those refused (with why)."""
    allowed: list[DependencyEntry] = []
    refused: list[tuple[DependencyEntry, str]] = []
    for entry in entries:
        why = refusal(entry, kind=kind, namespace=namespace, system_namespace=system_namespace)
        if why is None:
            allowed.append(entry)
        else:
            refused.append((entry, why))
    return allowed, refused
