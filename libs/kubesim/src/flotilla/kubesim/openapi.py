"""The OpenAPI documents kubesim publishes (`/openapi/v2`, `/openapi/v3/...`) and the
field checks they drive (`fieldValidation`, pruning of unknown fields).

kubectl reads them for three things: `explain` (OpenAPI v3), whether a type accepts
`fieldValidation` (the PATCH operation of its path in the v3 group-version document
must list it; then kubectl leaves validation to the server instead of downloading
OpenAPI v2), and the merge keys of strategic merge patches. So each served type gets
a schema carrying `x-kubernetes-group-version-kind`, and item paths whose operations
carry the same extension and the query parameters a real server lists.

Built-in schemas come from `builtin_schemas.json.gz` next to this module (~70 KiB),
which `python -m flotilla.kubesim.openapi` generates from the model classes of
`kubernetes_asyncio` (generated in turn from the public Kubernetes OpenAPI
definitions, Apache-2.0): property names and types from `openapi_types` and
`attribute_map`, descriptions from the property docstrings, required fields from the
generated setters, patch merge keys from `flotilla.kubesim.patch`. Vendored rather than
derived at run time because importing `kubernetes_asyncio` costs a kubesim process
~2 s and ~70 MiB; a test checks the file matches the generator. The document is
coarser than upstream's: no formats beyond date-time, `IntOrString`, `Quantity` and
`RawExtension` fields are untyped, and no list-type markers besides the merge keys.
CRD schemas are published as written in each served version.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flotilla.common import patches
from flotilla.kubesim import schema as crd_schema
from flotilla.kubesim.resources import BUILTIN_TYPES, ResourceType

Schema = dict[str, Any]
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"

_MODEL_NAME = re.compile(r"^([A-Z][a-z]+)?(V\d+(?:alpha\d+|beta\d+)?)([A-Z]\w*)$")
_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_META = frozenset(
    {
        "ObjectMeta",
        "ListMeta",
        "LabelSelector",
        "LabelSelectorRequirement",
        "OwnerReference",
        "ManagedFieldsEntry",
        "Condition",
        "Status",
        "StatusDetails",
        "StatusCause",
    }
)
_PACKAGES = {
    "": "io.k8s.api.core",
    "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions",
}
_PRIMITIVES: dict[str, Schema] = {
    "str": {"type": "string"},
    "int": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "double"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "object": {},
}


def _query(name: str, description: str, kind: str = "string") -> Schema:
    return {"name": name, "in": "query", "description": description, "schema": {"type": kind}}


_DRY_RUN = _query("dryRun", "When present, indicates that modifications should not be persisted.")
_FIELD_MANAGER = _query(
    "fieldManager", "A name associated with the actor or entity that is making these changes."
)
_FIELD_VALIDATION = _query(
    "fieldValidation", "How the server treats unknown and duplicate fields: Ignore, Warn or Strict."
)
_FORCE = _query("force", "Force is going to force Apply requests.", "boolean")


def _package(group: str) -> str:
    if group in _PACKAGES:
        return _PACKAGES[group]
    return f"io.k8s.api.{group.split('.')[0]}"


def _model_class(rt: ResourceType) -> type[Any] | None:
    from kubernetes_asyncio.client import models

    version = rt.version.capitalize()
    prefix = rt.group.split(".")[0].capitalize() if rt.group else "Core"
    for name in (f"{prefix}{version}{rt.kind}", f"{version}{rt.kind}"):
        found = getattr(models, name, None)
        if isinstance(found, type):
            return found
    return None


def _description(cls: type[Any], attribute: str) -> str:
    prop = getattr(cls, attribute, None)
    doc = getattr(prop, "__doc__", None) or ""
    parts = [p.strip() for p in doc.split("\n\n")]
    if len(parts) < 3:
        return ""
    return parts[1].replace("  # noqa: E501", "").strip()


def _module_source(cls: type[Any]) -> str:
    """The text of the generated module holding `cls` (one model class per module); read
    whole rather than through `inspect.getsource`, which tokenizes and is 10x slower."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class _Builder:
    """Walks model classes from the served kinds and names each definition once."""

    def __init__(self) -> None:
        self.definitions: dict[str, Schema] = {}
        self.names: dict[str, str] = {}
        self.roots: dict[tuple[str, str], str] = {}

    def name_for(self, cls_name: str, group: str) -> str:
        if cls_name in self.names:
            return self.names[cls_name]
        match = _MODEL_NAME.match(cls_name)
        version, short = (match.group(2).lower(), match.group(3)) if match else ("v1", cls_name)
        if short in _META:
            name = f"io.k8s.apimachinery.pkg.apis.meta.{version}.{short}"
        else:
            name = f"{_package(group)}.{version}.{short}"
        taken = set(self.names.values())
        if name in taken:
            name = f"{name}{cls_name}"
        self.names[cls_name] = name
        return name

    def add_root(self, rt: ResourceType) -> None:
        cls = _model_class(rt)
        if cls is None:
            return
        name = self.add_class(cls, rt.group)
        self.definitions[name]["x-kubernetes-group-version-kind"] = [
            {"group": rt.group, "version": rt.version, "kind": rt.kind}
        ]
        self.roots[(rt.api_version, rt.kind)] = name

    def add_class(self, cls: type[Any], group: str) -> str:
        name = self.name_for(cls.__name__, group)
        if name in self.definitions:
            return name
        schema: Schema = {"type": "object", "properties": {}}
        self.definitions[name] = schema
        types: dict[str, str] = getattr(cls, "openapi_types", {})
        wire: dict[str, str] = getattr(cls, "attribute_map", {})
        required = _REQUIRED.findall(_module_source(cls))
        for attribute, type_name in types.items():
            field = wire.get(attribute, attribute)
            prop = self.type_schema(type_name, group)
            description = _description(cls, attribute)
            if description:
                prop = {**prop, "description": description}
            merge_key = patches.MERGE_KEYS.get(field)
            if merge_key is not None and prop.get("type") == "array":
                prop["x-kubernetes-patch-merge-key"] = merge_key
                prop["x-kubernetes-patch-strategy"] = "merge"
            elif field in patches.MERGED_PRIMITIVE_LISTS:
                prop["x-kubernetes-patch-strategy"] = "merge"
            schema["properties"][field] = prop
        fields = [wire.get(a, a) for a in dict.fromkeys(required)]
        if fields:
            schema["required"] = fields
        return name

    def type_schema(self, type_name: str, group: str) -> Schema:
        if type_name in _PRIMITIVES:
            return dict(_PRIMITIVES[type_name])
        if type_name.startswith("list[") and type_name.endswith("]"):
            return {"type": "array", "items": self.type_schema(type_name[5:-1], group)}
        if type_name.startswith("dict(str, ") and type_name.endswith(")"):
            inner = self.type_schema(type_name[len("dict(str, ") : -1], group)
            return {"type": "object", "additionalProperties": inner}
        from kubernetes_asyncio.client import models

        cls = getattr(models, type_name, None)
        if not isinstance(cls, type):
            return {}
        return {"$ref": V3_REF + self.add_class(cls, group)}


BUILTIN_SCHEMAS = Path(__file__).with_name("builtin_schemas.json.gz")


def generate_builtin_schemas() -> bytes:
    """The vendored file's content, derived from the installed `kubernetes_asyncio`."""
    builder = _Builder()
    for rt in BUILTIN_TYPES:
        builder.add_root(rt)
    roots = [[api_version, kind, name] for (api_version, kind), name in builder.roots.items()]
    body = {"definitions": builder.definitions, "roots": roots}
    text = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return gzip.compress(text, compresslevel=9, mtime=0)


@functools.cache
def builtin_schemas() -> tuple[dict[str, Schema], dict[tuple[str, str], str]]:
    """(definitions, (apiVersion, kind) -> definition name) of the built-in kinds."""
    body = json.loads(gzip.decompress(BUILTIN_SCHEMAS.read_bytes()))
    roots = {(api_version, kind): name for api_version, kind, name in body["roots"]}
    return body["definitions"], roots


def _crd_definition(rt: ResourceType, schema: Schema) -> Schema:
    out: Schema = json.loads(json.dumps(schema))
    properties = out.setdefault("properties", {})
    properties["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an "
        "object.",
    }
    properties["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object "
        "represents.",
    }
    meta_name = builtin_schemas()[1].get(("v1", "Namespace"), "")
    object_meta = builtin_schemas()[0][meta_name]["properties"]["metadata"]
    properties["metadata"] = {
        **object_meta,
        "description": "Standard object's metadata.",
    }
    out["x-kubernetes-group-version-kind"] = [
        {"group": rt.group, "version": rt.version, "kind": rt.kind}
    ]
    out.setdefault("type", "object")
    return out


def crd_definition_name(rt: ResourceType) -> str:
    reversed_group = ".".join(reversed(rt.group.split(".")))
    return f"{reversed_group}.{rt.version}.{rt.kind}"


def _operation(rt: ResourceType, action: str, ref: str, params: list[Schema]) -> Schema:
    return {
        "operationId": f"{action}{rt.kind}",
        "parameters": params,
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"$ref": ref}}},
            }
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {
            "group": rt.group,
            "version": rt.version,
            "kind": rt.kind,
        },
    }


def _paths(rt: ResourceType, ref: str) -> dict[str, Schema]:
    base = "/api/v1" if not rt.group else f"/apis/{rt.group}/{rt.version}"
    scope = "/namespaces/{namespace}" if rt.namespaced else ""
    collection = f"{base}{scope}/{rt.plural}"
    writes = [_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION]
    return {
        collection: {
            "get": _operation(rt, "list", ref, []),
            "post": _operation(rt, "post", ref, writes),
        },
        f"{collection}/{{name}}": {
            "get": _operation(rt, "get", ref, []),
            "put": _operation(rt, "put", ref, writes),
            "patch": _operation(rt, "patch", ref, [*writes, _FORCE]),
            "delete": _operation(rt, "delete", ref, [_DRY_RUN]),
        },
    }


def _referenced(definitions: dict[str, Schema], roots: Iterable[str]) -> dict[str, Schema]:
    """The definitions reachable from `roots` (a group-version document stays small)."""
    out: dict[str, Schema] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in out or name not in definitions:
            continue
        out[name] = definitions[name]
        text = json.dumps(definitions[name])
        pending.extend(re.findall(r'"#/components/schemas/([^"]+)"', text))
    return out


class Documents:
    """OpenAPI documents for what a `Store` serves right now."""

    def __init__(
        self,
        types: Callable[[], Iterable[ResourceType]],
        crd_schema: Callable[[ResourceType], Schema | None],
    ) -> None:
        self._types = types
        self._crd_schema = crd_schema

    def _definitions(self) -> tuple[dict[str, Schema], dict[tuple[str, str], str]]:
        builtin, roots = builtin_schemas()
        definitions = dict(builtin)
        names = dict(roots)
        for rt in self._types():
            if not rt.custom:
                continue
            schema = self._crd_schema(rt) or {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
            name = crd_definition_name(rt)
            definitions[name] = _crd_definition(rt, schema)
            names[(rt.api_version, rt.kind)] = name
        return definitions, names

    def schema_for(self, rt: ResourceType) -> tuple[Schema, dict[str, Schema]] | None:
        """The root schema of a kind and the definitions its `$ref`s point into."""
        definitions, names = self._definitions() if rt.custom else builtin_schemas()
        name = names.get((rt.api_version, rt.kind))
        if name is None:
            return None
        return definitions[name], definitions

    def group_versions(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((rt.group, rt.version) for rt in self._types()))

    def v3_group_version(self, group: str, version: str) -> Schema | None:
        types = [rt for rt in self._types() if rt.group == group and rt.version == version]
        if not types:
            return None
        definitions, names = self._definitions()
        paths: dict[str, Schema] = {}
        roots = []
        for rt in types:
            name = names.get((rt.api_version, rt.kind))
            if name is None:
                continue
            roots.append(name)
            paths.update(_paths(rt, V3_REF + name))
        title = f"Kubernetes {group or 'core'} {version}"
        return {
            "openapi": "3.0.0",
            "info": {"title": title, "version": "unversioned"},
            "paths": paths,
            "components": {"schemas": _referenced(definitions, roots)},
        }

    def v3_root(self) -> Schema:
        paths: dict[str, Schema] = {}
        for group, version in self.group_versions():
            doc = self.v3_group_version(group, version)
            key = f"api/{version}" if not group else f"apis/{group}/{version}"
            digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64]
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest.upper()}"}
        return {"paths": paths}

    def v2(self) -> Schema:
        definitions, names = self._definitions()
        paths: dict[str, Schema] = {}
        for rt in self._types():
            name = names.get((rt.api_version, rt.kind))
            if name is not None:
                paths.update(_paths(rt, V3_REF + name))
        body = {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths,
            "definitions": definitions,
        }
        # v2 operations carry parameters and responses in a different shape; kubectl reads
        # only the definitions and the group-version-kind extensions from this document.
        for item in paths.values():
            for operation in item.values():
                operation["parameters"] = [
                    {k: v for k, v in p.items() if k != "schema"} | {"type": "string"}
                    for p in operation["parameters"]
                ]
                ref = operation["responses"]["200"]["content"]["application/json"]["schema"]
                operation["responses"] = {"200": {"description": "OK", "schema": ref}}
        return json.loads(json.dumps(body).replace(V3_REF, V2_REF))  # type: ignore[no-any-return]


Mismatch = tuple[str, str, Any]  # path, expected type, value found
_GO_TYPES = {
    "integer": "int64",
    "number": "float64",
    "string": "string",
    "boolean": "bool",
    "array": "array",
    "object": "object",
}


def unknown_fields(
    value: Any, schema: Schema, definitions: dict[str, Schema], *, prune: bool
) -> tuple[list[str], list[Mismatch]]:
    """Paths (`spec.foo`, `spec.containers[0].bar`) of fields the schema does not declare,
    and values whose JSON type differs from the declared one.

    With `prune`, unknown fields are removed from `value` in place, as decoding into the
    typed structs of a real API server drops them.
    """
    found: list[str] = []
    mismatched: list[Mismatch] = []
    _walk(value, schema, definitions, "", found, mismatched, prune, root=True)
    return found, mismatched


def _resolve(schema: Any, definitions: dict[str, Schema]) -> Any:
    for _ in range(8):
        if not isinstance(schema, dict):
            return schema
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            all_of = schema.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1 and "properties" not in schema:
                schema = all_of[0]
                continue
            return schema
        schema = definitions.get(ref.rsplit("/", 1)[-1], {})
    return schema


def _walk(
    value: Any,
    schema: Any,
    definitions: dict[str, Schema],
    path: str,
    found: list[str],
    mismatched: list[Mismatch],
    prune: bool,
    *,
    root: bool = False,
) -> None:
    schema = _resolve(schema, definitions)
    if not isinstance(schema, dict) or value is None:
        return
    kind = schema.get("type")
    if (
        isinstance(kind, str)
        and not schema.get("x-kubernetes-int-or-string")
        and not crd_schema.type_ok(value, kind)
    ):
        mismatched.append((path, _GO_TYPES.get(kind, kind), value))
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if schema.get("x-kubernetes-preserve-unknown-fields") is True or additional is True:
            open_ended = True
        else:
            open_ended = properties is None and not isinstance(additional, dict)
        embedded = root or schema.get("x-kubernetes-embedded-resource") is True
        for key in list(value):
            sub = (properties or {}).get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            where = f"{path}.{key}" if path else key
            if sub is None:
                if open_ended or (embedded and key in ("apiVersion", "kind", "metadata")):
                    continue
                found.append(where)
                if prune:
                    del value[key]
                continue
            _walk(value[key], sub, definitions, where, found, mismatched, prune)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                _walk(item, items, definitions, f"{path}[{index}]", found, mismatched, prune)


if __name__ == "__main__":
    BUILTIN_SCHEMAS.write_bytes(generate_builtin_schemas())
