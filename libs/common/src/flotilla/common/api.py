"""Flotilla's hub API (group ``flotilla.io``, version ``v1alpha1``) as pydantic models.

Every service reads the same CRD objects and annotations, so their shape lives in
one place: the specs and statuses of ``Cluster``, ``PlacementPolicy`` /
``ClusterPlacementPolicy``, ``ResourceInterpreter`` and ``Transformation`` /
``ClusterTransformation``, the JSON payloads Flotilla keeps in annotations on user
objects, and the annotation names themselves. The CRD files under
``deploy/k8s/crds/`` declare the same fields for the API server; a test keeps the
two from drifting apart.

Python names are snake_case; the wire names are Kubernetes camelCase, set as
aliases. Both are accepted on input (``populate_by_name``) and dumps use the wire
names. Specs forbid unknown fields, so a typo such as ``maxCluster`` is an error
rather than a silently ignored setting. Statuses and ``metadata`` ignore / keep
unknown fields, because the API server and newer writers add to them.

Errors are meant to be read by the person who wrote the object: `parse_object`
turns pydantic's errors into an `InvalidObjectError` that names the field as a
dotted path (``spec.weights[0].weight``) and says what to change.

Path strings in a ``ResourceInterpreter`` (``.spec.replicas``) are only checked for
their outer shape here; the path language itself is `flotilla.common.paths`, and
`flotilla.common.interpreters` compiles (and so fully validates) them.

`effective_strategy` is the one place the strategy of an object is decided from
its annotation, its policy and its type's default; every service calls it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Final, Literal, NamedTuple, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from flotilla.common import quantity

GROUP = "flotilla.io"
VERSION = "v1alpha1"
API_VERSION: Final = "flotilla.io/v1alpha1"

ANNOTATION_PREFIX = "flotilla.io/"
STRATEGY_ANNOTATION = "flotilla.io/strategy"
TRANSFORMATIONS_ANNOTATION = "flotilla.io/transformations"
DEPENDENCIES_ANNOTATION = "flotilla.io/dependencies"
PLACEMENT_ANNOTATION = "flotilla.io/placement"
CLUSTER_STATUS_ANNOTATION = "flotilla.io/cluster-status"
FAILOVER_HISTORY_ANNOTATION = "flotilla.io/failover-history"

ANNOTATIONS = (
    STRATEGY_ANNOTATION,
    TRANSFORMATIONS_ANNOTATION,
    DEPENDENCIES_ANNOTATION,
    PLACEMENT_ANNOTATION,
    CLUSTER_STATUS_ANNOTATION,
    FAILOVER_HISTORY_ANNOTATION,
)

ORIGIN_LABEL = "flotilla.io/origin"
"""On every copy Flotilla renders for a member: `origin_label` of the hub object's
key. The syncer touches no member object without it."""
ORIGIN_ANNOTATION = "flotilla.io/origin"
"""On every member copy: the hub object's key, exactly."""
DECISION_ANNOTATION = "flotilla.io/decision"
"""On every member copy: the placement decision it was rendered from."""
HUB_GENERATION_ANNOTATION = "flotilla.io/hub-generation"
"""On every member copy: the hub object's generation it was rendered from."""

_MAX_LABEL_VALUE = 63
_NOT_IN_LABEL_VALUE = re.compile(r"[^a-z0-9]+")


def origin_label(key: str) -> str:
    """The ``flotilla.io/origin`` label value of hub key `key`: DNS-label characters,
    at most 63 of them (a long key keeps its start and gets a digest of the whole key,
    so two long keys stay distinct)."""
    safe = _NOT_IN_LABEL_VALUE.sub("-", key.lower()).strip("-")
    if len(safe) <= _MAX_LABEL_VALUE:
        return safe or "object"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{safe[: _MAX_LABEL_VALUE - len(digest) - 1].strip('-')}-{digest}"


class Strategy(enum.StrEnum):
    """How one object maps onto clusters (docs/architecture.md, "Words")."""

    SPLIT = "split"
    COPY = "copy"
    ANY = "any"
    AS_NEEDED = "as-needed"


def parse_strategy(value: str, *, source: str | None = None) -> Strategy:
    """A strategy name as the enum, or a `ValueError` that lists the valid names.

    ``source`` (e.g. the annotation name) prefixes the message when the caller is not
    a pydantic validator, which names the field itself.
    """
    try:
        return Strategy(value)
    except ValueError:
        valid = ", ".join(s.value for s in Strategy)
        prefix = f"{source}: " if source else ""
        raise ValueError(f"{prefix}unknown strategy {value!r}; use one of {valid}") from None


class SplitBy(enum.StrEnum):
    CAPACITY = "capacity"
    WEIGHTS = "weights"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class PatchType(enum.StrEnum):
    STRATEGIC = "strategic"
    MERGE = "merge"
    JSON = "json"


class AggregationOp(enum.StrEnum):
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    ALL = "all"
    ANY = "any"
    FIRST = "first"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ClusterConditionType(enum.StrEnum):
    READY = "Ready"
    CORDONED = "Cordoned"
    DRAINING = "Draining"
    DRAINED = "Drained"


class PlacementState(enum.StrEnum):
    ACTIVE = "Active"
    RETIRING = "Retiring"


class GroupVersionKind(NamedTuple):
    """A Kubernetes type; ``group`` is ``""`` for the core API (``v1``)."""

    group: str
    version: str
    kind: str

    @classmethod
    def from_api_version(cls, api_version: str, kind: str) -> GroupVersionKind:
        group, _, version = api_version.rpartition("/")
        return cls(group, version, kind)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.api_version}, Kind={self.kind}"


def _check_quantity(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        quantity.parse(value)
    return value


Quantity: TypeAlias = Annotated[str, BeforeValidator(_check_quantity)]
"""A Kubernetes quantity string (``"500m"``, ``"32Gi"``); numbers are accepted and kept
as their string form."""


def _check_path(value: str) -> str:
    if not value.startswith("."):
        raise ValueError(f"path {value!r} must start with '.' (e.g. '.spec.replicas')")
    return value


Path: TypeAlias = Annotated[str, BeforeValidator(_check_path)]
"""A path in `flotilla.common.paths`' language, e.g. ``.spec.template``; ``.`` is the object."""


class _Spec(BaseModel):
    """Base of every user-written part: unknown fields are errors."""

    model_config = ConfigDict(
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
    )


class _Status(BaseModel):
    """Base of status parts: written by Flotilla, tolerant of fields it does not know."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="ignore")


# --- shared building blocks -------------------------------------------------------


class LabelSelectorRequirement(_Spec):
    key: str = Field(min_length=1)
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        needs_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if needs_values and not self.values:
            raise ValueError(f"operator {self.operator.value} needs at least one entry in values")
        if not needs_values and self.values:
            raise ValueError(f"operator {self.operator.value} takes no values; remove them")
        return self


class LabelSelector(_Spec):
    """metav1.LabelSelector: all of matchLabels and all of matchExpressions must hold.

    An empty selector selects everything; `flotilla.common.labels` evaluates it.
    """

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )


class Toleration(_Spec):
    """A policy's toleration of a cluster taint, with core/v1 Toleration semantics."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds", ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator is TolerationOperator.EXISTS and self.value:
            raise ValueError("operator Exists matches any value; remove value")
        if not self.key and self.operator is not TolerationOperator.EXISTS:
            raise ValueError("an empty key tolerates every taint only with operator Exists")
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise ValueError("tolerationSeconds only applies to effect NoExecute")
        return self

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration covers ``taint`` (core/v1 ``Toleration.ToleratesTaint``)."""
        if self.effect is not None and self.effect is not taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator is TolerationOperator.EXISTS or self.value == taint.value


class Condition(_Status):
    """metav1.Condition."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta Flotilla reads; every other field is kept as is."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="allow")

    name: str = Field(min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")
    deletion_timestamp: datetime | None = Field(default=None, alias="deletionTimestamp")


# --- Cluster ------------------------------------------------------------------------


class SecretKeyRef(_Spec):
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    key: str = Field(default="kubeconfig", min_length=1)


class Taint(_Spec):
    key: str = Field(min_length=1)
    value: str = ""
    effect: TaintEffect
    time_added: datetime | None = Field(default=None, alias="timeAdded")


class ClusterSpec(_Spec):
    kubeconfig_secret_ref: SecretKeyRef | None = Field(default=None, alias="kubeconfigSecretRef")
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False
    """Cordon: no new placements on this cluster."""
    evict_after: datetime | None = Field(default=None, alias="evictAfter")
    """Drain: once this time has passed, existing placements move away."""


class ApiResource(_Status):
    group: str = ""
    version: str
    kind: str

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind(self.group, self.version, self.kind)


class ClusterStatus(_Status):
    conditions: list[Condition] = Field(default_factory=list)
    allocatable: dict[str, Quantity] = Field(default_factory=dict)
    available: dict[str, Quantity] = Field(default_factory=dict)
    api_resources: list[ApiResource] = Field(default_factory=list, alias="apiResources")
    placements: int = Field(default=0, ge=0)
    last_heartbeat_time: datetime | None = Field(default=None, alias="lastHeartbeatTime")

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


# --- PlacementPolicy / ClusterPlacementPolicy ----------------------------------------


class ResourceSelector(_Spec):
    """Selects hub objects by type and, optionally, name, namespace and labels.

    Every field that is set must match (name and labelSelector together narrow, they
    do not widen). ``namespace`` only narrows a ClusterPlacementPolicy: a namespaced
    PlacementPolicy never reaches outside its own namespace.
    """

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    name: str | None = None
    namespace: str | None = None
    label_selector: LabelSelector | None = Field(default=None, alias="labelSelector")

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind.from_api_version(self.api_version, self.kind)


class Spread(_Spec):
    """Spread over clusters grouped by a label (e.g. region): between min and max groups."""

    label_key: str = Field(alias="labelKey", min_length=1)
    min_groups: int = Field(default=1, alias="minGroups", ge=1)
    max_groups: int | None = Field(default=None, alias="maxGroups", ge=1)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Spread:
        if self.max_groups is not None and self.min_groups > self.max_groups:
            raise ValueError(
                f"minGroups ({self.min_groups}) must not be greater than "
                f"maxGroups ({self.max_groups})"
            )
        return self


class WeightRule(_Spec):
    cluster_selector: LabelSelector = Field(alias="clusterSelector")
    weight: int

    @field_validator("weight")
    @classmethod
    def _not_negative(cls, weight: int) -> int:
        if weight < 0:
            raise ValueError(f"weight must be 0 or more, got {weight}")
        return weight


class Failover(_Spec):
    toleration_seconds: int = Field(default=300, alias="tolerationSeconds", ge=0)
    """How long a cluster may be NotReady before its placements move elsewhere."""
    failback: bool = False


class PlacementPolicySpec(_Spec):
    """The spec shared by PlacementPolicy (namespaced) and ClusterPlacementPolicy."""

    resource_selectors: list[ResourceSelector] = Field(alias="resourceSelectors", min_length=1)
    priority: int = 0
    strategy: Strategy | None = None
    """None: the strategy comes from the object's annotation or its type's interpreter."""
    cluster_selector: LabelSelector | None = Field(default=None, alias="clusterSelector")
    cluster_names: list[str] | None = Field(default=None, alias="clusterNames")
    tolerations: list[Toleration] = Field(default_factory=list)
    max_clusters: int | None = Field(default=None, alias="maxClusters")
    spread: Spread | None = None
    split_by: SplitBy = Field(default=SplitBy.CAPACITY, alias="splitBy")
    weights: list[WeightRule] = Field(default_factory=list)
    failover: Failover | None = None
    drain_timeout_seconds: int | None = Field(default=None, alias="drainTimeoutSeconds", ge=0)
    """How long a drained cluster's copy waits for the new copies to be ready before it
    is removed anyway (with a Warning Event); None: the drain coordinator's default."""
    transformations: list[str] = Field(default_factory=list)

    @field_validator("strategy", mode="before")
    @classmethod
    def _known_strategy(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_strategy(value)
        return value

    @field_validator("max_clusters")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"maxClusters must be 1 or more, got {value}; omit it for no limit")
        return value

    @model_validator(mode="after")
    def _weights_for_weighted_split(self) -> PlacementPolicySpec:
        if self.split_by is SplitBy.WEIGHTS and not self.weights:
            raise ValueError("splitBy: weights needs at least one entry in weights")
        return self


def effective_strategy(
    obj: Mapping[str, Any], policy: PlacementPolicySpec | None, default: Strategy
) -> Strategy:
    """The strategy an object is placed with: its ``flotilla.io/strategy`` annotation,
    else its policy's ``strategy``, else ``default`` (its type's interpreter's).

    An annotation that names no strategy is a `ValueError` naming the annotation and
    the valid names; it never falls through to the policy, because the user asked
    for something specific and must hear that it was not understood.
    """
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    override = annotations.get(STRATEGY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if override is not None:
        return parse_strategy(str(override), source=f"annotation {STRATEGY_ANNOTATION}")
    if policy is not None and policy.strategy is not None:
        return policy.strategy
    return default


# --- ResourceInterpreter ------------------------------------------------------------


class InterpreterTarget(_Spec):
    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind.from_api_version(self.api_version, self.kind)


class PathRef(_Spec):
    path: Path


class ComponentSpec(_Spec):
    """One pod template of a multi-component workload (all components go to one cluster)."""

    name: str = Field(min_length=1)
    replicas_path: Path | None = Field(default=None, alias="replicasPath")
    """None: the component always has one replica."""
    pod_template_path: Path = Field(alias="podTemplatePath")


class StatusAggregationRule(_Spec):
    path: Path
    op: AggregationOp


class DependencyRule(_Spec):
    """Values at ``path`` name objects of this type that the object depends on.

    A value is a name (string) or a mapping with ``name`` and optionally ``namespace``.
    """

    path: Path
    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)


class FollowBy(enum.StrEnum):
    NAME = "name"
    """Values at the path are names of objects of apiVersion/kind in the same namespace."""
    POD_LABELS = "podLabels"
    """The value at the path is a label map (like Service.spec.selector) matched against
    the pod template labels of workloads in the same namespace."""


class FollowRule(_Spec):
    """An ``as-needed`` object that goes wherever the objects it points at are placed.

    This is the reverse of a dependency: a Service or Ingress is needed where its
    backends run, though the backends do not name it.
    """

    path: Path
    by: FollowBy = FollowBy.NAME
    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None

    @model_validator(mode="after")
    def _type_for_names(self) -> FollowRule:
        if self.by is FollowBy.NAME and not (self.api_version and self.kind):
            raise ValueError("by: name needs apiVersion and kind of the followed objects")
        return self


class ResourceInterpreterSpec(_Spec):
    target: InterpreterTarget
    strategy: Strategy = Strategy.ANY
    replicas: PathRef | None = None
    """What `split` divides; None means the object is a single replica."""
    pod_template: PathRef | None = Field(default=None, alias="podTemplate")
    """A PodTemplateSpec ({metadata, spec}); requests per replica come from its spec."""
    pod_spec: PathRef | None = Field(default=None, alias="podSpec")
    """A PodSpec directly (Pod: ``.spec``); alternative to podTemplate."""
    components: list[ComponentSpec] = Field(default_factory=list)
    """Pod templates of a multi-component workload, each with its own replicas; they
    add to ``replicas`` times ``podTemplate`` when both are declared."""
    status_aggregation: list[StatusAggregationRule] = Field(
        default_factory=list, alias="statusAggregation"
    )
    dependencies: list[DependencyRule] = Field(default_factory=list)
    follows: list[FollowRule] = Field(default_factory=list)

    @field_validator("strategy", mode="before")
    @classmethod
    def _known_strategy(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_strategy(value)
        return value

    @model_validator(mode="after")
    def _one_pod_source(self) -> ResourceInterpreterSpec:
        if self.pod_template is not None and self.pod_spec is not None:
            raise ValueError("set podTemplate or podSpec, not both")
        names = [c.name for c in self.components]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"component names must be unique; repeated: {', '.join(duplicates)}")
        return self


# --- Transformation / ClusterTransformation ------------------------------------------

_IMMUTABLE_POINTERS = ("/apiVersion", "/kind", "/metadata/name", "/metadata/namespace")


class TransformationRule(_Spec):
    target_clusters: list[str] | None = Field(default=None, alias="targetClusters")
    target_selector: LabelSelector | None = Field(default=None, alias="targetSelector")
    patch_type: PatchType = Field(alias="patchType")
    patch: Any

    @model_validator(mode="after")
    def _valid_rule(self) -> TransformationRule:
        if (self.target_clusters is None) == (self.target_selector is None):
            raise ValueError("set exactly one of targetClusters or targetSelector")
        if self.patch_type is PatchType.JSON:
            self._check_json_patch()
        else:
            self._check_merge_patch()
        return self

    def _check_json_patch(self) -> None:
        if not isinstance(self.patch, list):
            raise ValueError("patchType json needs patch to be a list of RFC 6902 operations")
        for index, operation in enumerate(self.patch):
            if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
                raise ValueError(f"patch[{index}] must be an object with 'op' and 'path'")
            path = str(operation["path"])
            if path in ("", "/metadata") or path.startswith(_IMMUTABLE_POINTERS):
                raise ValueError(
                    f"patch[{index}] touches {path!r}; a transformation may not change "
                    "apiVersion, kind, name or namespace"
                )

    def _check_merge_patch(self) -> None:
        if not isinstance(self.patch, dict):
            raise ValueError(f"patchType {self.patch_type.value} needs patch to be an object")
        metadata = self.patch.get("metadata")
        touched = [key for key in ("apiVersion", "kind") if key in self.patch]
        if isinstance(metadata, dict):
            touched += [f"metadata.{key}" for key in ("name", "namespace") if key in metadata]
        elif "metadata" in self.patch:
            touched.append("metadata")
        if touched:
            raise ValueError(
                f"patch sets {', '.join(touched)}; a transformation may not change "
                "apiVersion, kind, name or namespace"
            )


class TransformationSpec(_Spec):
    transformations: list[TransformationRule] = Field(min_length=1)
    """Applied in order."""


# --- top-level objects --------------------------------------------------------------


class _Object(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="forbid")

    api_version: Literal["flotilla.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    metadata: ObjectMeta


class Cluster(_Object):
    kind: Literal["Cluster"] = "Cluster"
    spec: ClusterSpec = Field(default_factory=ClusterSpec)
    status: ClusterStatus = Field(default_factory=ClusterStatus)


class PlacementPolicy(_Object):
    kind: Literal["PlacementPolicy"] = "PlacementPolicy"
    spec: PlacementPolicySpec


class ClusterPlacementPolicy(_Object):
    kind: Literal["ClusterPlacementPolicy"] = "ClusterPlacementPolicy"
    spec: PlacementPolicySpec


class ResourceInterpreter(_Object):
    kind: Literal["ResourceInterpreter"] = "ResourceInterpreter"
    spec: ResourceInterpreterSpec


class Transformation(_Object):
    kind: Literal["Transformation"] = "Transformation"
    spec: TransformationSpec


class ClusterTransformation(_Object):
    kind: Literal["ClusterTransformation"] = "ClusterTransformation"
    spec: TransformationSpec


FlotillaObject: TypeAlias = (
    Cluster
    | PlacementPolicy
    | ClusterPlacementPolicy
    | ResourceInterpreter
    | Transformation
    | ClusterTransformation
)

MODELS: dict[str, type[FlotillaObject]] = {
    "Cluster": Cluster,
    "PlacementPolicy": PlacementPolicy,
    "ClusterPlacementPolicy": ClusterPlacementPolicy,
    "ResourceInterpreter": ResourceInterpreter,
    "Transformation": Transformation,
    "ClusterTransformation": ClusterTransformation,
}
"""The top-level model of each Flotilla kind."""

ObjectT = TypeVar("ObjectT", bound=_Object)

NAMESPACED_KINDS = frozenset({"PlacementPolicy", "Transformation"})


class FieldError(NamedTuple):
    field: str
    """Dotted path into the object, e.g. ``spec.weights[0].weight``."""
    message: str


class InvalidObjectError(ValueError):
    """A Flotilla object that does not satisfy its schema; names each offending field."""

    def __init__(self, kind: str, name: str | None, errors: Iterable[FieldError]) -> None:
        self.kind = kind
        self.name = name
        self.errors = list(errors)
        subject = f"{kind} {name!r}" if name else kind
        details = "; ".join(
            f"{e.field}: {e.message}" if e.field else e.message for e in self.errors
        )
        super().__init__(f"invalid {subject}: {details}")

    @property
    def fields(self) -> list[str]:
        return [e.field for e in self.errors]


def _field_path(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _message(error: Mapping[str, Any]) -> str:
    message = str(error["msg"])
    # pydantic prefixes messages raised from our validators; the user needs only ours.
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if error["type"] == "extra_forbidden":
        return "unknown field (check the spelling against the CRD)"
    return message


def field_errors(error: ValidationError) -> list[FieldError]:
    """pydantic's errors as (wire-name dotted path, message) pairs."""
    return [FieldError(_field_path(tuple(e["loc"])), _message(e)) for e in error.errors()]


def parse_object(kind: str, obj: Mapping[str, Any]) -> FlotillaObject:
    """Validate a Flotilla object given as a dict (as read from the API server or YAML).

    Raises `InvalidObjectError` (a `ValueError`) naming every offending field.
    """
    model = MODELS.get(kind)
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if model is None:
        known = ", ".join(sorted(MODELS))
        raise InvalidObjectError(kind, name, [FieldError("kind", f"not a Flotilla kind ({known})")])
    return parse_as(model, obj)


def parse_as(model: type[ObjectT], obj: Mapping[str, Any]) -> ObjectT:
    """`parse_object` for a statically known kind: ``parse_as(PlacementPolicy, obj)``."""
    kind = str(model.model_fields["kind"].default)
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if obj.get("kind", kind) != kind:
        raise InvalidObjectError(
            kind, name, [FieldError("kind", f"object is a {obj.get('kind')!r}, expected {kind!r}")]
        )
    try:
        return model.model_validate(obj)
    except ValidationError as error:
        raise InvalidObjectError(kind, name, field_errors(error)) from None


# --- annotation payloads ----------------------------------------------------------


def compact_json(value: Any) -> str:
    """JSON as Flotilla writes it into annotations: compact, stable, UTF-8 kept readable."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class DependencyEntry(_Spec):
    """One entry of ``flotilla.io/dependencies``.

    ``detected: false`` entries are the user's and are kept verbatim; they may name
    objects Flotilla does not schedule itself.
    """

    model_config = ConfigDict(frozen=True)

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None
    detected: bool = False

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind.from_api_version(self.api_version, self.kind)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity of the referenced object, regardless of who declared it."""
        return (self.api_version, self.kind, self.namespace or "", self.name)


class _Annotation(_Spec):
    model_config = ConfigDict(frozen=True)


def parse_dependencies(value: str) -> list[DependencyEntry]:
    """The ``flotilla.io/dependencies`` annotation value as entries.

    Raises `ValueError` with the entry index when it is not a JSON list of entries.
    """
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"{DEPENDENCIES_ANNOTATION}: not JSON ({error})") from None
    if not isinstance(raw, list):
        raise ValueError(f"{DEPENDENCIES_ANNOTATION}: expected a JSON list of entries")
    entries = []
    for index, item in enumerate(raw):
        try:
            entries.append(DependencyEntry.model_validate(item))
        except ValidationError as error:
            details = "; ".join(
                f"{e.field}: {e.message}" if e.field else e.message for e in field_errors(error)
            )
            raise ValueError(f"{DEPENDENCIES_ANNOTATION}[{index}]: {details}") from None
    return entries


def dump_dependencies(entries: Iterable[DependencyEntry]) -> str:
    """The annotation value for ``entries``, in the order given."""
    return compact_json([e.model_dump(mode="json", exclude_none=True) for e in entries])


def parse_transformations(value: str) -> list[str]:
    """Names in ``flotilla.io/transformations: a, b``: in order, blanks and repeats dropped."""
    names = (name.strip() for name in value.split(","))
    return list(dict.fromkeys(name for name in names if name))


class PlacementClusterEntry(_Annotation):
    cluster: str = Field(min_length=1)
    replicas: int | None = Field(default=None, ge=0)
    """None for strategies without replicas (copy of a non-workload, as-needed)."""
    state: PlacementState = PlacementState.ACTIVE


class PlacementAnnotation(_Annotation):
    """``flotilla.io/placement``: where the object runs and why."""

    clusters: list[PlacementClusterEntry] = Field(default_factory=list)
    decision: str = ""
    reason: str = ""

    def to_annotation(self) -> str:
        return compact_json(self.model_dump(mode="json", exclude_none=True))

    @classmethod
    def from_annotation(cls, value: str) -> PlacementAnnotation:
        return cls.model_validate_json(value)


class FailoverRecord(_Annotation):
    """One entry of ``flotilla.io/failover-history``."""

    from_cluster: str = Field(alias="from")
    to_cluster: str | None = Field(default=None, alias="to")
    at: datetime
    reason: str = ""
