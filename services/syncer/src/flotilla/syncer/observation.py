"""What the syncer reads off a member object: readiness, the status it reports, drift.

Pure functions over plain dicts, so the rules can be tested without a cluster:

- `ready`: whether a member copy is available, per kind (Deployment, ReplicaSet,
  StatefulSet: ``availableReplicas >= replicas``; DaemonSet: ``numberAvailable >=
  desiredNumberScheduled``; Job: complete or succeeded; Pod: the Ready
  condition; anything else: it exists).
- `observed`: the `MemberStatusObserved` payload for a member object (or for its
  absence), and `fingerprint`, what makes two reports "the same" for dedup.
- `drifted`: whether the live object no longer carries a field Flotilla applied.
  The manifest is exactly the set of fields Flotilla manages (server-side apply
  with field manager ``flotilla``), so every field in it must read back as
  applied; fields the server or other controllers add are not drift. A caller
  that checked an object at one ``metadata.generation`` needs only its metadata
  compared again while the generation stays (a status update changes nothing else).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from flotilla.common.api import (
    DECISION_ANNOTATION,
    HUB_GENERATION_ANNOTATION,
    ORIGIN_ANNOTATION,
    ORIGIN_LABEL,
)
from flotilla.common.events import MemberStatusObserved, ObjectRef

JsonObject = dict[str, Any]


_SERVER_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "ownerReferences",
        "finalizers",
    }
)


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = metadata(obj).get("labels")
    return found if isinstance(found, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = metadata(obj).get("annotations")
    return found if isinstance(found, Mapping) else {}


def is_flotillas(obj: Mapping[str, Any], hub_key: str) -> bool:
    """Whether Flotilla may touch (delete) this member object on behalf of `hub_key`:
    it carries the origin label and its origin annotation names that object."""
    if ORIGIN_LABEL not in labels(obj):
        return False
    return annotations_of(obj).get(ORIGIN_ANNOTATION) == hub_key


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _condition(status: Mapping[str, Any], type_: str) -> str | None:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            return str(condition.get("status"))
    return None


def ready(obj: Mapping[str, Any]) -> bool:
    """Whether the member copy is available, by its kind (see the module docstring)."""
    kind = obj.get("kind")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(status, Mapping)
    if kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        wanted = spec.get("replicas")
        replicas = 1 if wanted is None else _int(wanted)
        generation = metadata(obj).get("generation")
        observed = status.get("observedGeneration")
        if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
            return False
        return _int(status.get("availableReplicas")) >= replicas
    if kind == "DaemonSet":
        desired = _int(status.get("desiredNumberScheduled"))
        return _int(status.get("numberAvailable")) >= desired
    if kind == "Job":
        if _condition(status, "Complete") == "True":
            return True
        completions = spec.get("completions")
        wanted = 1 if completions is None else _int(completions)
        return _int(status.get("succeeded")) >= wanted
    if kind == "Pod":
        return _condition(status, "Ready") == "True"
    return True


def _hub_generation(obj: Mapping[str, Any]) -> int | None:
    raw = annotations_of(obj).get(HUB_GENERATION_ANNOTATION)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def observed(ref: ObjectRef, cluster: str, obj: Mapping[str, Any] | None) -> MemberStatusObserved:
    """The report of one member object (None: it does not exist there)."""
    if obj is None:
        return MemberStatusObserved(ref=ref, cluster=cluster, exists=False, ready=False)
    status = obj.get("status")
    status = dict(status) if isinstance(status, Mapping) else {}
    observed_generation = status.get("observedGeneration")
    generation = metadata(obj).get("generation")
    return MemberStatusObserved(
        ref=ref,
        cluster=cluster,
        exists=True,
        status=status,
        observed_generation=observed_generation if isinstance(observed_generation, int) else None,
        generation=generation if isinstance(generation, int) else None,
        hub_generation=_hub_generation(obj),
        ready=ready(obj),
        decision_id=str(annotations_of(obj).get(DECISION_ANNOTATION) or ""),
    )


def fingerprint(report: MemberStatusObserved) -> str:
    """Equal for two reports that say the same thing (what dedup compares)."""
    body = json.dumps(report.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def _covers(applied: Any, live: Any) -> bool:
    """Whether `live` still holds every field of `applied` with its value."""
    if isinstance(applied, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(key in live and _covers(value, live[key]) for key, value in applied.items())
    if isinstance(applied, list):
        if not isinstance(live, list) or len(applied) != len(live):
            return False
        return all(_covers(a, b) for a, b in zip(applied, live, strict=True))
    return bool(applied == live)


def drifted(manifest: Mapping[str, Any], live: Mapping[str, Any], *, content: bool = True) -> bool:
    """Whether a field Flotilla applied reads back differently (or is gone).

    `content=False` compares the metadata only, for a caller that saw everything
    else read back as applied at the live object's ``metadata.generation``: the
    server moves the generation on any change outside metadata (and status), so
    at the same generation only labels and annotations can have changed."""
    meta = {k: v for k, v in metadata(manifest).items() if k not in _SERVER_METADATA}
    if not _covers(meta, metadata(live)):
        return True
    if not content:
        return False
    applied = {k: v for k, v in manifest.items() if k not in ("status", "metadata")}
    return not _covers(applied, live)


def identity(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): which member object a manifest is."""
    meta = metadata(obj)
    return (
        str(obj.get("apiVersion", "")),
        str(obj.get("kind", "")),
        str(meta.get("namespace") or ""),
        str(meta.get("name", "")),
    )
