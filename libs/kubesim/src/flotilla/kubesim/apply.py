"""Server-side apply and managedFields, with a pragmatic field-ownership model.

Upstream uses structured-merge-diff over OpenAPI schemas; there is no Python port, so
this module keeps the part clients observe: each manager owns the set of leaf field
paths it last applied (operation `Apply`) or last changed with a write (operation
`Update`). Applying a field that another manager owns to a different value is a 409
conflict unless `force=true`, which transfers ownership. Fields a manager applied
before and omits now are removed when nobody else owns them. Ownership is stored in
`metadata.managedFields` in upstream's `FieldsV1` format (`f:` fields, `k:` keyed list
items), so clients that read managedFields see familiar data.

Simplifications: lists are atomic unless the field has a strategic-merge key (built-in
kinds) or, in a custom resource, its CRD schema declares it ``x-kubernetes-list-type:
map`` with one key (matched by field name, as the strategic keys are); ownership is
tracked at leaves only; conflicts compare exact paths (not a parent against its children).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.patch import merge_key_for
from flotilla.kubesim.resources import ResourceType

Path = tuple[str, ...]

# Metadata the server owns or that identifies the object: never tracked.
_UNTRACKED_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "generateName",
    }
)
_MISSING = object()


def field_paths(obj: dict[str, Any], rt: ResourceType, *, status: bool = False) -> set[Path]:
    """Leaf paths of an object in `FieldsV1` segments.

    `status` selects the status subresource's fields instead of everything else.
    """
    paths: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if (key == "status") != status:
            continue
        if key == "metadata" and isinstance(value, dict):
            for mkey, mvalue in value.items():
                if mkey not in _UNTRACKED_METADATA:
                    _walk(mvalue, ("f:metadata", f"f:{mkey}"), mkey, rt, paths)
        else:
            _walk(value, (f"f:{key}",), key, rt, paths)
    return paths


def _walk(value: Any, path: Path, field: str, rt: ResourceType, out: set[Path]) -> None:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            _walk(sub, (*path, f"f:{key}"), key, rt, out)
        return
    if isinstance(value, list) and value:
        key = rt.list_key(field) if rt.custom else merge_key_for(field, value)
        if key is not None and all(isinstance(i, dict) and key in i for i in value):
            for item in value:
                item_path = (*path, _item_segment(key, item[key]))
                for sub_key, sub in item.items():
                    _walk(sub, (*item_path, f"f:{sub_key}"), sub_key, rt, out)
            return
    out.add(path)


def _item_segment(key: str, value: Any) -> str:
    return "k:" + json.dumps({key: value}, separators=(",", ":"), sort_keys=True)


def _step(container: Any, segment: str) -> Any:
    if segment.startswith("f:"):
        if isinstance(container, dict):
            return container.get(segment[2:], _MISSING)
        return _MISSING
    if segment.startswith("k:") and isinstance(container, list):
        key, value = _item_key(segment)
        for item in container:
            if isinstance(item, dict) and item.get(key) == value:
                return item
    return _MISSING


@functools.lru_cache(maxsize=4096)
def _item_key(segment: str) -> tuple[str, Any]:
    """The (merge key, value) a ``k:`` segment names, parsed once: every write compares
    each leaf path of the object before and after, and most of them repeat."""
    ((key, value),) = json.loads(segment[2:]).items()
    return key, value


def value_at(obj: Any, path: Path) -> Any:
    current = obj
    for segment in path:
        current = _step(current, segment)
        if current is _MISSING:
            return _MISSING
    return current


def _is_key_leaf(path: Path) -> bool:
    """Whether a path is the merge-key field of a keyed list item (`k:{"name":..}/f:name`)."""
    if len(path) < 2 or not path[-2].startswith("k:"):
        return False
    return path[-1][2:] in json.loads(path[-2][2:])


def _remove_path(obj: dict[str, Any], path: Path) -> None:
    """Delete a leaf, then drop maps and keyed list items it left empty."""
    chain: list[Any] = [obj]
    for segment in path[:-1]:
        nxt = _step(chain[-1], segment)
        if nxt is _MISSING:
            return
        chain.append(nxt)
    _delete_segment(chain[-1], path[-1])
    for depth in range(len(chain) - 1, 0, -1):
        node, parent = chain[depth], chain[depth - 1]
        if node not in ({}, []):
            break
        # By identity: an emptied list item no longer carries the key that named it.
        if isinstance(parent, dict):
            parent.pop(path[depth - 1][2:], None)
        elif isinstance(parent, list):
            parent[:] = [item for item in parent if item is not node]


def _delete_segment(container: Any, segment: str) -> None:
    if segment.startswith("f:") and isinstance(container, dict):
        container.pop(segment[2:], None)
    elif segment.startswith("k:") and isinstance(container, list):
        ((key, value),) = json.loads(segment[2:]).items()
        container[:] = [i for i in container if not (isinstance(i, dict) and i.get(key) == value)]


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    leaves = sorted(paths)
    for path in leaves:
        node = tree
        for segment in path:
            node = node.setdefault(segment, {})
    for path in leaves:
        node = tree
        for segment in path:
            node = node[segment]
        if node and "." not in node:
            # A leaf that is also a prefix of another path: mark the node itself owned.
            node["."] = {}
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for segment, sub in tree.items():
        if segment == ".":
            paths.add(prefix)
            continue
        path = (*prefix, segment)
        if isinstance(sub, dict) and sub:
            paths |= from_fields_v1(sub, path)
        else:
            paths.add(path)
    return paths


def dotted(path: Path) -> str:
    out = ""
    for segment in path:
        if segment.startswith("f:"):
            out += "." + segment[2:]
        else:
            ((key, value),) = json.loads(segment[2:]).items()
            out += f"[{key}={json.dumps(value)}]"
    return out


class Ownership:
    """managedFields of one object as {(manager, operation, subresource): paths}."""

    def __init__(self, managed_fields: list[dict[str, Any]] | None) -> None:
        self.entries: dict[tuple[str, str, str], tuple[str, set[Path]]] = {}
        for entry in managed_fields or []:
            if not isinstance(entry, dict) or "manager" not in entry:
                continue
            key = (entry["manager"], entry.get("operation", "Update"), entry.get("subresource", ""))
            self.entries[key] = (
                entry.get("apiVersion", ""),
                from_fields_v1(entry.get("fieldsV1") or {}),
            )

    def owners(self, path: Path, *, except_key: tuple[str, str, str]) -> list[tuple[str, str]]:
        return [
            (key[0], api_version)
            for key, (api_version, paths) in self.entries.items()
            if key != except_key and path in paths
        ]

    def paths_of_others(self, except_key: tuple[str, str, str]) -> set[Path]:
        out: set[Path] = set()
        for key, (_, paths) in self.entries.items():
            if key != except_key:
                out |= paths
        return out

    def release(self, paths: set[Path], except_key: tuple[str, str, str] | None = None) -> None:
        for key, (api_version, owned) in list(self.entries.items()):
            if key != except_key:
                self.entries[key] = (api_version, owned - paths)

    def set(self, key: tuple[str, str, str], api_version: str, paths: set[Path]) -> None:
        self.entries[key] = (api_version, set(paths))

    def render(self, times: dict[tuple[str, str, str], str], now: str) -> list[dict[str, Any]]:
        out = []
        for key, (api_version, paths) in self.entries.items():
            if not paths:
                continue
            manager, operation, subresource = key
            entry: dict[str, Any] = {
                "manager": manager,
                "operation": operation,
                "apiVersion": api_version,
                "time": times.get(key, now),
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(paths),
            }
            if subresource:
                entry["subresource"] = subresource
            out.append(entry)
        return out


def _times(managed_fields: list[dict[str, Any]] | None) -> dict[tuple[str, str, str], str]:
    return {
        (e["manager"], e.get("operation", "Update"), e.get("subresource", "")): e.get("time", "")
        for e in managed_fields or []
        if isinstance(e, dict) and "manager" in e
    }


def _merge(live: Any, applied: Any, field: str, rt: ResourceType) -> Any:
    if isinstance(applied, dict):
        result = dict(live) if isinstance(live, dict) else {}
        for key, value in applied.items():
            result[key] = _merge(result.get(key), value, key, rt)
        return result
    if isinstance(applied, list) and isinstance(live, list):
        key = rt.list_key(field) if rt.custom else merge_key_for(field, applied)
        if (
            key is not None
            and applied
            and all(isinstance(i, dict) and key in i for i in applied)
            and all(isinstance(i, dict) and key in i for i in live)
        ):
            merged = list(live)
            for item in applied:
                index = next((n for n, e in enumerate(merged) if e.get(key) == item[key]), None)
                if index is None:
                    merged.append(item)
                else:
                    merged[index] = _merge(merged[index], item, field, rt)
            return merged
    return applied


def apply(
    live: dict[str, Any] | None,
    applied: dict[str, Any],
    *,
    rt: ResourceType,
    manager: str,
    force: bool,
    now: str,
    subresource: str = "",
) -> dict[str, Any]:
    """The object after `manager` applies `applied` to `live` (None when creating)."""
    status = subresource == "status"
    key = (manager, "Apply", subresource)
    applied_paths = field_paths(applied, rt, status=status)
    if live is None:
        created = dict(applied)
        if rt.has_status and not status:
            created.pop("status", None)
        ownership = Ownership(None)
        ownership.set(key, rt.api_version, applied_paths)
        created["metadata"] = {**(created.get("metadata") or {})}
        created["metadata"]["managedFields"] = ownership.render({}, now)
        return created

    managed = live.get("metadata", {}).get("managedFields")
    ownership = Ownership(managed)
    conflicts: list[tuple[Path, str, str]] = []
    for path in sorted(applied_paths):
        new_value = value_at(applied, path)
        if value_at(live, path) == new_value:
            continue
        for owner, api_version in ownership.owners(path, except_key=key):
            if owner != manager:
                conflicts.append((path, owner, api_version))
    if conflicts and not force:
        causes = [
            {
                "reason": "FieldManagerConflict",
                "message": f'conflict with "{owner}" using {api_version}',
                "field": dotted(path),
            }
            for path, owner, api_version in conflicts
        ]
        lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
        plural = "conflict" if len(causes) == 1 else "conflicts"
        raise ApiError(
            409,
            "Conflict",
            f"Apply failed with {len(causes)} {plural}: {lines}",
            {"causes": causes},
        )
    if conflicts:
        ownership.release({path for path, _, _ in conflicts}, except_key=key)

    previous = ownership.entries.get(key, ("", set()))[1]
    body = {k: v for k, v in applied.items() if k not in ("apiVersion", "kind")}
    if status:
        body = {"status": applied.get("status", {})}
    elif rt.has_status:
        body.pop("status", None)
    meta_in = body.pop("metadata", None) or {}
    result: dict[str, Any] = _merge(live, body, "", rt)
    tracked_meta = {k: v for k, v in meta_in.items() if k not in _UNTRACKED_METADATA}
    result["metadata"] = _merge(live.get("metadata", {}), tracked_meta, "metadata", rt)
    if meta_in.get("resourceVersion"):
        result["metadata"]["resourceVersion"] = meta_in["resourceVersion"]

    others = ownership.paths_of_others(key)
    stale = previous - applied_paths - others
    if stale:
        result = json.loads(json.dumps(result))
        # Merge-key leaves go last: they are how an item is found, and an item keeps
        # its key while anything else in it is still owned.
        for path in sorted(stale, key=lambda p: (_is_key_leaf(p), -len(p))):
            if _is_key_leaf(path):
                item = value_at(result, path[:-1])
                if isinstance(item, dict) and len(item) > 1:
                    continue
            _remove_path(result, path)
    ownership.set(key, rt.api_version, applied_paths)
    times = _times(managed)
    times[key] = now
    result["metadata"]["managedFields"] = ownership.render(times, now)
    return result


def _comparable(managed: Any) -> list[tuple[Any, ...]] | None:
    if not isinstance(managed, list):
        return None
    return [
        (
            e.get("manager"),
            e.get("operation"),
            e.get("subresource"),
            e.get("apiVersion"),
            json.dumps(e.get("fieldsV1"), sort_keys=True),
        )
        for e in managed
        if isinstance(e, dict)
    ]


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    rt: ResourceType,
    manager: str,
    now: str,
    subresource: str = "",
) -> None:
    """Give `manager` the fields a non-apply write changed (sets new.metadata.managedFields)."""
    status = subresource == "status"
    key = (manager, "Update", subresource)
    new_paths = field_paths(new, rt, status=status)
    meta = new.setdefault("metadata", {})
    if old is None:
        ownership = Ownership(None)
        ownership.set(key, rt.api_version, new_paths)
        meta["managedFields"] = ownership.render({}, now)
        return
    stored = old.get("metadata", {}).get("managedFields")
    managed = meta.get("managedFields", stored)
    if managed == stored or _comparable(managed) == _comparable(stored):
        # Clients echo managedFields back with reformatted times; that is not a change.
        managed = stored
    ownership = Ownership(managed)
    old_paths = field_paths(old, rt, status=status)
    changed = {p for p in new_paths if value_at(old, p) != value_at(new, p)}
    removed = old_paths - new_paths
    if not changed and not removed:
        if managed is not None:
            meta["managedFields"] = managed
        return
    ownership.release(changed | removed)
    previous = ownership.entries.get(key, ("", set()))[1]
    ownership.set(key, rt.api_version, (previous - removed) | changed)
    times = _times(managed)
    times[key] = now
    meta["managedFields"] = ownership.render(times, now)
