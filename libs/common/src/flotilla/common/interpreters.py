"""Per-type knowledge: which strategy a kind defaults to and where its parts live.

Everything Flotilla knows about a type is an interpreter: the default strategy,
where replicas and pod templates (or components, for multi-pod-template
workloads) are, how member statuses fold back, which fields name dependencies,
and which objects an ``as-needed`` object follows. Built-in types are declared
here as ordinary `ResourceInterpreterSpec` data, exactly what a CRD author writes
in a ``ResourceInterpreter`` object, so the two cannot behave differently. A
declared interpreter replaces the built-in one for its type; unknown types get
`Strategy.ANY` and nothing else.

It lives in `flotilla.common` because several services read objects through it:
the dependency detector (requests, dependencies), the scheduler (``follows``), the
transformer (`Interpreter.with_replicas` renders a cluster's share of a split
object) and the status aggregator (`Interpreter.status_rules`).

Decisions where the architecture is silent:

* **Service and Ingress follow their backends.** They are ``as-needed`` and carry
  ``follows`` rules: a Service goes wherever a workload in its namespace whose
  pod-template labels match ``spec.selector`` is placed; an Ingress goes wherever
  the Services it routes to go. ``follows`` is a field of the ResourceInterpreter
  spec, so CRD authors can declare it too; the stage that places ``as-needed``
  objects resolves the rules against current placements. A Service without a
  selector (manually managed endpoints) follows nothing and is synced only where
  some object lists it as a dependency.
* **PersistentVolumeClaim is ``as-needed``**: a claim is created on each cluster
  where a workload that mounts it runs, the usual multi-cluster behaviour for
  dynamically provisioned storage. Data does not move with it; a user who needs
  one claim to pin its consumers annotates it ``flotilla.io/strategy: any``, and
  co-scheduling then keeps its consumers on that cluster.
* **Job and CronJob count ``parallelism`` as replicas**, because that is how many
  pods run at once and so what must fit on the chosen cluster.
* Requests per replica follow the Kubernetes scheduler: the sum over containers,
  the max with each init container (restartable "sidecar" init containers add to
  both), plus ``spec.overhead``; a container limit without a request counts as
  the request, as the API server defaults it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flotilla.common import paths, quantity
from flotilla.common.api import (
    AggregationOp,
    FollowBy,
    GroupVersionKind,
    PlacementPolicySpec,
    ResourceInterpreter,
    ResourceInterpreterSpec,
    StatusAggregationRule,
    Strategy,
    effective_strategy,
)
from flotilla.common.paths import CompiledPath, PathError

Requests = dict[str, int]
"""Resource name → integer units (`flotilla.common.quantity.to_units`)."""


class InterpretationError(ValueError):
    """An object the interpreter of its type cannot read; the message names the field."""


class DuplicateInterpreterError(ValueError):
    """Two interpreters registered for the same type at the same level."""


class InvalidInterpreterError(ValueError):
    """A ResourceInterpreter whose paths do not parse; the message names the field."""


class Component(BaseModel):
    """One pod template of a workload, with the replicas it runs."""

    model_config = ConfigDict(frozen=True)

    name: str
    replicas: int
    requests: Requests = Field(default_factory=dict)
    """Per replica."""

    @property
    def total_requests(self) -> Requests:
        return {resource: units * self.replicas for resource, units in self.requests.items()}


class Follow(BaseModel):
    """An object (or a set of workloads) whose placement an ``as-needed`` object follows.

    Either ``name`` with ``api_version``/``kind`` (an Ingress following Service
    ``web``), or ``pod_labels`` (a Service following every workload in ``namespace``
    whose pod-template labels include these labels).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str | None = None
    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    pod_labels: dict[str, str] | None = None


class Interpretation(BaseModel):
    """What Flotilla needs to know about one object to place it."""

    model_config = ConfigDict(frozen=True)

    api_version: str
    kind: str
    strategy: Strategy
    """The effective strategy (`flotilla.common.api.effective_strategy`): the object's
    annotation, else the policy's, else the interpreter's default."""
    replicas: int = 1
    requests: Requests = Field(default_factory=dict)
    """Per replica of ``replicas``; multi-component workloads list theirs in ``components``."""
    components: list[Component] = Field(default_factory=list)
    status_aggregation: list[StatusAggregationRule] = Field(default_factory=list)
    follows: list[Follow] = Field(default_factory=list)

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind.from_api_version(self.api_version, self.kind)

    @property
    def total_requests(self) -> Requests:
        """Everything the object needs on one cluster if placed there whole."""
        own = {resource: units * self.replicas for resource, units in self.requests.items()}
        return _sum_requests([own, *(c.total_requests for c in self.components)])


@dataclass(frozen=True)
class CompiledComponent:
    name: str
    replicas: CompiledPath | None
    pod_template: CompiledPath


@dataclass(frozen=True)
class Interpreter:
    """A `ResourceInterpreterSpec` with its paths compiled once."""

    spec: ResourceInterpreterSpec
    source: str
    """Where it came from ("built-in", "ResourceInterpreter/<name>", "default")."""
    replicas: CompiledPath | None
    pod_template: CompiledPath | None
    pod_spec: CompiledPath | None
    components: tuple[CompiledComponent, ...]
    dependencies: tuple[tuple[CompiledPath, str, str], ...]
    """(path, apiVersion, kind) of each declared dependency."""
    status_paths: tuple[CompiledPath, ...]
    follows: tuple[CompiledPath, ...]

    @classmethod
    def compile(cls, spec: ResourceInterpreterSpec, source: str) -> Interpreter:
        def compiled(field: str, path: str) -> CompiledPath:
            try:
                return paths.compile_path(path)
            except PathError as error:
                raise InvalidInterpreterError(f"{source}: spec.{field}: {error}") from None

        return cls(
            spec=spec,
            source=source,
            replicas=compiled("replicas.path", spec.replicas.path) if spec.replicas else None,
            pod_template=(
                compiled("podTemplate.path", spec.pod_template.path) if spec.pod_template else None
            ),
            pod_spec=compiled("podSpec.path", spec.pod_spec.path) if spec.pod_spec else None,
            components=tuple(
                CompiledComponent(
                    name=c.name,
                    replicas=(
                        compiled(f"components[{i}].replicasPath", c.replicas_path)
                        if c.replicas_path
                        else None
                    ),
                    pod_template=compiled(f"components[{i}].podTemplatePath", c.pod_template_path),
                )
                for i, c in enumerate(spec.components)
            ),
            dependencies=tuple(
                (compiled(f"dependencies[{i}].path", d.path), d.api_version, d.kind)
                for i, d in enumerate(spec.dependencies)
            ),
            status_paths=tuple(
                compiled(f"statusAggregation[{i}].path", r.path)
                for i, r in enumerate(spec.status_aggregation)
            ),
            follows=tuple(
                compiled(f"follows[{i}].path", f.path) for i, f in enumerate(spec.follows)
            ),
        )

    @property
    def gvk(self) -> GroupVersionKind:
        return self.spec.target.gvk

    def pod_specs(self, obj: Mapping[str, Any]) -> list[tuple[str | None, Mapping[str, Any]]]:
        """Every PodSpec in ``obj`` this interpreter points at, with its component name."""
        found: list[tuple[str | None, Mapping[str, Any]]] = []
        if self.pod_template is not None:
            found += [(None, s) for t in paths.get_all(obj, self.pod_template) for s in _spec(t)]
        if self.pod_spec is not None:
            found += [(None, s) for s in paths.get_all(obj, self.pod_spec) if _is_map(s)]
        for component in self.components:
            for template in paths.get_all(obj, component.pod_template):
                found += [(component.name, s) for s in _spec(template)]
        return found

    @property
    def status_rules(self) -> tuple[tuple[CompiledPath, AggregationOp], ...]:
        """(path, op) of each ``statusAggregation`` rule, in declared order."""
        return tuple(
            (path, rule.op)
            for path, rule in zip(self.status_paths, self.spec.status_aggregation, strict=True)
        )

    def with_replicas(self, obj: Mapping[str, Any], replicas: int) -> dict[str, Any]:
        """A copy of ``obj`` that runs ``replicas`` (one cluster's share of a split).

        `InterpretationError` for a type without a replicas path: such an object is
        one replica and cannot be divided.
        """
        if self.replicas is None:
            raise InterpretationError(
                f"{self.gvk} declares no replicas path ({self.source}); it cannot be split"
            )
        rendered = copy.deepcopy(dict(obj))
        try:
            paths.set_value(rendered, self.replicas, replicas)
        except PathError as error:
            raise InterpretationError(str(error)) from None
        return rendered

    def interpret(
        self, obj: Mapping[str, Any], policy: PlacementPolicySpec | None = None
    ) -> Interpretation:
        """Read ``obj`` (governed by ``policy``, if any) through this interpreter;
        `InterpretationError` names a bad field or annotation."""
        try:
            strategy = effective_strategy(obj, policy, self.spec.strategy)
        except ValueError as error:
            raise InterpretationError(str(error)) from None
        requests: Requests = {}
        if self.pod_template is not None:
            requests = _requests_at(obj, self.pod_template, template=True)
        elif self.pod_spec is not None:
            requests = _requests_at(obj, self.pod_spec, template=False)
        components = [
            Component(
                name=c.name,
                replicas=_replicas_at(obj, c.replicas),
                requests=_requests_at(obj, c.pod_template, template=True),
            )
            for c in self.components
        ]
        return Interpretation(
            api_version=str(obj.get("apiVersion", self.spec.target.api_version)),
            kind=str(obj.get("kind", self.spec.target.kind)),
            strategy=strategy,
            replicas=_replicas_at(obj, self.replicas),
            requests=requests,
            components=components,
            status_aggregation=list(self.spec.status_aggregation),
            follows=self._follows(obj),
        )

    def _follows(self, obj: Mapping[str, Any]) -> list[Follow]:
        namespace = (obj.get("metadata") or {}).get("namespace")
        follows: list[Follow] = []
        for rule, path in zip(self.spec.follows, self.follows, strict=True):
            for value in paths.get_all(obj, path):
                if rule.by is FollowBy.POD_LABELS and _is_map(value) and value:
                    labels = {str(k): str(v) for k, v in value.items()}
                    follows.append(Follow(namespace=namespace, pod_labels=labels))
                elif rule.by is FollowBy.NAME and isinstance(value, str) and value:
                    follows.append(
                        Follow(
                            namespace=namespace,
                            api_version=rule.api_version,
                            kind=rule.kind,
                            name=value,
                        )
                    )
        unique: dict[str, Follow] = {}
        for follow in follows:
            unique.setdefault(follow.model_dump_json(), follow)
        return list(unique.values())


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def _spec(template: Any) -> list[Mapping[str, Any]]:
    spec = template.get("spec") if isinstance(template, Mapping) else None
    return [spec] if isinstance(spec, Mapping) else []


def _replicas_at(obj: Mapping[str, Any], path: CompiledPath | None) -> int:
    if path is None:
        return 1
    value = _get_one(obj, path, default=1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InterpretationError(
            f"{path.text}: replicas must be a whole number ≥ 0, not {value!r}"
        )
    return value


def _get_one(obj: Mapping[str, Any], path: CompiledPath, default: Any = None) -> Any:
    try:
        return paths.get_one(obj, path, default)
    except PathError as error:
        raise InterpretationError(str(error)) from None


def _sum_requests(parts: Iterable[Mapping[str, int]]) -> Requests:
    total: Requests = {}
    for part in parts:
        for resource, units in part.items():
            total[resource] = total.get(resource, 0) + units
    return total


def _max_requests(a: Mapping[str, int], b: Mapping[str, int]) -> Requests:
    return {resource: max(a.get(resource, 0), b.get(resource, 0)) for resource in {*a, *b}}


def _container_requests(container: Mapping[str, Any], where: str) -> Requests:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = {**limits, **(resources.get("requests") or {})}
    units: Requests = {}
    for resource, amount in requests.items():
        try:
            units[str(resource)] = quantity.to_units(str(resource), amount)
        except (quantity.QuantityError, TypeError) as error:
            raise InterpretationError(f"{where}.resources.requests.{resource}: {error}") from None
    return units


def pod_requests(pod_spec: Mapping[str, Any], where: str = ".spec") -> Requests:
    """What one pod with ``pod_spec`` asks the scheduler for, as integer units.

    Mirrors ``k8s.io/component-helpers/resource.PodRequests``.
    """
    containers = pod_spec.get("containers") or []
    total = _sum_requests(
        _container_requests(c, f"{where}.containers[{i}]") for i, c in enumerate(containers)
    )
    sidecars: Requests = {}
    init_peak: Requests = {}
    for i, init in enumerate(pod_spec.get("initContainers") or []):
        own = _container_requests(init, f"{where}.initContainers[{i}]")
        if init.get("restartPolicy") == "Always":
            # A sidecar keeps running next to the app containers and later init ones.
            total = _sum_requests([total, own])
            sidecars = _sum_requests([sidecars, own])
            running = sidecars
        else:
            running = _sum_requests([own, sidecars])
        init_peak = _max_requests(init_peak, running)
    total = _max_requests(total, init_peak)
    overhead = pod_spec.get("overhead") or {}
    for resource, amount in overhead.items():
        try:
            units = quantity.to_units(str(resource), amount)
        except (quantity.QuantityError, TypeError) as error:
            raise InterpretationError(f"{where}.overhead.{resource}: {error}") from None
        total[str(resource)] = total.get(str(resource), 0) + units
    return {resource: units for resource, units in sorted(total.items()) if units}


def _requests_at(obj: Mapping[str, Any], path: CompiledPath, *, template: bool) -> Requests:
    found = _get_one(obj, path)
    if found is None:
        return {}
    if not isinstance(found, Mapping):
        raise InterpretationError(f"{path.text}: expected an object, found {type(found).__name__}")
    if template:
        spec = found.get("spec")
        if not isinstance(spec, Mapping):
            return {}
        return pod_requests(spec, f"{path.text}.spec")
    return pod_requests(found, path.text)


# --- built-ins ----------------------------------------------------------------------


def _builtin(
    api_version: str, kind: str, strategy: Strategy, **fields: Any
) -> ResourceInterpreterSpec:
    return ResourceInterpreterSpec.model_validate(
        {"target": {"apiVersion": api_version, "kind": kind}, "strategy": strategy, **fields}
    )


def _sum(*fields: str) -> list[dict[str, str]]:
    return [{"path": f".status.{field}", "op": "sum"} for field in fields]


_WORKLOAD_STATUS = _sum(
    "replicas", "readyReplicas", "availableReplicas", "updatedReplicas", "unavailableReplicas"
)
_TEMPLATE = {"path": ".spec.template"}
_SECRET = {"apiVersion": "v1", "kind": "Secret"}

BUILTINS: tuple[ResourceInterpreterSpec, ...] = (
    _builtin(
        "apps/v1",
        "Deployment",
        Strategy.SPLIT,
        replicas={"path": ".spec.replicas"},
        podTemplate=_TEMPLATE,
        statusAggregation=_WORKLOAD_STATUS,
    ),
    _builtin(
        "apps/v1",
        "ReplicaSet",
        Strategy.SPLIT,
        replicas={"path": ".spec.replicas"},
        podTemplate=_TEMPLATE,
        statusAggregation=[*_WORKLOAD_STATUS, *_sum("fullyLabeledReplicas")],
    ),
    _builtin(
        "apps/v1",
        "StatefulSet",
        Strategy.ANY,
        replicas={"path": ".spec.replicas"},
        podTemplate=_TEMPLATE,
        statusAggregation=[*_WORKLOAD_STATUS, *_sum("currentReplicas")],
        # The governing (headless) Service must exist for the pods' DNS names.
        dependencies=[{"path": ".spec.serviceName", "apiVersion": "v1", "kind": "Service"}],
    ),
    _builtin(
        "apps/v1",
        "DaemonSet",
        Strategy.COPY,
        podTemplate=_TEMPLATE,
        statusAggregation=_sum(
            "desiredNumberScheduled", "currentNumberScheduled", "numberReady", "numberAvailable"
        ),
    ),
    _builtin(
        "batch/v1",
        "Job",
        Strategy.ANY,
        replicas={"path": ".spec.parallelism"},
        podTemplate=_TEMPLATE,
        statusAggregation=_sum("active", "succeeded", "failed"),
    ),
    _builtin(
        "batch/v1",
        "CronJob",
        Strategy.ANY,
        replicas={"path": ".spec.jobTemplate.spec.parallelism"},
        podTemplate={"path": ".spec.jobTemplate.spec.template"},
        statusAggregation=[{"path": ".status.lastScheduleTime", "op": "max"}],
    ),
    _builtin(
        "v1",
        "Pod",
        Strategy.ANY,
        podSpec={"path": ".spec"},
        statusAggregation=[{"path": ".status.phase", "op": "first"}],
    ),
    _builtin(
        "v1",
        "Service",
        Strategy.AS_NEEDED,
        follows=[{"path": ".spec.selector", "by": "podLabels"}],
    ),
    _builtin(
        "networking.k8s.io/v1",
        "Ingress",
        Strategy.AS_NEEDED,
        follows=[
            {"path": path, "by": "name", "apiVersion": "v1", "kind": "Service"}
            for path in (
                ".spec.defaultBackend.service.name",
                ".spec.rules[*].http.paths[*].backend.service.name",
            )
        ],
        dependencies=[{"path": ".spec.tls[*].secretName", **_SECRET}],
    ),
    _builtin("v1", "Namespace", Strategy.AS_NEEDED),
    _builtin(
        "v1",
        "ServiceAccount",
        Strategy.AS_NEEDED,
        dependencies=[
            {"path": ".secrets[*].name", **_SECRET},
            {"path": ".imagePullSecrets[*].name", **_SECRET},
        ],
    ),
    _builtin("v1", "ConfigMap", Strategy.AS_NEEDED),
    _builtin("v1", "Secret", Strategy.AS_NEEDED),
    _builtin("v1", "PersistentVolumeClaim", Strategy.AS_NEEDED),
    _builtin("rbac.authorization.k8s.io/v1", "Role", Strategy.AS_NEEDED),
    _builtin(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        Strategy.AS_NEEDED,
        dependencies=[
            {
                "path": ".roleRef[kind=Role].name",
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
            },
            {
                "path": ".subjects[kind=ServiceAccount]",
                "apiVersion": "v1",
                "kind": "ServiceAccount",
            },
        ],
    ),
)


def default_spec(gvk: GroupVersionKind) -> ResourceInterpreterSpec:
    """What Flotilla assumes about a type nobody described: one replica, `any`."""
    return _builtin(gvk.api_version, gvk.kind, Strategy.ANY)


class Registry:
    """Interpreters by type: declared (ResourceInterpreter objects) over built-in.

    Registering a type twice at the same level is an error, so two
    ResourceInterpreters fighting over one CRD are reported rather than resolved by
    whichever was seen last.
    """

    def __init__(self) -> None:
        self._builtin: dict[GroupVersionKind, Interpreter] = {}
        self._declared: dict[GroupVersionKind, Interpreter] = {}

    @classmethod
    def with_builtins(cls) -> Registry:
        registry = cls()
        for spec in BUILTINS:
            registry.register_builtin(spec)
        return registry

    def register_builtin(self, spec: ResourceInterpreterSpec) -> Interpreter:
        return self._add(self._builtin, Interpreter.compile(spec, "built-in"))

    def register(self, interpreter: ResourceInterpreter) -> Interpreter:
        """Add a declared interpreter; it takes precedence over a built-in one."""
        source = f"ResourceInterpreter/{interpreter.metadata.name}"
        return self._add(self._declared, Interpreter.compile(interpreter.spec, source))

    def unregister(self, gvk: GroupVersionKind) -> None:
        """Forget the declared interpreter of ``gvk`` (its ResourceInterpreter was deleted)."""
        self._declared.pop(gvk, None)

    @staticmethod
    def _add(level: dict[GroupVersionKind, Interpreter], interpreter: Interpreter) -> Interpreter:
        existing = level.get(interpreter.gvk)
        if existing is not None:
            raise DuplicateInterpreterError(
                f"{interpreter.source} and {existing.source} both describe {interpreter.gvk}; "
                "delete one of them"
            )
        level[interpreter.gvk] = interpreter
        return interpreter

    def lookup(self, gvk: GroupVersionKind) -> Interpreter:
        found = self._declared.get(gvk) or self._builtin.get(gvk)
        if found is not None:
            return found
        return Interpreter.compile(default_spec(gvk), "default")

    def for_object(self, obj: Mapping[str, Any]) -> Interpreter:
        return self.lookup(
            GroupVersionKind.from_api_version(str(obj.get("apiVersion", "")), str(obj.get("kind")))
        )

    def interpret(
        self, obj: Mapping[str, Any], policy: PlacementPolicySpec | None = None
    ) -> Interpretation:
        return self.for_object(obj).interpret(obj, policy)
