"""Which kinds kubesim serves, and how a URL, an apiVersion or a CRD names them.

The built-in table mirrors the subset of upstream Kubernetes that Flotilla and its
users touch. CRDs add entries at runtime through `Registry.add`; everything else
(store, discovery, routing) looks types up here, so a kind is served exactly when
it is in the registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from flotilla.kubesim.errors import ApiError


@dataclass(frozen=True)
class ResourceType:
    """One served resource: group/version/kind plus its URL plural and scope."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    custom: bool = False
    categories: tuple[str, ...] = ()
    # Create-only kinds (access and identity reviews) are answered, never stored.
    create_only: bool = False
    keyed_lists: tuple[tuple[str, str], ...] = ()
    """A custom type's lists declared ``x-kubernetes-list-type: map`` with one key:
    (field name, key). Server-side apply merges them by that key."""

    def list_key(self, field: str) -> str | None:
        return dict(self.keyed_lists).get(field) if self.custom else None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def group_resource(self) -> str:
        """`deployments.apps`, the name Kubernetes uses in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


_STATUS = frozenset({"status"})


def _rt(
    api_version: str,
    kind: str,
    plural: str,
    *,
    namespaced: bool = True,
    status: bool = False,
    scale: bool = False,
    short: tuple[str, ...] = (),
    extra: frozenset[str] = frozenset(),
    categories: tuple[str, ...] = (),
    create_only: bool = False,
) -> ResourceType:
    group, _, version = api_version.rpartition("/")
    subresources = (_STATUS if status else frozenset()) | ({"scale"} if scale else frozenset())
    subresources |= extra
    return ResourceType(
        group=group,
        version=version,
        kind=kind,
        plural=plural,
        namespaced=namespaced,
        subresources=frozenset(subresources),
        short_names=short,
        categories=categories,
        create_only=create_only,
    )


_ALL = ("all",)


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _rt("v1", "Namespace", "namespaces", namespaced=False, status=True, short=("ns",)),
    _rt("v1", "Node", "nodes", namespaced=False, status=True, short=("no",)),
    _rt(
        "v1",
        "Pod",
        "pods",
        status=True,
        short=("po",),
        extra=frozenset({"eviction"}),
        categories=_ALL,
    ),
    _rt("v1", "Service", "services", status=True, short=("svc",), categories=_ALL),
    _rt("v1", "ConfigMap", "configmaps", short=("cm",)),
    _rt("v1", "Secret", "secrets"),
    _rt("v1", "ServiceAccount", "serviceaccounts", short=("sa",)),
    _rt("v1", "PersistentVolumeClaim", "persistentvolumeclaims", status=True, short=("pvc",)),
    _rt("v1", "Event", "events", short=("ev",)),
    _rt("events.k8s.io/v1", "Event", "events", short=("ev",)),
    _rt(
        "apps/v1",
        "Deployment",
        "deployments",
        status=True,
        scale=True,
        short=("deploy",),
        categories=_ALL,
    ),
    _rt(
        "apps/v1",
        "ReplicaSet",
        "replicasets",
        status=True,
        scale=True,
        short=("rs",),
        categories=_ALL,
    ),
    _rt(
        "apps/v1",
        "StatefulSet",
        "statefulsets",
        status=True,
        scale=True,
        short=("sts",),
        categories=_ALL,
    ),
    _rt("apps/v1", "DaemonSet", "daemonsets", status=True, short=("ds",), categories=_ALL),
    _rt("batch/v1", "Job", "jobs", status=True, categories=_ALL),
    _rt("batch/v1", "CronJob", "cronjobs", status=True, short=("cj",), categories=_ALL),
    _rt("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", status=True, short=("pdb",)),
    _rt("networking.k8s.io/v1", "Ingress", "ingresses", status=True, short=("ing",)),
    _rt("rbac.authorization.k8s.io/v1", "Role", "roles"),
    _rt("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    _rt("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    _rt(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        namespaced=False,
    ),
    _rt("coordination.k8s.io/v1", "Lease", "leases"),
    _rt(
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        namespaced=False,
        create_only=True,
    ),
    _rt(
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        namespaced=False,
        create_only=True,
    ),
    _rt(
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        namespaced=False,
        create_only=True,
    ),
    _rt(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        namespaced=False,
        status=True,
        short=("crd", "crds"),
    ),
)

NAMESPACE = BUILTIN_TYPES[0]
CRD = BUILTIN_TYPES[-1]


def api_version_of(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


class Registry:
    """The served types, indexed the three ways requests name them."""

    def __init__(self, types: Iterable[ResourceType] = BUILTIN_TYPES) -> None:
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        self._by_plural: dict[tuple[str, str, str], ResourceType] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_kind[(rt.api_version, rt.kind)] = rt
        self._by_plural[(rt.group, rt.version, rt.plural)] = rt

    def remove(self, rt: ResourceType) -> None:
        self._by_kind.pop((rt.api_version, rt.kind), None)
        self._by_plural.pop((rt.group, rt.version, rt.plural), None)

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        rt = self._by_kind.get((api_version, kind))
        if rt is None:
            raise ApiError(
                404,
                "NotFound",
                f'the server could not find the requested resource: kind "{kind}" '
                f'in version "{api_version}"',
            )
        return rt

    def by_plural(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._by_plural.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def has_group_version(self, group: str, version: str) -> bool:
        return any(rt.group == group and rt.version == version for rt in self)

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._by_plural.values()))

    def __contains__(self, rt: object) -> bool:
        return (
            isinstance(rt, ResourceType)
            and self._by_plural.get((rt.group, rt.version, rt.plural)) == rt
        )

    def group_versions(self) -> dict[str, list[str]]:
        """Group -> versions in registration order (core group is "")."""
        out: dict[str, list[str]] = {}
        for rt in self._by_plural.values():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return out
