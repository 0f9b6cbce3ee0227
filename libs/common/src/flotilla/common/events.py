"""The events Flotilla's services exchange over JetStream, and their envelope.

Every message on the bus is one `Envelope`: who produced it, when, for which
object (`key`, `uid`), at which `generation`/`revision`, and one typed payload.
Payloads carry the *full desired state* for their key, never a delta, so a
handler can process any event twice, late or out of order and converge (see
ARCHITECTURE.md, principle 1).

Names follow the house rule: events are past tense (`PlacementDecided`), commands
imperative (`RescheduleRequested` is the one command, phrased as the request that
was made). The schema is versioned by `schema_version`; a consumer rejects a
version it does not know instead of guessing.

Decoding is strict: unknown fields, unknown event types or a wrong schema
version raise `InvalidEvent` with every problem listed, never a half-parsed model.
"""

from __future__ import annotations

import hashlib
import json
import typing
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from flotilla.common.api import PlacementState as WorkState
from flotilla.common.api import Strategy
from flotilla.common.errors import InvalidEvent, InvalidObject

SCHEMA_VERSION = 1


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


class ClusterPlacement(_Model):
    cluster: str
    replicas: int | None = Field(default=None, ge=0)
    state: WorkState = WorkState.ACTIVE


# --- payloads -------------------------------------------------------------------


class ResourceObserved(_Model):
    """The watcher saw a user object (selected by a policy) change in the hub."""

    type: Literal["ResourceObserved"] = "ResourceObserved"
    ref: ObjectRef
    object: JsonObject
    deleted: bool = False
    policy: PolicyRef | None = None
    policy_spec: JsonObject | None = None
    interpreter: JsonObject | None = Field(
        default=None,
        description="the hub's ResourceInterpreter for this object's type, if one is "
        "declared; carried so that analysis uses exactly the interpreter the watcher "
        "saw, and an interpreter change re-analyses the objects it governs",
    )


class ClusterObserved(_Model):
    """The watcher saw a `Cluster` object change (spec, labels, status)."""

    type: Literal["ClusterObserved"] = "ClusterObserved"
    cluster: str
    object: JsonObject
    deleted: bool = False


class ConfigChanged(_Model):
    """A policy, interpreter or transformation changed in the hub."""

    type: Literal["ConfigChanged"] = "ConfigChanged"
    ref: ObjectRef
    object: JsonObject
    deleted: bool = False


class ResourceAnalyzed(_Model):
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
    policy_spec: JsonObject | None = None


class PlacementDecided(_Model):
    """The scheduler decided (or re-decided) where an object runs."""

    type: Literal["PlacementDecided"] = "PlacementDecided"
    ref: ObjectRef
    decision_id: str
    clusters: list[ClusterPlacement]
    previous: list[ClusterPlacement] = Field(default_factory=list)
    reason: str = ""
    rejections: dict[str, list[str]] = Field(
        default_factory=dict,
        description="cluster → why it was not chosen; what `describe` shows",
    )
    deleted: bool = False


class WorkRendered(_Model):
    """The transformer rendered the manifest for one (object, cluster) pair.

    `manifest` is None when the work must be removed from that cluster.
    """

    type: Literal["WorkRendered"] = "WorkRendered"
    ref: ObjectRef
    cluster: str
    decision_id: str
    manifest: JsonObject | None
    state: WorkState = WorkState.ACTIVE


class MemberStatusObserved(_Model):
    """The syncer saw the status of an applied object change on a member cluster."""

    type: Literal["MemberStatusObserved"] = "MemberStatusObserved"
    ref: ObjectRef
    cluster: str
    exists: bool = True
    status: JsonObject = Field(default_factory=dict)
    observed_generation: int | None = None


class CapacityChanged(_Model):
    """The syncer wrote a new capacity record for a cluster into Redis."""

    type: Literal["CapacityChanged"] = "CapacityChanged"
    cluster: str
    available: Requests
    allocatable: Requests


class ClusterHeartbeat(_Model):
    type: Literal["ClusterHeartbeat"] = "ClusterHeartbeat"
    cluster: str
    ready: bool
    message: str = ""


class RescheduleRequested(_Model):
    """A command to the scheduler: place this object again (drain, failover, retry)."""

    type: Literal["RescheduleRequested"] = "RescheduleRequested"
    ref: ObjectRef
    reason: str
    avoid_clusters: list[str] = Field(default_factory=list)


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
    schema_version: Literal[1] = 1
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

    pydantic's JSON parser refuses nesting deeper than about 200 levels; such a
    message (a deeply nested object that `encode` let through) is parsed by the
    standard library and then validated, which only the rare deep event pays for.
    """
    try:
        return _ENVELOPE.validate_json(data)
    except ValidationError as exc:
        if not any("recursion limit" in err["msg"] for err in exc.errors(include_url=False)):
            raise InvalidEvent(f"not a valid Flotilla event: {_problems(exc)}") from exc
    try:
        parsed = json.loads(data)
    except (RecursionError, ValueError) as exc:
        raise InvalidEvent(f"not a valid Flotilla event: {exc}") from exc
    try:
        return _ENVELOPE.validate_python(parsed)
    except ValidationError as exc:
        raise InvalidEvent(f"not a valid Flotilla event: {_problems(exc)}") from exc


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors(include_url=False)
    )
