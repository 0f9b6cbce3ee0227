"""What the watcher publishes for one observed hub object, and what it remembers.

The watcher turns every watch event into at most one bus event. This module makes
that decision, purely: it takes the object, the current policies and the durable
`Record` of what was last published for the object's key, and returns a `Change`
(the payload to publish and the record to keep) or None.

**No feedback loops.** Flotilla writes to the very objects it watches (the
detector's ``flotilla.io/dependencies`` entries, the aggregator's
``flotilla.io/placement`` and ``flotilla.io/cluster-status``, the drain
coordinator's ``flotilla.io/failover-history``, and ``status``). Each such write
is a MODIFIED watch event, and republishing it would restart the pipeline that
made it. So a user object is published only when its *fingerprint* changes: a
hash over

* the object without ``status`` and without the metadata the API server or
  Flotilla change on every write (``resourceVersion``, ``managedFields``,
  ``selfLink``, the Flotilla-owned annotations above),
* the ``flotilla.io/dependencies`` annotation reduced to the user's own entries
  (``detected: false``; an unparseable value is kept verbatim, so fixing it is a
  change),
* ``metadata.generation``, ``uid``, labels and every other annotation as they are,
* and the governing policy's reference and spec (a policy edit re-publishes the
  objects it governs with the new spec).

So spec edits (generation), label and user-annotation edits, re-creation (uid)
and policy changes publish; Flotilla's own annotation and status writes do not.

**Policy selection.** Policies arrive here validated (`matching.Policy`: an
invalid one is reported by the service and governs nothing), and events carry
the typed spec, so no later stage validates a policy again. An object no policy
selects is not published. One that was
published and is no longer selected (its policy was deleted, its labels changed)
is published once more with ``policy: null`` so the later stages can withdraw its
placement, and then forgotten.

**Config objects** (`Cluster`, policies, interpreters, transformations) are
published on every change but a bare ``resourceVersion``/``managedFields`` bump;
a `Cluster`'s status (heartbeats, capacity, conditions) counts, the others'
status does not.

**What events carry**: the object as the hub has it, without
``metadata.managedFields`` (server-side apply bookkeeping, often larger than the
object itself, and of no use to any later stage): `publishable`.

**Records** are small on purpose (no full object): the key, uid, the last
revision, the fingerprint and a stub of identifying metadata — what is needed to
publish a deletion noticed only by re-listing after downtime. Such a deletion
event therefore carries the stub, not the last full object.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from flotilla.common import events
from flotilla.common.api import (
    CLUSTER_STATUS_ANNOTATION,
    DEPENDENCIES_ANNOTATION,
    FAILOVER_HISTORY_ANNOTATION,
    PLACEMENT_ANNOTATION,
    GroupVersionKind,
    PlacementPolicy,
)
from flotilla.common.events import ObjectRef, PolicyRef
from flotilla.watcher import matching
from flotilla.watcher.matching import Policy

JsonObject = dict[str, Any]

FLOTILLA_OWNED_ANNOTATIONS = frozenset(
    {PLACEMENT_ANNOTATION, CLUSTER_STATUS_ANNOTATION, FAILOVER_HISTORY_ANNOTATION}
)
"""Written only by Flotilla; never a reason to publish. (The dependencies
annotation is shared: its user entries count, its detected ones do not.)"""

VOLATILE_METADATA = ("resourceVersion", "managedFields", "selfLink")
"""Change on every write, whoever makes it."""

CLUSTER_KIND = "Cluster"
POLICY_KINDS = frozenset({"PlacementPolicy", "ClusterPlacementPolicy"})
CONFIG_KINDS = frozenset(
    {*POLICY_KINDS, "ResourceInterpreter", "Transformation", "ClusterTransformation"}
)


class Record(BaseModel):
    """What the watcher last published for one key (kept durably between runs)."""

    model_config = ConfigDict(frozen=True)

    key: str
    api_version: str
    kind: str
    uid: str
    revision: int
    fingerprint: str
    stub: JsonObject
    """apiVersion, kind and identifying metadata: the object of a late deletion event."""
    policy: PolicyRef | None = None

    @property
    def gvk(self) -> GroupVersionKind:
        return GroupVersionKind.from_api_version(self.api_version, self.kind)


@dataclass(frozen=True)
class Change:
    """One thing to publish, and what to remember afterwards (None: forget the key)."""

    payload: events.AnyPayload
    key: str
    uid: str
    generation: int
    revision: int
    fingerprint: str
    record: Record | None

    def envelope(self, producer: str) -> events.Envelope:
        # The fingerprint is part of the id: an unchanged object re-published with
        # another policy (same revision) must not be dropped as a duplicate.
        return events.envelope(
            self.payload,
            key=self.key,
            producer=producer,
            uid=self.uid,
            generation=self.generation,
            revision=self.revision,
            dedupe=(self.fingerprint,),
        )


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def revision_of(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as a number (0 when absent or not numeric)."""
    value = _metadata(obj).get("resourceVersion")
    try:
        return int(str(value))
    except ValueError:
        return 0


def gvk_of(obj: Mapping[str, Any]) -> GroupVersionKind:
    return GroupVersionKind.from_api_version(str(obj.get("apiVersion", "")), str(obj.get("kind")))


def _user_dependencies(value: str) -> Any:
    try:
        entries = json.loads(value)
    except ValueError:
        return value
    if not isinstance(entries, list):
        return value
    return [e for e in entries if not (isinstance(e, Mapping) and e.get("detected") is True)]


def user_view(obj: Mapping[str, Any], *, keep_status: bool = False) -> JsonObject:
    """The object as far as its owner's intent goes (see the module docstring)."""
    view: JsonObject = {k: v for k, v in obj.items() if keep_status or k != "status"}
    metadata = {k: v for k, v in _metadata(obj).items() if k not in VOLATILE_METADATA}
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping):
        kept: JsonObject = {
            k: v for k, v in annotations.items() if k not in FLOTILLA_OWNED_ANNOTATIONS
        }
        if isinstance(kept.get(DEPENDENCIES_ANNOTATION), str):
            user_entries = _user_dependencies(kept[DEPENDENCIES_ANNOTATION])
            # Only detected entries is the same as no annotation at all.
            if user_entries == []:
                del kept[DEPENDENCIES_ANNOTATION]
            else:
                kept[DEPENDENCIES_ANNOTATION] = user_entries
        metadata["annotations"] = kept
    if not metadata.get("annotations"):
        metadata.pop("annotations", None)
    view["metadata"] = metadata
    return view


def publishable(obj: Mapping[str, Any]) -> JsonObject:
    """The object as events carry it: ``metadata.managedFields`` left out."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return dict(obj)
    kept = {k: v for k, v in metadata.items() if k != "managedFields"}
    return {**obj, "metadata": kept}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def policy_ref(policy: Policy) -> PolicyRef:
    namespace = policy.metadata.namespace if isinstance(policy, PlacementPolicy) else None
    return PolicyRef(kind=policy.kind, name=policy.metadata.name, namespace=namespace)


def _policy_json(policy: Policy) -> JsonObject:
    return policy.spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def resource_fingerprint(
    obj: Mapping[str, Any], policy: Policy | None, interpreter: JsonObject | None = None
) -> str:
    governing = None if policy is None else [policy_ref(policy).model_dump(), _policy_json(policy)]
    interpreted_by = None if interpreter is None else interpreter.get("spec")
    return _digest({"object": user_view(obj), "policy": governing, "interpreter": interpreted_by})


def config_fingerprint(obj: Mapping[str, Any]) -> str:
    return _digest(user_view(obj, keep_status=obj.get("kind") == CLUSTER_KIND))


def stub(obj: Mapping[str, Any]) -> JsonObject:
    metadata = _metadata(obj)
    kept = {k: metadata[k] for k in ("name", "namespace", "uid", "labels") if k in metadata}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}


def _record(obj: Mapping[str, Any], fingerprint: str, policy: PolicyRef | None) -> Record:
    ref = ObjectRef.of(dict(obj))
    return Record(
        key=ref.key,
        api_version=ref.api_version,
        kind=ref.kind,
        uid=str(_metadata(obj).get("uid") or ""),
        revision=revision_of(obj),
        fingerprint=fingerprint,
        stub=stub(obj),
        policy=policy,
    )


def _generation(obj: Mapping[str, Any]) -> int:
    generation = _metadata(obj).get("generation")
    return generation if isinstance(generation, int) and generation >= 0 else 0


def is_stale(obj: Mapping[str, Any], known: Record | None) -> bool:
    """An observation older than what was already published for the same object
    (a re-list racing the watch): never let it overwrite the newer one."""
    if known is None or known.uid != str(_metadata(obj).get("uid") or ""):
        return False
    return revision_of(obj) < known.revision


def resource_observed(
    obj: Mapping[str, Any],
    policies: Iterable[Policy],
    known: Record | None,
    interpreter: JsonObject | None = None,
) -> Change | None:
    """A user object was added or modified (or re-listed); `interpreter` is the hub's
    ResourceInterpreter for its type, if any (a change of it is a change of the object's
    analysis, so it is part of the fingerprint)."""
    if is_stale(obj, known):
        return None
    ref = ObjectRef.of(dict(obj))
    policy = matching.select_policy(obj, policies)
    if policy is None:
        if known is None:
            return None
        fingerprint = resource_fingerprint(obj, None)
        payload: events.AnyPayload = events.ResourceObserved(ref=ref, object=publishable(obj))
        return _change(payload, obj, fingerprint, None)
    fingerprint = resource_fingerprint(obj, policy, interpreter)
    record = _record(obj, fingerprint, policy_ref(policy))
    if known is not None and known.fingerprint == fingerprint and known.uid == record.uid:
        return None
    payload = events.ResourceObserved(
        ref=ref,
        object=publishable(obj),
        policy=record.policy,
        policy_spec=policy.spec,
        interpreter=interpreter,
    )
    return _change(payload, obj, fingerprint, record)


def resource_deleted(
    obj: Mapping[str, Any],
    known: Record | None,
    revision: int,
    policies: Iterable[Policy] = (),
) -> Change | None:
    """A user object is gone (a DELETED watch event, or missing from a re-list).

    It names the policy that governed it, with that policy's spec while the policy
    still exists.
    """
    if known is None:
        return None
    spec = next(
        (p.spec for p in policies if known.policy is not None and policy_ref(p) == known.policy),
        None,
    )
    payload = events.ResourceObserved(
        ref=ObjectRef.of(dict(obj)),
        object=publishable(obj),
        deleted=True,
        policy=known.policy,
        policy_spec=spec,
    )
    return _change(payload, obj, "deleted", None, revision=revision)


def config_observed(obj: Mapping[str, Any], known: Record | None) -> Change | None:
    """A `Cluster` or a policy/interpreter/transformation was added or modified."""
    if is_stale(obj, known):
        return None
    fingerprint = config_fingerprint(obj)
    record = _record(obj, fingerprint, None)
    if known is not None and known.fingerprint == fingerprint and known.uid == record.uid:
        return None
    return _change(_config_payload(obj, deleted=False), obj, fingerprint, record)


def config_deleted(obj: Mapping[str, Any], known: Record | None, revision: int) -> Change | None:
    if known is None:
        return None
    return _change(_config_payload(obj, deleted=True), obj, "deleted", None, revision=revision)


def _config_payload(obj: Mapping[str, Any], *, deleted: bool) -> events.AnyPayload:
    if obj.get("kind") == CLUSTER_KIND:
        name = str(_metadata(obj).get("name", ""))
        return events.ClusterObserved(cluster=name, object=publishable(obj), deleted=deleted)
    return events.ConfigChanged(
        ref=ObjectRef.of(dict(obj)), object=publishable(obj), deleted=deleted
    )


def _change(
    payload: events.AnyPayload,
    obj: Mapping[str, Any],
    fingerprint: str,
    record: Record | None,
    *,
    revision: int | None = None,
) -> Change:
    return Change(
        payload=payload,
        key=ObjectRef.of(dict(obj)).key,
        uid=str(_metadata(obj).get("uid") or ""),
        generation=_generation(obj),
        revision=revision_of(obj) if revision is None else revision,
        fingerprint=fingerprint,
        record=record,
    )
