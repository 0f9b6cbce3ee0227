"""The in-memory object store behind kubesim: one resourceVersion, CRUD, GC, history.

Both halves of kubesim use it directly: the HTTP layer (`server.py`) and the
cluster simulator (`sim/`, which never goes through HTTP so 10,000 pods stay cheap).
It is synchronous on purpose: every mutation commits and notifies listeners before
the event loop can switch, so a watch registered after a list can never miss or
reorder an event.

Ownership of data: stored objects are private and never mutated in place (an
update stores a fresh dict). Public methods hand out copies; the `*_frozen`
accessors and `WatchRecord.object` hand out the stored dicts themselves for the
HTTP layer, which only serializes them.

Deletion follows upstream: finalizers keep an object with `deletionTimestamp` until
the last one is removed; ownerReference garbage collection runs synchronously when
an owner disappears (Background), waits for dependents (Foreground, via the
`foregroundDeletion` finalizer) or strips the reference (Orphan). Namespaces delete
their contents and disappear once empty.
"""

from __future__ import annotations

import base64
import builtins
import json
import logging
import re
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flotilla.kubesim import defaults, errors, events, resources
from flotilla.kubesim import schema as crd_schema
from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.resources import ResourceType
from flotilla.kubesim.schema import clone
from flotilla.kubesim.selectors import labels_of, parse_field_selector, parse_label_selector

log = logging.getLogger(__name__)

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
PROPAGATIONS = ("Background", "Foreground", "Orphan")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# RBAC objects are named like "system:controller:foo"; upstream only forbids "/" and "%".
_PATH_SEGMENT_NAME = re.compile(r"^[^/%]+$")
_RBAC_GROUP = "rbac.authorization.k8s.io"
# Upstream's TotalAnnotationSizeLimitB.
MAX_ANNOTATIONS_BYTES = 256 * 1024
_REPLICATED = frozenset(
    {
        ("apps", "Deployment"),
        ("apps", "ReplicaSet"),
        ("apps", "StatefulSet"),
        ("", "ReplicationController"),
    }
)
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NOT_SPEC = frozenset({"metadata", "status", "apiVersion", "kind"})
_SERVER_OWNED_METADATA = (
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


_stamp: list[Any] = [None, ""]  # (second, its RFC 3339 text)


def now_rfc3339() -> str:
    """The current second as upstream's `Time`; one string per second, shared by every
    object stamped in it (10,000 pods carry several stamps each)."""
    second = int(time.time())
    if second != _stamp[0]:
        _stamp[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _stamp[0] = second
    return str(_stamp[1])


# Sub-objects that many stored objects of a kind repeat word for word (a ReplicaSet's
# containers, labels and owner in each of its pods, the admission tolerations, the
# conditions written in the same second). Stored objects are never mutated in place,
# so equal ones are kept once (`Store._share`). "*" walks a list's items.
_SHARED_PATHS: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    ("", "Pod"): (
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("metadata", "ownerReferences"),
        ("spec", "containers"),
        ("spec", "initContainers"),
        ("spec", "volumes"),
        ("spec", "tolerations"),
        ("spec", "securityContext"),
        ("spec", "affinity"),
        ("spec", "nodeSelector"),
        ("status", "conditions", "*"),
        ("status", "hostIPs"),
        ("status", "containerStatuses", "*", "imageID"),
        ("status", "containerStatuses", "*", "state"),
        ("status", "containerStatuses", "*", "lastState"),
    ),
}
# Canonical sub-objects kept at most (oldest forgotten first: later equal ones are
# then stored once more, nothing else changes).
SHARED_CACHE_SIZE = 4096
# Upstream sets metadata.generation only for kinds whose strategy tracks spec changes.
_NO_GENERATION = frozenset({("", "Event"), ("events.k8s.io", "Event")})


def _share_key(value: Any) -> str:
    """A text equal for equal JSON data and different otherwise: `repr` tells 1, 1.0
    and true apart (as JSON text would) and, written in C throughout, is 2-4 times
    cheaper than `json.dumps`, which this runs on every pod write."""
    return repr(value)


@dataclass(frozen=True)
class StoreEvent:
    """One committed change, as listeners see it (`object` is the listener's own copy)."""

    type: str
    object: dict[str, Any]
    resource_version: int


@dataclass
class WatchRecord:
    """One entry of a type's event history, shared by every watcher.

    `object` and `old` are stored snapshots: read them, never mutate them. `encoded`
    caches serialized watch lines so a fan-out to N watchers encodes once.
    """

    type: str
    object: dict[str, Any]
    old: dict[str, Any] | None
    resource_version: int
    encoded: dict[Any, bytes] = field(default_factory=dict)


Listener = Callable[[StoreEvent], None]
Objects = list[dict[str, Any]]
RecordListener = Callable[[WatchRecord], None]
Convert = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class View:
    """A resource served from another's objects through a field mapping (upstream's
    events.k8s.io/v1 Events are the core/v1 Events)."""

    base: ResourceType
    to_view: Convert
    to_base: Convert

    def record(self, record: WatchRecord) -> WatchRecord:
        old = self.to_view(record.old) if record.old is not None else None
        return WatchRecord(record.type, self.to_view(record.object), old, record.resource_version)


class _TypeState:
    """Objects, history and listeners of one stored resource (all its versions)."""

    def __init__(self, window: int) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.history: deque[WatchRecord] = deque(maxlen=max(window, 1))
        self.expired_rv = 0
        self.listeners: list[Listener] = []
        self.record_listeners: list[RecordListener] = []
        self.count = 0


def _storage_key(rt: ResourceType) -> tuple[str, str]:
    return (rt.group, rt.plural)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def _spec_of(obj: dict[str, Any], status_is_spec: bool = False) -> dict[str, Any]:
    """What `generation` tracks: everything but metadata, and status when it has a subresource."""
    ignored = _NOT_SPEC - {"status"} if status_is_spec else _NOT_SPEC
    return {k: v for k, v in obj.items() if k not in ignored}


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The ResourceTypes a CustomResourceDefinition serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subresources = frozenset((version.get("subresources") or {}).keys()) & {"status", "scale"}
        out.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                kind=names["kind"],
                plural=names["plural"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                subresources=subresources,
                short_names=tuple(names.get("shortNames") or ()),
                custom=True,
                categories=tuple(names.get("categories") or ()),
                keyed_lists=tuple(
                    sorted(_keyed_lists((version.get("schema") or {}).get("openAPIV3Schema")))
                ),
            )
        )
    return out


def _keyed_lists(schema: Any, field: str = "") -> set[tuple[str, str]]:
    """(field, key) of every list in `schema` that is a map keyed by one field."""
    if not isinstance(schema, dict):
        return set()
    found: set[tuple[str, str]] = set()
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") == "map" and isinstance(keys, list) and len(keys) == 1:
        found.add((field, str(keys[0])))
    for name, sub in (schema.get("properties") or {}).items():
        found |= _keyed_lists(sub, name)
    found |= _keyed_lists(schema.get("items"), field)
    found |= _keyed_lists(schema.get("additionalProperties"), field)
    return found


def _validate_crd(crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    spec = crd.get("spec")
    causes: list[tuple[str, str]] = []
    if not isinstance(spec, dict):
        raise errors.invalid("CustomResourceDefinition", name, [("spec", "Required value")])
    names = spec.get("names") or {}
    group = spec.get("group")
    if not group or not isinstance(group, str) or "." not in group:
        causes.append(("spec.group", "should be a domain with at least one dot"))
    for key in ("plural", "kind"):
        if not names.get(key):
            causes.append((f"spec.names.{key}", "Required value"))
    if names.get("plural") and group and name != f"{names['plural']}.{group}":
        causes.append(("metadata.name", 'must be spec.names.plural+"."+spec.group'))
    if spec.get("scope", "Namespaced") not in ("Namespaced", "Cluster"):
        causes.append(("spec.scope", "Unsupported value: must be Namespaced or Cluster"))
    versions = spec.get("versions")
    if not versions or not isinstance(versions, list):
        causes.append(("spec.versions", "Required value"))
    else:
        if not all(isinstance(v, dict) and v.get("name") for v in versions):
            causes.append(("spec.versions[].name", "Required value"))
        elif sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(("spec.versions", "must have exactly one version marked as storage"))
    if causes:
        raise errors.invalid("CustomResourceDefinition", name, causes, "apiextensions.k8s.io")


class Store:
    """All objects of one kubesim cluster (see the module docstring for the rules)."""

    def __init__(self, *, watch_window: int = 1000) -> None:
        self.registry = resources.Registry()
        self.watch_window = watch_window
        self._rv = 0
        self._states: dict[tuple[str, str], _TypeState] = {}
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._dependents: dict[str, set[str]] = {}
        self._service_ips = 0
        self._schemas: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._scales: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._views = {
            _storage_key(self.resource_type(*events.EVENTS_V1)): View(
                self.resource_type(*events.CORE), events.to_events_v1, events.to_core
            )
        }
        self._columns: dict[tuple[str, str, str], builtins.list[dict[str, Any]]] = {}
        self._shared: dict[str, Any] = {}
        for name in DEFAULT_NAMESPACES:
            self.create(resources.NAMESPACE, {"metadata": {"name": name}})

    # -- introspection -------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def resource_type(self, api_version: str, kind: str) -> ResourceType:
        return self.registry.by_kind(api_version, kind)

    def count(self, rt: ResourceType) -> int:
        if (view := self._view(rt)) is not None:
            return self.count(view.base)
        return self._state(rt).count

    def counts(self) -> dict[str, int]:
        """Number of stored objects per `plural.group` (only non-empty types)."""
        out: dict[str, int] = {}
        for (group, plural), state in self._states.items():
            if state.count:
                out[f"{plural}.{group}" if group else plural] = state.count
        return out

    def _state(self, rt: ResourceType) -> _TypeState:
        key = _storage_key(rt)
        state = self._states.get(key)
        if state is None:
            state = _TypeState(self.watch_window)
            self._states[key] = state
        return state

    def _check_served(self, rt: ResourceType) -> None:
        if rt not in self.registry:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({rt.group_resource})",
            )

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def _find(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        self._check_served(rt)
        obj = self._state(rt).objects.get(self._ns(rt, namespace), {}).get(name)
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return obj

    def _versioned(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """A copy for a caller; custom resources report the version they were asked in."""
        out: dict[str, Any] = clone(obj)
        if rt.custom:
            out["apiVersion"] = rt.api_version
        return out

    # -- reads -------------------------------------------------------------------------

    def _view(self, rt: ResourceType) -> View | None:
        view = self._views.get(_storage_key(rt))
        if view is not None:
            self._check_served(rt)
        return view

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        if (view := self._view(rt)) is not None:
            return view.to_view(self.get(view.base, namespace, name))
        return self._versioned(rt, self._find(rt, namespace, name))

    def get_frozen(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored object itself, for serializing only. Never mutate the result."""
        if (view := self._view(rt)) is not None:
            return view.to_view(self._find(view.base, namespace, name))
        return self._find(rt, namespace, name)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[Objects, int]:
        items, rv = self.list_frozen(rt, namespace, label_selector, field_selector)
        return [self._versioned(rt, obj) for obj in items], rv

    def list_frozen(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        at: int | None = None,
    ) -> tuple[Objects, int]:
        """Stored objects sorted by (namespace, name); never mutate them.

        With `at`, the objects as they were at that resourceVersion, rebuilt by undoing
        the retained history after it (410 Expired once that history is gone).
        """
        self._check_served(rt)
        match_labels = parse_label_selector(label_selector)
        match_fields = parse_field_selector(
            events.field_selector(rt.api_version, rt.kind, field_selector)
        )
        if (view := self._view(rt)) is not None:
            base, rv = self.list_frozen(view.base, namespace, at=at)
            shown = [view.to_view(obj) for obj in base]
            return [
                obj
                for obj in shown
                if (match_labels is None or match_labels(labels_of(obj)))
                and (match_fields is None or match_fields(obj))
            ], rv
        state = self._state(rt)
        if at is not None and at < self._rv:
            objects = self._objects_at(rt, state, at)
        else:
            objects = state.objects
            at = self._rv
        if rt.namespaced and namespace:
            buckets = [objects.get(namespace, {})]
        else:
            buckets = [objects[ns] for ns in sorted(objects)]
        items: Objects = []
        for bucket in buckets:
            for name in sorted(bucket):
                obj = bucket[name]
                if match_labels is not None and not match_labels(labels_of(obj)):
                    continue
                if match_fields is not None and not match_fields(obj):
                    continue
                items.append(obj)
        return items, at

    def _objects_at(
        self, rt: ResourceType, state: _TypeState, resource_version: int
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """The type's objects (namespace -> name -> object) as of `resource_version`."""
        before: dict[tuple[str, str], dict[str, Any] | None] = {}
        # Newest first, so the state before the oldest later change is what remains.
        for record in reversed(self.history_since(rt, resource_version)):
            meta = record.object["metadata"]
            key = (self._ns(rt, meta.get("namespace")), meta["name"])
            before[key] = None if record.type == "ADDED" else record.old
        if not before:
            return state.objects
        objects = {
            ns: {name: obj for name, obj in bucket.items() if (ns, name) not in before}
            for ns, bucket in state.objects.items()
        }
        for (ns, name), obj in before.items():
            if obj is not None:
                objects.setdefault(ns, {})[name] = obj
        return objects

    def iter_frozen(self, rt: ResourceType) -> Iterator[dict[str, Any]]:
        """Every stored object of a type, unsorted; never mutate them."""
        if (view := self._view(rt)) is not None:
            yield from (view.to_view(obj) for obj in self.iter_frozen(view.base))
            return
        for bucket in self._state(rt).objects.values():
            yield from bucket.values()

    # -- history and listeners -------------------------------------------------------

    def add_listener(self, rt: ResourceType, callback: Listener) -> Callable[[], None]:
        if (view := self._view(rt)) is not None:
            convert = view.to_view
            return self.add_listener(
                view.base,
                lambda event: callback(
                    StoreEvent(event.type, convert(event.object), event.resource_version)
                ),
            )
        listeners = self._state(rt).listeners
        listeners.append(callback)

        def unsubscribe() -> None:
            if callback in listeners:
                listeners.remove(callback)

        return unsubscribe

    def add_record_listener(self, rt: ResourceType, callback: RecordListener) -> Callable[[], None]:
        """Like `add_listener` but with the shared, read-only `WatchRecord` (for watches)."""
        if (view := self._view(rt)) is not None:
            shown = view.record
            return self.add_record_listener(view.base, lambda record: callback(shown(record)))
        listeners = self._state(rt).record_listeners
        listeners.append(callback)

        def unsubscribe() -> None:
            if callback in listeners:
                listeners.remove(callback)

        return unsubscribe

    def history_since(self, rt: ResourceType, resource_version: int) -> builtins.list[WatchRecord]:
        """Retained events after `resource_version`; 410 Expired if some were dropped."""
        if (view := self._view(rt)) is not None:
            return [view.record(r) for r in self.history_since(view.base, resource_version)]
        state = self._state(rt)
        if resource_version < state.expired_rv:
            raise ApiError(
                410,
                "Expired",
                f"too old resource version: {resource_version} ({state.expired_rv + 1})",
            )
        return [r for r in state.history if r.resource_version > resource_version]

    def _emit(
        self, rt: ResourceType, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        state = self._state(rt)
        record = WatchRecord(kind, obj, old, self._rv)
        if len(state.history) == state.history.maxlen:
            state.expired_rv = state.history[0].resource_version
        state.history.append(record)
        for record_listener in list(state.record_listeners):
            try:
                record_listener(record)
            except Exception:
                log.exception("watch listener failed")
        for listener in list(state.listeners):
            try:
                listener(StoreEvent(kind, self._versioned(rt, obj), self._rv))
            except Exception:
                log.exception("store listener failed")

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- create ------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        owned: bool = False,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Store a new object; returns a copy of what was stored. With `dry_run`,
        everything but storing it (no event, no resourceVersion).

        `owned=True` hands `obj` over instead (no copy in, and the stored object itself
        out, which the caller must not mutate): for writers like the Event recorder that
        build a fresh dict per object and never look at it again.
        """
        self._check_served(rt)
        if rt.create_only:
            raise errors.bad_request(f"{rt.group_resource} are answered, not stored")
        if not isinstance(obj, dict):
            raise errors.bad_request("object must be a JSON object")
        if (view := self._view(rt)) is not None:
            return view.to_view(self.create(view.base, view.to_base(obj), dry_run=dry_run))
        new: dict[str, Any] = obj if owned else clone(obj)
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        meta = _meta(new)
        for key in _SERVER_OWNED_METADATA:
            meta.pop(key, None)
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
            meta["name"] = name
        self._validate(rt, new)
        ns = self._ns(rt, meta.get("namespace"))
        if rt.namespaced:
            self._check_namespace_open(ns)
        else:
            meta.pop("namespace", None)
        state = self._state(rt)
        if name in state.objects.get(ns, {}):
            raise errors.already_exists(rt.plural, name, rt.group)
        if rt == resources.CRD:
            _validate_crd(new)
            self._check_crd_conflict(new)
        self._default(rt, new)
        _normalize(rt, new)
        if rt.custom:
            new = self._admitted(rt, new)
            meta = new["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if (rt.group, rt.kind) not in _NO_GENERATION:
            meta["generation"] = 1
        if dry_run:
            return self._versioned(rt, new)
        meta["resourceVersion"] = self._next_rv()
        if rt == resources.CRD:
            self._register_crd(new)
        self._put(rt, state, ns, new, None)
        self._emit(rt, "ADDED", new, None)
        if rt == resources.NAMESPACE:
            self._add_default_service_account(str(name))
        return new if owned else self._versioned(rt, new)

    def _add_default_service_account(self, namespace: str) -> None:
        """Every namespace gets a `default` ServiceAccount, as the token controller makes."""
        accounts = self.registry.by_kind("v1", "ServiceAccount")
        if "default" not in self._state(accounts).objects.get(namespace, {}):
            self.create(accounts, {"metadata": {"name": "default", "namespace": namespace}})

    def _validate(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta.get("name")
        causes: list[tuple[str, str]] = []
        if not name or not isinstance(name, str):
            raise errors.invalid(
                rt.kind, "", [("metadata.name", "Required value: name or generateName is required")]
            )
        pattern = _DNS_LABEL if rt == resources.NAMESPACE else _DNS_SUBDOMAIN
        if rt.group == _RBAC_GROUP:
            pattern = _PATH_SEGMENT_NAME
        if len(name) > 253 or not pattern.match(name):
            causes.append(
                (
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                    "lower case alphanumeric characters, '-' or '.', and must start and end "
                    "with an alphanumeric character",
                )
            )
        if rt.namespaced and not meta.get("namespace"):
            causes.append(("metadata.namespace", "Required value"))
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is None:
                continue
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                causes.append((f"metadata.{key}", "Invalid value: must map strings to strings"))
        causes += _label_causes(meta.get("labels"))
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
            if size > MAX_ANNOTATIONS_BYTES:
                causes.append(
                    (
                        "metadata.annotations",
                        f"Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes",
                    )
                )
        if (rt.group, rt.kind) in _REPLICATED and isinstance(obj.get("spec"), dict):
            replicas = obj["spec"].get("replicas")
            if replicas is not None and (
                not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0
            ):
                causes.append(
                    (
                        "spec.replicas",
                        f"Invalid value: {json.dumps(replicas)}: must be greater than or "
                        "equal to 0",
                    )
                )
        finalizers = meta.get("finalizers")
        if finalizers is not None and (
            not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)
        ):
            causes.append(("metadata.finalizers", "Invalid value: must be a list of strings"))
        owners = meta.get("ownerReferences")
        if owners is not None and (
            not isinstance(owners, list)
            or not all(
                isinstance(o, dict) and o.get("uid") and o.get("name") and o.get("kind")
                for o in owners
            )
        ):
            causes.append(
                ("metadata.ownerReferences", "Invalid value: each needs kind, name and uid")
            )
        if causes:
            raise errors.invalid(rt.kind, name, causes, rt.group)

    def _check_namespace_open(self, ns: str) -> None:
        namespace = self._state(resources.NAMESPACE).objects.get("", {}).get(ns)
        if namespace is None:
            raise errors.not_found("namespaces", ns)
        if namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {ns} because it is being terminated",
            )

    def _default(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Create-time defaults: status, namespace finalizers, service IPs, then `defaults`."""
        key = (rt.group, rt.kind)
        if key == ("", "Pod"):
            status = obj.setdefault("status", {})
            if isinstance(status, dict):
                status.setdefault("phase", "Pending")
        elif key == ("", "Namespace"):
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj[
                "metadata"
            ]["name"]
        elif key == ("", "Service"):
            spec = obj.setdefault("spec", {})
            if isinstance(spec, dict) and spec.get("clusterIP") is None:
                self._service_ips += 1
                n = self._service_ips
                spec["clusterIP"] = f"10.96.{(n >> 8) & 255}.{n & 255}"
                spec["clusterIPs"] = [spec["clusterIP"]]
        if not rt.custom:
            defaults.apply(rt.group, rt.kind, obj)

    # -- CRDs --------------------------------------------------------------------------

    def _check_crd_conflict(self, crd: dict[str, Any]) -> None:
        for rt in types_from_crd(crd):
            try:
                existing = self.registry.by_plural(rt.group, rt.version, rt.plural)
            except ApiError:
                continue
            if not existing.custom:
                raise errors.invalid(
                    "CustomResourceDefinition",
                    crd["metadata"]["name"],
                    [("spec.group", f"{rt.group_resource} is a built-in resource")],
                )

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        group, plural = spec["group"], spec["names"]["plural"]
        for rt in list(self.registry):
            if rt.custom and rt.group == group and rt.plural == plural:
                self.registry.remove(rt)
        for rt in types_from_crd(crd):
            self.registry.add(rt)
        for table in (self._schemas, self._scales, self._columns):
            for key in [k for k in table if k[:2] == (group, plural)]:
                del table[key]
        for version in spec["versions"]:
            columns = version.get("additionalPrinterColumns")
            if isinstance(columns, list):
                self._columns[(group, plural, version["name"])] = [
                    c for c in columns if isinstance(c, dict)
                ]
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if isinstance(schema, dict):
                self._schemas[(group, plural, version["name"])] = schema
            scale = (version.get("subresources") or {}).get("scale")
            if isinstance(scale, dict):
                self._scales[(group, plural, version["name"])] = scale
        names = dict(spec["names"])
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", f"{names['kind']}List")
        stamp = now_rfc3339()
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": stamp,
                },
            ],
        }

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        group, plural = spec.get("group"), (spec.get("names") or {}).get("plural")
        custom = [
            rt for rt in self.registry if rt.custom and rt.group == group and rt.plural == plural
        ]
        if custom:
            # Deleting a CRD deletes every custom resource of it, finalizers or not.
            state = self._state(custom[0])
            for bucket in list(state.objects.values()):
                for obj in list(bucket.values()):
                    self._remove(custom[0], obj)
        for rt in custom:
            self.registry.remove(rt)
        for table in (self._schemas, self._scales, self._columns):
            for key in [k for k in table if k[:2] == (group, plural)]:
                del table[key]

    def crd_schema(self, rt: ResourceType) -> dict[str, Any] | None:
        """The `openAPIV3Schema` of a served custom resource version (never mutate it)."""
        return self._schemas.get((rt.group, rt.plural, rt.version))

    def printer_columns(self, rt: ResourceType) -> builtins.list[dict[str, Any]]:
        """The `additionalPrinterColumns` of a served custom resource version."""
        return self._columns.get((rt.group, rt.plural, rt.version), [])

    def scale_paths(self, rt: ResourceType) -> dict[str, Any]:
        """Where a type with a `scale` subresource keeps replicas (CRD `subresources.scale`)."""
        if not rt.custom:
            return {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}
        return self._scales.get((rt.group, rt.plural, rt.version), {})

    def _admitted(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A pruned, defaulted copy of a custom resource; 422 if its schema rejects it."""
        schema = self._schemas.get((rt.group, rt.plural, rt.version))
        if schema is None:
            return obj
        admitted: dict[str, Any] = clone(obj)
        crd_schema.admit(admitted, schema, rt.kind, rt.group, old=old)
        return admitted

    # -- update ------------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        owned: bool = False,
    ) -> dict[str, Any]:
        """Replace an object (or its status); with `dry_run`, the result without storing it.

        `owned=True` is `create`'s: `obj` is handed over (no copy in; its nested parts
        may be shared with stored objects, which nobody mutates) and the stored object
        itself comes back, which the caller must not mutate: for the simulator, which
        writes every pod several times and builds each write afresh.
        """
        self._check_served(rt)
        if not isinstance(obj, dict):
            raise errors.bad_request("object must be a JSON object")
        if (view := self._view(rt)) is not None:
            updated = self.update(view.base, view.to_base(obj), subresource=subresource)
            return view.to_view(updated)
        meta_in = obj.get("metadata") or {}
        name = meta_in.get("name")
        if not name:
            raise errors.invalid(rt.kind, "", [("metadata.name", "Required value")])
        current = self._find(rt, meta_in.get("namespace"), name)
        cur_meta = current["metadata"]
        want_rv = meta_in.get("resourceVersion")
        if want_rv not in (None, "") and str(want_rv) != cur_meta["resourceVersion"]:
            raise errors.conflict(
                rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
                rt.group,
            )
        want_uid = meta_in.get("uid")
        if want_uid and want_uid != cur_meta["uid"]:
            raise errors.conflict(
                rt.plural, name, f"Precondition failed: UID in precondition: {want_uid}", rt.group
            )
        if subresource == "status":
            new: dict[str, Any] = dict(current)
            if "status" in obj:
                new["status"] = obj["status"] if owned else clone(obj["status"])
            else:
                new.pop("status", None)
            new["metadata"] = dict(cur_meta)
            if "managedFields" in meta_in:
                new["metadata"]["managedFields"] = clone(meta_in["managedFields"])
            if rt.custom:
                new = self._admitted(rt, new, current)
        elif subresource is None:
            new = obj if owned else clone(obj)
            new["apiVersion"] = rt.api_version
            new["kind"] = rt.kind
            meta = _meta(new)
            for key in (*_SERVER_OWNED_METADATA, "name", "namespace"):
                if key in cur_meta:
                    meta[key] = cur_meta[key]
                else:
                    meta.pop(key, None)
            if "managedFields" not in meta and "managedFields" in cur_meta:
                meta["managedFields"] = cur_meta["managedFields"]
            if rt.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            self._validate(rt, new)
            _normalize(rt, new)
            if rt.custom:
                new = self._admitted(rt, new, current)
                meta = new["metadata"]
            else:
                defaults.apply(rt.group, rt.kind, new)
            if rt == resources.CRD:
                _validate_crd(new)
                self._check_crd_conflict(new)
            if cur_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
                if added:
                    raise errors.invalid(
                        rt.kind,
                        name,
                        [
                            (
                                "metadata.finalizers",
                                "Forbidden: no new finalizers can be added "
                                "if the object is being deleted",
                            )
                        ],
                        rt.group,
                    )
            # Without a status subresource, status is ordinary content (upstream CRD rule).
            status_is_spec = rt.custom and not rt.has_status
            if _spec_of(new, status_is_spec) != _spec_of(current, status_is_spec):
                meta["generation"] = cur_meta.get("generation", 1) + 1
        else:
            raise errors.not_found(f"{rt.plural}/{subresource}", name, rt.group)

        if new == current:
            return current if owned else self._versioned(rt, current)
        if dry_run:
            return self._versioned(rt, new)
        committed = self._commit_update(rt, current, new)
        return committed if owned else self._versioned(rt, committed)

    def _commit_update(
        self, rt: ResourceType, current: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        """Store `new` in place of `current`; returns the stored object (never mutate it)."""
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rt, new)
            return new
        meta["resourceVersion"] = self._next_rv()
        if rt == resources.CRD:
            spec_changed = _spec_of(new) != _spec_of(current)
            if spec_changed:
                self._register_crd(new)
        ns = self._ns(rt, meta.get("namespace"))
        self._put(rt, self._state(rt), ns, new, current)
        self._emit(rt, "MODIFIED", new, current)
        return new

    def _put(
        self,
        rt: ResourceType,
        state: _TypeState,
        ns: str,
        new: dict[str, Any],
        old: dict[str, Any] | None,
    ) -> None:
        paths = _SHARED_PATHS.get((rt.group, rt.kind))
        if paths is not None:
            for path in paths:
                self._share(new, old, path)
        bucket = state.objects.setdefault(ns, {})
        name = new["metadata"]["name"]
        if name not in bucket:
            state.count += 1
        bucket[name] = new
        uid = new["metadata"]["uid"]
        self._by_uid[uid] = (rt, ns, name)
        refs = new["metadata"].get("ownerReferences")
        if old is not None and old["metadata"].get("ownerReferences") is refs:
            return  # the same owners (most writes): nothing to re-index
        old_owners = _owner_uids(old) if old is not None else set()
        new_owners = _owner_uids(new)
        for owner in old_owners - new_owners:
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self._dependents[owner]
        for owner in new_owners - old_owners:
            self._dependents.setdefault(owner, set()).add(uid)
        if old_owners - new_owners:
            for owner in old_owners - new_owners:
                self._maybe_finish_foreground(owner)

    def _share(self, node: Any, old: Any, path: tuple[str, ...]) -> None:
        """Replace the value at `path` in `node` (a fresh part of an object about to be
        stored) with the canonical equal one. Parts identical to the previous version's
        are already stored, so they are skipped unexamined."""
        step, rest = path[0], path[1:]
        if step == "*":
            if isinstance(node, list):
                for index, item in enumerate(node):
                    if rest:
                        self._share(item, None, rest)
                    else:
                        node[index] = self._canonical(item)
            return
        if not isinstance(node, dict) or step not in node:
            return
        value = node[step]
        if isinstance(old, dict) and old.get(step) is value:
            return
        if rest:
            self._share(value, old.get(step) if isinstance(old, dict) else None, rest)
        else:
            node[step] = self._canonical(value)

    def shared(self, value: Any) -> Any:
        """The canonical instance equal to `value` (JSON data nobody mutates): for
        readers that keep parts of objects, such as the simulator's pod labels."""
        return self._canonical(value)

    def _canonical(self, value: Any) -> Any:
        key = _share_key(value)
        found = self._shared.get(key)
        if found is not None:
            return found
        self._shared[key] = value
        if len(self._shared) > SHARED_CACHE_SIZE:
            del self._shared[next(iter(self._shared))]
        return value

    # -- delete ------------------------------------------------------------------------

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        preconditions: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Delete (or start deleting) an object; returns its last or terminating state."""
        if (view := self._view(rt)) is not None:
            deleted = self.delete(
                view.base, namespace, name, propagation=propagation, preconditions=preconditions
            )
            return view.to_view(deleted)
        if propagation not in PROPAGATIONS:
            raise errors.bad_request(
                f"propagationPolicy {propagation!r} is not one of {', '.join(PROPAGATIONS)}"
            )
        current = self._find(rt, namespace, name)
        cur_meta = current["metadata"]
        if preconditions:
            for key in ("uid", "resourceVersion"):
                want = preconditions.get(key)
                if want and str(want) != cur_meta.get(key):
                    raise errors.conflict(
                        rt.plural,
                        name,
                        f"Precondition failed: {key} in precondition: {want}, "
                        f"{key} in object meta: {cur_meta.get(key)}",
                        rt.group,
                    )
        uid = cur_meta["uid"]
        if propagation == "Orphan":
            self._orphan_dependents(uid)
        if rt == resources.NAMESPACE:
            return self._delete_namespace(current)
        finalizers = list(cur_meta.get("finalizers") or [])
        if (
            propagation == "Foreground"
            and self._dependents.get(uid)
            and FOREGROUND not in finalizers
        ):
            finalizers.append(FOREGROUND)
        if not finalizers:
            self._remove(rt, current)
            return self._versioned(rt, current)
        if cur_meta.get("deletionTimestamp") and finalizers == cur_meta.get("finalizers"):
            return self._versioned(rt, current)
        new = dict(current)
        new["metadata"] = {
            **cur_meta,
            "finalizers": finalizers,
            "deletionTimestamp": cur_meta.get("deletionTimestamp") or now_rfc3339(),
            "deletionGracePeriodSeconds": 0,
        }
        result = self._commit_update(rt, current, new)
        if FOREGROUND in finalizers:
            for dep_uid in sorted(self._dependents.get(uid, ())):
                self._delete_by_uid(dep_uid, "Foreground")
            self._maybe_finish_foreground(uid)
        return self._versioned(rt, result)

    def _delete_by_uid(self, uid: str, propagation: str) -> None:
        where = self._by_uid.get(uid)
        if where is None:
            return
        rt, ns, name = where
        try:
            self.delete(rt, ns or None, name, propagation=propagation)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _orphan_dependents(self, owner_uid: str) -> None:
        for dep_uid in sorted(self._dependents.get(owner_uid, ())):
            self._drop_owner_ref(dep_uid, {owner_uid})

    def _drop_owner_ref(self, dep_uid: str, owner_uids: set[str]) -> None:
        where = self._by_uid.get(dep_uid)
        if where is None:
            return
        rt, ns, name = where
        current = self._state(rt).objects[ns][name]
        refs = [
            r
            for r in current["metadata"].get("ownerReferences") or []
            if r.get("uid") not in owner_uids
        ]
        new = dict(current)
        new["metadata"] = dict(current["metadata"])
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self._commit_update(rt, current, new)

    def _remove(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Actually delete: DELETED event, then garbage-collect what depended on it."""
        meta = obj["metadata"]
        ns = self._ns(rt, meta.get("namespace"))
        state = self._state(rt)
        bucket = state.objects.get(ns, {})
        current = bucket.get(meta["name"])
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return
        del bucket[meta["name"]]
        if not bucket:
            del state.objects[ns]
        state.count -= 1
        uid = meta["uid"]
        self._by_uid.pop(uid, None)
        owners = _owner_uids(current)
        for owner in owners:
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self._dependents[owner]
        final = dict(obj)
        final["metadata"] = {**meta, "resourceVersion": self._next_rv()}
        self._emit(rt, "DELETED", final, current)
        if rt == resources.CRD:
            self._unregister_crd(current)
        self._collect_dependents(uid)
        for owner in owners:
            self._maybe_finish_foreground(owner)
        if rt.namespaced:
            self._maybe_finish_namespace(ns)

    def _collect_dependents(self, owner_uid: str) -> None:
        for dep_uid in sorted(self._dependents.get(owner_uid, ())):
            where = self._by_uid.get(dep_uid)
            if where is None:
                continue
            rt, ns, name = where
            dependent = self._state(rt).objects[ns][name]
            owners = _owner_uids(dependent)
            alive = {o for o in owners if o in self._by_uid}
            if alive:
                self._drop_owner_ref(dep_uid, owners - alive)
            else:
                self._delete_by_uid(dep_uid, "Background")

    def _maybe_finish_foreground(self, owner_uid: str) -> None:
        where = self._by_uid.get(owner_uid)
        if where is None or self._dependents.get(owner_uid):
            return
        rt, ns, name = where
        current = self._state(rt).objects.get(ns, {}).get(name)
        if current is None:
            return
        finalizers = current["metadata"].get("finalizers") or []
        if not current["metadata"].get("deletionTimestamp") or FOREGROUND not in finalizers:
            return
        new = dict(current)
        new["metadata"] = {
            **current["metadata"],
            "finalizers": [f for f in finalizers if f != FOREGROUND],
        }
        self._commit_update(rt, current, new)

    def _delete_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        name = namespace["metadata"]["name"]
        result = namespace
        if not namespace["metadata"].get("deletionTimestamp"):
            new = dict(namespace)
            new["metadata"] = {**namespace["metadata"], "deletionTimestamp": now_rfc3339()}
            new["status"] = {**(namespace.get("status") or {}), "phase": "Terminating"}
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._put(resources.NAMESPACE, self._state(resources.NAMESPACE), "", new, namespace)
            self._emit(resources.NAMESPACE, "MODIFIED", new, namespace)
            result = new
        for rt in list(self.registry):
            if not rt.namespaced:
                continue
            bucket = self._state(rt).objects.get(name)
            for obj_name in sorted(bucket or ()):
                self._delete_by_uid(
                    self._state(rt).objects[name][obj_name]["metadata"]["uid"], "Background"
                )
        self._maybe_finish_namespace(name)
        return self._versioned(resources.NAMESPACE, result)

    def _maybe_finish_namespace(self, ns: str) -> None:
        namespace = self._state(resources.NAMESPACE).objects.get("", {}).get(ns)
        if namespace is None or not namespace["metadata"].get("deletionTimestamp"):
            return
        for state in self._states.values():
            if state.objects.get(ns):
                return
        self._remove(resources.NAMESPACE, namespace)


def _normalize(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Write-time conversions upstream does on every write (Secret stringData -> data)."""
    if (rt.group, rt.kind) == ("", "Secret") and "stringData" in obj:
        string_data = obj.pop("stringData") or {}
        if not isinstance(string_data, dict):
            raise errors.invalid(
                "Secret", obj["metadata"]["name"], [("stringData", "must be a map")]
            )
        data = dict(obj.get("data") or {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data


def _label_causes(labels: Any) -> list[tuple[str, str]]:
    """Upstream's qualified-name rules for label keys and its label-value rules."""
    if not isinstance(labels, dict):
        return []
    causes = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        prefix, _, name = key.rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        ):
            causes.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                    "'-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{value}": a valid label must be an empty string or consist '
                    "of alphanumeric characters, '-', '_' or '.', and must start and end with "
                    "an alphanumeric character (at most 63 characters)",
                )
            )
    return causes


def _owner_uids(obj: dict[str, Any] | None) -> set[str]:
    if obj is None:
        return set()
    refs = obj.get("metadata", {}).get("ownerReferences") or ()
    return {r["uid"] for r in refs if isinstance(r, dict) and r.get("uid")}
