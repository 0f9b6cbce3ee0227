"""The three Kubernetes patch formats, one implementation for every user of them.

kubesim applies them to PATCH requests (mapping `PatchError` onto its 400/422
answers) and the transformer applies them to rendered manifests (a
Transformation's ``strategic``, ``merge`` and ``json`` patch types), so both
follow the same semantics.

* JSON merge patch (RFC 7386): hand-written because it is a dozen lines and the
  library candidates on PyPI are unmaintained.
* JSON patch (RFC 6902, incl. `test`): the `jsonpatch` library.
* Strategic merge patch: hand-written because the only implementation lives in Go
  (`k8s.io/apimachinery/pkg/util/strategicpatch`) and reads Go struct tags. The
  merge keys below are the `patchMergeKey` tags of the built-in kinds; lists
  without one are replaced, like upstream. Supports `$patch: replace|delete|merge`,
  `$deleteFromPrimitiveList/<field>`, `$retainKeys`, and ignores
  `$setElementOrder/<field>` (ordering hints only).
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import jsonpointer


class PatchError(ValueError):
    """A patch that is malformed (not the shape its format requires)."""


class PatchFailed(PatchError):
    """A well-formed patch that cannot be applied to this target (a failed JSON
    patch ``test``, a path that does not exist)."""


# Field name -> merge key, from the `patchMergeKey` struct tags of core/apps/batch types.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "addresses": "type",
    "resourceClaims": "name",
}
# Lists of scalars with `patchStrategy:"merge"`: merged as ordered sets.
MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386. Returns a new value; `target` is not modified (sub-values may be shared)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], operations: Any, *, in_place: bool = False) -> Any:
    """RFC 6902; a failed `test` or a bad path is `PatchFailed`, a malformed patch
    `PatchError`. `target` is not modified unless `in_place` (then it may be left
    half-patched by a failure, so only for a copy the caller discards on error)."""
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise PatchError("json patch must be a JSON array of operation objects")
    try:
        patch = jsonpatch.JsonPatch(operations)
        return patch.apply(target, in_place=in_place)
    except (jsonpatch.InvalidJsonPatch, TypeError) as exc:
        raise PatchError(f"invalid json patch: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchFailed(f"json patch could not be applied: {exc}") from exc


_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch for built-in kinds."""
    result = _merge_map(target, patch)
    if result is _DELETE:
        return {}
    return result


def _merge_map(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return _DELETE
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch directive $patch: {directive!r}")
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            remaining = [v for v in result.get(field) or [] if v not in value]
            if remaining:
                result[field] = remaining
            else:
                result.pop(field, None)
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = value
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def merge_key_for(field: str, items: list[Any]) -> str | None:
    """The merge key of a list field, or None for an atomic (replaced) list."""
    if field == "ports":
        # Container ports merge on containerPort, Service ports on port.
        dicts = [i for i in items if isinstance(i, dict)]
        return "containerPort" if any("containerPort" in i for i in dicts) else "port"
    return MERGE_KEYS.get(field)


def _merge_list(field: str, target: Any, patch: list[Any]) -> list[Any]:
    current = target if isinstance(target, list) else []
    if field in MERGED_PRIMITIVE_LISTS and all(not isinstance(v, dict) for v in patch):
        merged = list(current)
        for value in patch:
            if value not in merged:
                merged.append(value)
        return merged
    if not patch or not all(isinstance(i, dict) for i in patch):
        return patch
    if any(i.get("$patch") == "replace" for i in patch):
        return [i for i in patch if i.get("$patch") != "replace"]
    key = merge_key_for(field, [*current, *patch])
    if key is None:
        return patch
    merged = list(current)
    for item in patch:
        if key not in item:
            raise PatchError(f"map in list {field} is missing its merge key {key!r}")
        index = next(
            (
                n
                for n, existing in enumerate(merged)
                if isinstance(existing, dict) and existing.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
            continue
        if index is None:
            merged.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            merged[index] = _merge_map(merged[index], item)
    return merged
