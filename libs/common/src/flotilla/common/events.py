"""The events Flotilla's services exchange over JetStream, and their envelope.

Every message on the bus is one `Envelope`: who produced it, when, for which
object (`key`, `uid`), at which `generation`/`revision`, and one typed payload.
Payloads carry the *full desired state* for their key, never a delta, so a
handler can process any event twice, late or out of order and converge (see
docs/architecture.md, "Rules every service follows").

Names follow the house rule: events are past tense (`PlacementDecided`), commands
imperative (`RescheduleRequested` is the one command, phrased as the request that
was made).

**Versions and rolling upgrades.** The envelope has its own ``schema_version``
and every payload type its own ``version`` (`Payload.VERSION`), so one event type
can change incompatibly without touching the others. Within a version, changes
only *add optional fields*; decoding ignores fields it does not know (at every
depth), so a replica still running the previous release consumes what a newer
producer sends. A version this code does not read (an incompatible change, or an
event type it has never heard of) raises `InvalidEvent` naming both versions, and
the bus dead-letters the message with that message as the reason.

Strict where it protects us: wrong types and values are still rejected whole,
with every problem listed, never a half-parsed model; and models built in this
process forbid unknown fields, so what we *produce* never carries one. Policy and
interpreter specs travel as the validated `flotilla.common.api` models: the
watcher validates a policy once, at the edge, and consumers use the typed spec.
"""

from __future__ import annotations

import hashlib
import json
import typing
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from flotilla.common.api import PlacementPolicySpec, ResourceInterpreterSpec, Strategy
from flotilla.common.api import PlacementState as WorkState
from flotilla.common.errors import InvalidEvent, InvalidObject
from flotilla.common.interpreters import Follow

SCHEMA_VERSION = 1
"""The envelope's version; each payload type has its own (`Payload.VERSION`)."""


JsonObject = dict[str, Any]
Requests = dict[str, int]
"""Resource name → amount, CPU in millicores, everything else in base units."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ObjectRef(_Model):
    """Identifies one Kubernetes object in the hub."""

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None

    @property
    def key(self) -> str:
        """Stable string key: ``apps/v1/Deployment/default/web`` (``_`` for no namespace)."""
        return f"{self.api_version}/{self.kind}/{self.namespace or '_'}/{self.name}"

    @classmethod
    def of(cls, obj: JsonObject) -> ObjectRef:
        """The reference of a raw Kubernetes object."""
        metadata = obj.get("metadata") or {}
        return cls(
            api_version=obj.get("apiVersion", ""),
            kind=obj.get("kind", ""),
            name=metadata.get("name", ""),
            namespace=metadata.get("namespace") or None,
        )


class Component(_Model):
    """One pod template of a multi-component workload (all go to one cluster)."""

    name: str
    replicas: int = Field(ge=0)
    requests: Requests = Field(default_factory=dict)


class Dependency(_Model):
    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    namespace: str | None = None
    detected: bool = True


class PolicyRef(_Model):
    kind: Literal["PlacementPolicy", "ClusterPlacementPolicy"]
    name: str
    namespace: str | None = None


_PlacementStateJson = Annotated[WorkState, PlainSerializer(str, return_type=str, when_used="json")]
"""A placement's state, written to JSON as the string it is (a `StrEnum`): pydantic
reads an enum's ``value`` through a Python descriptor, and a copy object's decision
carries a state per cluster, twice (record and event). Same JSON either way."""


class ClusterPlacement(_Model):
    cluster: str
    replicas: int | None = Field(default=None, ge=0)
    state: _PlacementStateJson = WorkState.ACTIVE


# --- payloads -------------------------------------------------------------------


class Payload(_Model):
    """Base of every event payload: its type name and the version of its schema.

    Bump `VERSION` only for an incompatible change (a field removed, renamed,
    retyped or made required), together with the default of ``version``; adding an
    optional field keeps the version. An event without ``version`` is version 1,
    what producers sent before payloads were versioned.
    """

    VERSION: ClassVar[int] = 1

    version: int = Field(default=1, ge=1)


class ResourceObserved(Payload):
    """The watcher saw a user object (selected by a policy) change in the hub."""

    type: Literal["ResourceObserved"] = "ResourceObserved"
    ref: ObjectRef
    object: JsonObject
    deleted: bool = False
    policy: PolicyRef | None = None
    policy_spec: PlacementPolicySpec | None = None
    interpreter: JsonObject | None = Field(
        default=None,
        description="the hub's ResourceInterpreter for this object's type, if one is "
        "declared; carried so that analysis uses exactly the interpreter the watcher "
        "saw, and an interpreter change re-analyses the objects it governs",
    )


class ClusterObserved(Payload):
    """The watcher saw a `Cluster` object change (spec, labels, status)."""

    type: Literal["ClusterObserved"] = "ClusterObserved"
    cluster: str
    object: JsonObject
    deleted: bool = False


class ConfigChanged(Payload):
    """A policy, interpreter or transformation changed in the hub."""

    type: Literal["ConfigChanged"] = "ConfigChanged"
    ref: ObjectRef
    object: JsonObject
    deleted: bool = False


class ResourceAnalyzed(Payload):
    """The dependency detector interpreted an object and listed what it needs."""

    type: Literal["ResourceAnalyzed"] = "ResourceAnalyzed"
    ref: ObjectRef
    object: JsonObject
    deleted: bool = False
    strategy: Strategy
    replicas: int | None = Field(default=None, ge=0)
    requests: Requests = Field(default_factory=dict)
    components: list[Component] = Field(default_factory=list)
    dependencies: list[Dependency] = Field(default_factory=list)
    policy: PolicyRef | None = None
    policy_spec: PlacementPolicySpec | None = None
    interpreter: ResourceInterpreterSpec | None = Field(
        default=None,
        description="the interpreter the object was read with: where its replicas, pod "
        "templates and components live (the transformer renders a cluster's share with "
        "it), how its status folds back (statusAggregation), its default strategy and "
        "its follows rules; None only from producers older than this field",
    )
    follows: list[Follow] = Field(
        default_factory=list,
        description="the interpreter's follows rules resolved against the object: what "
        "an as-needed object goes along with",
    )

    @property
    def default_strategy(self) -> Strategy:
        """The strategy of the object's type, before annotation and policy."""
        return self.interpreter.strategy if self.interpreter is not None else self.strategy


class PlacementDecided(Payload):
    """The scheduler decided (or re-decided) where an object runs."""

    type: Literal["PlacementDecided"] = "PlacementDecided"
    ref: ObjectRef
    decision_id: str
    clusters: list[ClusterPlacement]
    previous: list[ClusterPlacement] = Field(default_factory=list)
    reason: str = ""
    rejections: dict[str, list[str]] = Field(
        default_factory=dict,
        description="cluster → why it was not chosen (what older producers send; "
        "current ones send `rejected`)",
    )
    rejected: dict[str, list[str]] = Field(
        default_factory=dict,
        description="why clusters were not chosen → those clusters, each reason once; "
        "what `describe` shows",
    )
    deleted: bool = False

    def rejected_clusters(self) -> list[str]:
        """Every cluster that was not chosen, sorted, whichever shape the producer sent."""
        names = set(self.rejections)
        for clusters in self.rejected.values():
            names.update(clusters)
        return sorted(names)

    def reasons_for(self, cluster: str) -> list[str]:
        """Why `cluster` was not chosen, whichever shape the producer sent."""
        found = list(self.rejections.get(cluster, ()))
        found.extend(reason for reason, names in self.rejected.items() if cluster in names)
        return found


class WorkRendered(Payload):
    """The transformer rendered the manifest for one (object, cluster) pair.

    `manifest` is None when the work must be removed from that cluster. `ref` is
    the object the manifest is (a user object, or an ``as-needed`` dependency of
    one); the event's key is `work_key` (per work, ordered).
    """

    type: Literal["WorkRendered"] = "WorkRendered"
    ref: ObjectRef
    cluster: str
    decision_id: str
    manifest: JsonObject | None
    state: WorkState = WorkState.ACTIVE
    dependency_of: list[ObjectRef] = Field(
        default_factory=list,
        description="for an as-needed dependency: non-empty while some placed object "
        "needs it on this cluster; names the dependents known when the work was rendered, "
        "at most a few (the first 8 by key), so the event stays small whatever the fan-in "
        "(empty for a user object's own work and for a removal)",
    )


def work_key(ref: ObjectRef, cluster: str) -> str:
    """The bus key of one (object, cluster) work: its events are handled in order."""
    return f"{ref.key}@{cluster}"


class MemberStatusObserved(Payload):
    """The syncer saw the status of an applied object change on a member cluster."""

    type: Literal["MemberStatusObserved"] = "MemberStatusObserved"
    ref: ObjectRef
    cluster: str
    exists: bool = True
    status: JsonObject = Field(default_factory=dict)
    observed_generation: int | None = Field(
        default=None, description="the member status's observedGeneration"
    )
    generation: int | None = Field(
        default=None, description="the member object's metadata.generation"
    )
    hub_generation: int | None = Field(
        default=None, description="the hub generation the applied work was rendered from"
    )
    ready: bool | None = Field(
        default=None,
        description="whether the member copy is available (per its kind), None when unknown",
    )
    decision_id: str = ""


class CapacityChanged(Payload):
    """The syncer wrote a new capacity record for a cluster into Redis."""

    type: Literal["CapacityChanged"] = "CapacityChanged"
    cluster: str
    available: Requests
    allocatable: Requests


class ClusterHeartbeat(Payload):
    type: Literal["ClusterHeartbeat"] = "ClusterHeartbeat"
    cluster: str
    ready: bool
    message: str = ""


class RescheduleRequested(Payload):
    """A command to the scheduler: place this object again (drain, failover, retry)."""

    type: Literal["RescheduleRequested"] = "RescheduleRequested"
    ref: ObjectRef
    reason: str
    avoid_clusters: list[str] = Field(default_factory=list)
    release_retiring: list[str] = Field(
        default_factory=list,
        description="clusters whose Retiring copy may now be removed (make-before-break "
        "done: the new copies are ready), sent by the drain coordinator",
    )


AnyPayload = (
    ResourceObserved
    | ClusterObserved
    | ConfigChanged
    | ResourceAnalyzed
    | PlacementDecided
    | WorkRendered
    | MemberStatusObserved
    | CapacityChanged
    | ClusterHeartbeat
    | RescheduleRequested
)
EVENT_PAYLOADS: tuple[type[AnyPayload], ...] = typing.get_args(AnyPayload)
EVENT_TYPES: tuple[str, ...] = tuple(cls.__name__ for cls in EVENT_PAYLOADS)


class Envelope(_Model):
    """What travels on the bus: identity, ordering data and one payload."""

    id: str = Field(min_length=1, description="deterministic; becomes the Nats-Msg-Id")
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    key: str = Field(min_length=1, description="the per-key ordering key")
    uid: str = ""
    generation: int = Field(default=0, ge=0)
    revision: int = Field(default=0, ge=0, description="hub resourceVersion acted on")
    produced_at: datetime
    producer: str
    traceparent: str | None = None
    payload: Annotated[AnyPayload, Field(discriminator="type")]

    @property
    def type(self) -> str:
        return self.payload.type


def event_id(*parts: object) -> str:
    """A deterministic id from the parts that make two events "the same"."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:32]


def envelope(
    payload: AnyPayload,
    *,
    key: str,
    producer: str,
    uid: str = "",
    generation: int = 0,
    revision: int = 0,
    dedupe: tuple[object, ...] = (),
    produced_at: datetime | None = None,
) -> Envelope:
    """Wrap a payload. The id is derived from type, key, uid, revision and `dedupe`,
    so re-publishing the same observation is deduplicated by JetStream."""
    return Envelope(
        id=event_id(payload.type, key, uid, generation, revision, *dedupe),
        key=key,
        uid=uid,
        generation=generation,
        revision=revision,
        produced_at=produced_at or datetime.now(UTC),
        producer=producer,
        payload=payload,
    )


_ENVELOPE = TypeAdapter(Envelope)
PAYLOAD_TYPES: dict[str, type[AnyPayload]] = {cls.__name__: cls for cls in EVENT_PAYLOADS}


def encode(event: Envelope) -> bytes:
    """The event as JSON. pydantic's serializer stops at about 250 levels of nesting
    and Kubernetes objects may nest deeper (a custom resource's spec is anything), so
    such an event is serialized by the standard library instead (its limit is the
    interpreter's recursion limit); one nested deeper still is `InvalidObject`
    (``ObjectTooDeep``). The common path stays pydantic's."""
    try:
        return event.model_dump_json(by_alias=True, exclude_none=False).encode()
    except PydanticSerializationError as exc:
        if "depth" not in str(exc):
            raise
    try:
        plain = event.model_dump(mode="python", by_alias=True, exclude_none=False)
        return json.dumps(plain, default=to_jsonable_python, separators=(",", ":")).encode()
    except RecursionError as exc:
        raise InvalidObject(
            f"{event.key}: nested too deeply to carry as an event", reason="ObjectTooDeep"
        ) from exc


def decode(data: bytes) -> Envelope:
    """Parse bytes from the bus, or raise `InvalidEvent` saying everything that is wrong.

    Fields this code does not know are ignored; a version it does not read is
    refused with a message naming that version and the one read here.

    pydantic's JSON parser refuses nesting deeper than about 200 levels; such a
    message (a deeply nested object that `encode` let through) is parsed by the
    standard library and then validated, which only the rare deep event pays for.
    """
    try:
        event = _ENVELOPE.validate_json(data, extra="ignore")
    except ValidationError as exc:
        if not any("recursion limit" in err["msg"] for err in exc.errors(include_url=False)):
            # A newer, incompatible producer usually fails validation too: say why.
            _check_versions(_raw_versions(data))
            raise InvalidEvent(f"not a valid Flotilla event: {_problems(exc)}") from exc
        event = _decode_deep(data)
    _check_versions((event.schema_version, event.type, event.payload.version))
    return event


def _decode_deep(data: bytes) -> Envelope:
    try:
        parsed = json.loads(data)
    except (RecursionError, ValueError) as exc:
        raise InvalidEvent(f"not a valid Flotilla event: {exc}") from exc
    try:
        return _ENVELOPE.validate_python(parsed, extra="ignore")
    except ValidationError as exc:
        raise InvalidEvent(f"not a valid Flotilla event: {_problems(exc)}") from exc


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors(include_url=False)
    )


def _raw_versions(data: bytes) -> tuple[object, object, object]:
    """(envelope version, payload type, payload version) as sent, where readable."""
    try:
        wire = json.loads(data)
    except (RecursionError, ValueError):
        return (None, None, None)
    if not isinstance(wire, dict):
        return (None, None, None)
    payload = wire.get("payload")
    if not isinstance(payload, dict):
        return (wire.get("schema_version"), None, None)
    return (wire.get("schema_version"), payload.get("type"), payload.get("version", 1))


def _check_versions(versions: tuple[object, object, object]) -> None:
    envelope_version, event_type, payload_version = versions
    if isinstance(envelope_version, int) and envelope_version != SCHEMA_VERSION:
        raise InvalidEvent(
            f"envelope schema version {envelope_version} is not supported: this consumer "
            f"reads envelope version {SCHEMA_VERSION}"
        )
    if not isinstance(event_type, str):
        return
    model = PAYLOAD_TYPES.get(event_type)
    if model is None:
        known = ", ".join(PAYLOAD_TYPES)
        raise InvalidEvent(
            f"unknown event type {event_type!r} (version {payload_version}): this consumer "
            f"reads {known}"
        )
    if isinstance(payload_version, int) and payload_version != model.VERSION:
        raise InvalidEvent(
            f"{event_type} version {payload_version} is not supported: this consumer "
            f"reads {event_type} version {model.VERSION}"
        )
