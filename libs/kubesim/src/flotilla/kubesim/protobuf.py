"""Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`) to and from JSON.

kubectl's typed clients (`create namespace|configmap|secret|job|deployment|...`,
`drain`'s evictions, DeleteOptions) send protobuf, so kubesim has to read it; the
rest of kubesim only knows JSON objects, so a body is turned into exactly the JSON
object the same client would have sent as JSON, and a response into protobuf only
for a client that does not accept JSON (kubectl accepts both and gets JSON).

The wire format: the 4-byte magic `k8s\\x00`, then a `runtime.Unknown` envelope
{1 typeMeta {1 apiVersion, 2 kind}, 2 raw, 3 contentEncoding, 4 contentType} whose
`raw` is the object's message. The messages are proto2 as `go-to-protobuf` generates
them; their field numbers live in `protobuf_messages`. The varint/length-delimited
codec is written here by hand because no maintained Python library decodes
Kubernetes' protobuf without its generated code (and generating it would need
protoc plus the whole gogo/k8s proto tree for a handful of messages).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from aiohttp import web

from flotilla.kubesim import protobuf_messages
from flotilla.kubesim.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1
_SCALARS = frozenset({"string", "bytes", "bool", "int32", "int64"})
_VARINT_KINDS = frozenset({"bool", "int32", "int64"})
_SPECIAL = frozenset({"Time", "MicroTime", "Quantity", "IntOrString", "FieldsV1"})
_ZERO: dict[str, Any] = {"string": "", "bytes": "", "bool": False, "int32": 0, "int64": 0}
_TYPE_META = ("apiVersion", "kind")


class ProtobufError(ValueError):
    """A body that is not valid Kubernetes protobuf, or an object with no protobuf form."""


@dataclass(frozen=True)
class Field:
    """One field of a message table (see `protobuf_messages` for the grammar)."""

    number: int
    name: str
    kind: str
    repeated: bool = False
    is_map: bool = False
    pointer: bool = False
    inline: bool = False


@dataclass(frozen=True)
class Message:
    name: str
    fields: tuple[Field, ...]
    by_number: Mapping[int, Field]
    # JSON keys this message accepts, including those of inline children.
    json_keys: frozenset[str]
    # Top-level objects carry apiVersion/kind in JSON but not on the wire.
    object: bool


def _parse_field(spec: str) -> Field:
    parts = spec.split()
    if len(parts) not in (2, 3):
        raise ValueError(f"bad field spec {spec!r}")
    number, name = int(parts[0]), parts[1]
    kind = parts[2] if len(parts) == 3 else "string"
    inline = name.startswith("~")
    name = name.lstrip("~")
    pointer = kind.startswith("*")
    kind = kind.lstrip("*")
    repeated = kind.startswith("[]")
    kind = kind.removeprefix("[]")
    is_map = kind == "map" or kind.startswith("map:")
    if is_map:
        kind = kind.partition(":")[2] or "string"
    return Field(number, name, kind, repeated, is_map, pointer, inline)


@cache
def message(name: str) -> Message:
    """The parsed table of a message (`<Kind>List` names are synthesized)."""
    if name.startswith("List:"):
        item = name.removeprefix("List:")
        fields: tuple[Field, ...] = (
            Field(1, "metadata", "ListMeta"),
            Field(2, "items", item, repeated=True),
        )
    else:
        spec = protobuf_messages.MESSAGES.get(name)
        if spec is None:
            raise ProtobufError(f"no protobuf table for message {name}")
        fields = tuple(sorted((_parse_field(s) for s in spec.split(";") if s.strip()), key=_number))
    keys: set[str] = set()
    for f in fields:
        if f.inline:
            keys |= message(f.kind).json_keys
        else:
            keys.add(f.name)
    is_object = (
        name in protobuf_messages.KINDS.values()
        or name in protobuf_messages.ANY_VERSION_KINDS.values()
        or name.startswith("List:")
    )
    return Message(name, fields, {f.number: f for f in fields}, frozenset(keys), is_object)


def _number(f: Field) -> int:
    return f.number


def message_name(api_version: str, kind: str) -> str | None:
    """The message of a top-level kind, or None when kubesim has no table for it."""
    name = protobuf_messages.KINDS.get((api_version, kind))
    if name is not None:
        return name
    if kind in protobuf_messages.ANY_VERSION_KINDS:
        return protobuf_messages.ANY_VERSION_KINDS[kind]
    if kind.endswith("List"):
        item = protobuf_messages.KINDS.get((api_version, kind.removesuffix("List")))
        if item is not None:
            return f"List:{item}"
    return None


# -- wire primitives ---------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError("varint too long")


def _signed(value: int, kind: str) -> int:
    value &= _MASK64
    if value >= 1 << 63:
        value -= 1 << 64
    if kind == "int32":
        value = (value + (1 << 31)) % (1 << 32) - (1 << 31)
    return value


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for every field of one message."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, wire, value
        elif wire == _LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated length-delimited field")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if pos + size > len(data):
                raise ProtobufError("truncated fixed-width field")
            yield number, wire, int.from_bytes(data[pos : pos + size], "little")
            pos += size
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, _LEN) + _varint(len(payload)) + payload


# -- special messages with a JSON form of their own -----------------------------------------


def _format_time(payload: bytes, micro: bool) -> str | None:
    seconds = nanos = 0
    for number, _, value in _fields(payload):
        if number == 1 and isinstance(value, int):
            seconds = _signed(value, "int64")
        elif number == 2 and isinstance(value, int):
            nanos = _signed(value, "int32")
    if seconds == 0 and nanos == 0:
        return None  # Go's zero time, `null` in JSON
    stamp = datetime.fromtimestamp(seconds, UTC)
    if micro:
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanos // 1000:06d}Z"
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ProtobufError(f"{where}: a time must be an RFC 3339 string")
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ProtobufError(f"{where}: {value!r} is not an RFC 3339 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    seconds = int(stamp.timestamp() // 1)
    nanos = stamp.microsecond * 1000
    return _tag(1, _VARINT) + _varint(seconds) + _tag(2, _VARINT) + _varint(nanos)


def _decode_special(kind: str, payload: bytes) -> Any:
    if kind in ("Time", "MicroTime"):
        return _format_time(payload, kind == "MicroTime")
    values = {number: value for number, _, value in _fields(payload)}
    if kind == "Quantity":
        raw = values.get(1, b"")
        return raw.decode() if isinstance(raw, bytes) else ""
    if kind == "IntOrString":
        if values.get(1) == 1:
            raw = values.get(3, b"")
            return raw.decode() if isinstance(raw, bytes) else ""
        number = values.get(2, 0)
        return _signed(number, "int32") if isinstance(number, int) else 0
    raw = values.get(1, b"")  # FieldsV1
    try:
        return json.loads(raw) if isinstance(raw, bytes) and raw else {}
    except ValueError:
        raise ProtobufError("fieldsV1 is not JSON") from None


def _encode_special(kind: str, value: Any, where: str) -> bytes:
    if kind in ("Time", "MicroTime"):
        return _parse_time(value, where)
    if kind == "Quantity":
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ProtobufError(f"{where}: a quantity must be a string or a number")
        return _len_field(1, str(value).encode())
    if kind == "IntOrString":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ProtobufError(f"{where}: must be an integer or a string")
        if isinstance(value, str):
            return (_tag(1, _VARINT) + _varint(1) + _tag(2, _VARINT) + _varint(0)) + _len_field(
                3, value.encode()
            )
        return (
            _tag(1, _VARINT) + _varint(0) + _tag(2, _VARINT) + _varint(value) + _len_field(3, b"")
        )
    return _len_field(1, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


# -- decoding -------------------------------------------------------------------------------


def _decode_value(f: Field, wire: int, value: int | bytes, where: str) -> Any:
    kind = f.kind
    if kind in _VARINT_KINDS:
        if not isinstance(value, int):
            raise ProtobufError(f"{where}: expected a varint")
        return bool(value) if kind == "bool" else _signed(value, kind)
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a length-delimited field")
    if kind == "string":
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise ProtobufError(f"{where}: invalid UTF-8") from None
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind in _SPECIAL:
        return _decode_special(kind, value)
    return decode_message(kind, value, where)


def decode_message(name: str, data: bytes, where: str = "") -> dict[str, Any]:
    """One message's bytes as the JSON object Go's encoding/json would write."""
    msg = message(name)
    out: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        f = msg.by_number.get(number)
        if f is None:
            continue  # a field newer than this table: ignored, as Go ignores it
        path = f"{where}.{f.name}" if where else f.name
        if f.is_map:
            entry = _map_entry(f, value, path)
            out.setdefault(f.name, {}).update([entry])
        elif f.repeated and wire == _LEN and f.kind in _VARINT_KINDS and isinstance(value, bytes):
            pos, items = 0, out.setdefault(f.name, [])
            while pos < len(value):
                raw, pos = _read_varint(value, pos)
                items.append(_decode_value(f, _VARINT, raw, path))
        elif f.repeated:
            out.setdefault(f.name, []).append(_decode_value(f, wire, value, path))
        elif f.inline:
            if not isinstance(value, bytes):
                raise ProtobufError(f"{path}: expected a length-delimited field")
            out.update(decode_message(f.kind, value, where))
        else:
            decoded = _decode_value(f, wire, value, path)
            if f.kind in _SCALARS and not f.pointer and decoded == _ZERO[f.kind]:
                out.pop(f.name, None)  # omitempty
            else:
                out[f.name] = decoded
    return out


def _map_entry(f: Field, value: int | bytes, where: str) -> tuple[str, Any]:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a map entry")
    key, item = "", None
    value_field = Field(2, f.name, f.kind)
    for number, wire, raw in _fields(value):
        if number == 1 and isinstance(raw, bytes):
            key = raw.decode()
        elif number == 2:
            item = _decode_value(value_field, wire, raw, f"{where}[{key}]")
    if item is None and f.kind in _ZERO:
        item = _ZERO[f.kind]
    return key, item


def readable(data: bytes) -> bool:
    """Whether `decode` has a table for the message a framed body carries."""
    try:
        api_version, kind = _type_meta(data)
    except ProtobufError:
        return False
    return message_name(api_version, kind) is not None


def _type_meta(data: bytes) -> tuple[str, str]:
    if not data.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic")
    api_version = kind = ""
    for number, _, value in _fields(data[len(MAGIC) :]):
        if number == 1 and isinstance(value, bytes):
            for sub, _, text in _fields(value):
                if sub == 1 and isinstance(text, bytes):
                    api_version = text.decode()
                elif sub == 2 and isinstance(text, bytes):
                    kind = text.decode()
    return api_version, kind


def decode(data: bytes) -> dict[str, Any]:
    """A `k8s\\x00`-framed body as the JSON object it stands for (with apiVersion/kind)."""
    if not data.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic")
    api_version = kind = encoding = ""
    raw = b""
    for number, _, value in _fields(data[len(MAGIC) :]):
        if not isinstance(value, bytes):
            continue
        if number == 1:
            for sub, _, text in _fields(value):
                if sub == 1 and isinstance(text, bytes):
                    api_version = text.decode()
                elif sub == 2 and isinstance(text, bytes):
                    kind = text.decode()
        elif number == 2:
            raw = value
        elif number == 3:
            encoding = value.decode()
    if encoding:
        raise ProtobufError(f"unsupported contentEncoding {encoding!r}")
    name = message_name(api_version, kind)
    if name is None:
        raise ProtobufError(f"kubesim has no protobuf table for {api_version} {kind}")
    body = decode_message(name, raw)
    if name.startswith("List:"):
        item_kind = kind.removesuffix("List")
        body["items"] = [
            {"apiVersion": api_version, "kind": item_kind, **item} for item in body.get("items", [])
        ]
    return {"apiVersion": api_version, "kind": kind, **body}


# -- encoding -------------------------------------------------------------------------------


def _encode_value(f: Field, value: Any, where: str) -> bytes:
    kind = f.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise ProtobufError(f"{where}: must be a boolean")
        return _tag(f.number, _VARINT) + _varint(int(value))
    if kind in ("int32", "int64"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtobufError(f"{where}: must be an integer")
        return _tag(f.number, _VARINT) + _varint(value)
    if kind == "string":
        if not isinstance(value, str):
            raise ProtobufError(f"{where}: must be a string")
        return _len_field(f.number, value.encode())
    if kind == "bytes":
        if not isinstance(value, str):
            raise ProtobufError(f"{where}: must be a base64 string")
        try:
            return _len_field(f.number, base64.b64decode(value, validate=True))
        except binascii.Error:
            raise ProtobufError(f"{where}: is not valid base64") from None
    if kind in _SPECIAL:
        return _len_field(f.number, _encode_special(kind, value, where))
    if not isinstance(value, dict):
        raise ProtobufError(f"{where}: must be an object")
    return _len_field(f.number, encode_message(kind, value, where))


def encode_message(name: str, obj: Mapping[str, Any], where: str = "") -> bytes:
    """A JSON object as one message's bytes; every key must have a field."""
    msg = message(name)
    extra = set(obj) - msg.json_keys - (set(_TYPE_META) if msg.object else set())
    if extra:
        raise ProtobufError(f"{where or name}: no protobuf field for {sorted(extra)}")
    out = bytearray()
    for f in msg.fields:
        path = f"{where}.{f.name}" if where else f.name
        if f.inline:
            sub = {k: v for k, v in obj.items() if k in message(f.kind).json_keys}
            out += _len_field(f.number, encode_message(f.kind, sub, where))
            continue
        value = obj.get(f.name)
        if value is None:
            continue
        if f.is_map:
            if not isinstance(value, dict):
                raise ProtobufError(f"{path}: must be an object")
            value_field = Field(2, f.name, f.kind)
            for key in sorted(value):
                if value[key] is None:
                    continue
                entry = _len_field(1, str(key).encode()) + _encode_value(
                    value_field, value[key], f"{path}[{key}]"
                )
                out += _len_field(f.number, entry)
        elif f.repeated:
            if not isinstance(value, list):
                raise ProtobufError(f"{path}: must be a list")
            for index, item in enumerate(value):
                out += _encode_value(f, item, f"{path}[{index}]")
        else:
            out += _encode_value(f, value, path)
    return bytes(out)


def encode(obj: Mapping[str, Any]) -> bytes:
    """A JSON object (with apiVersion/kind) as a `k8s\\x00`-framed protobuf body."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    name = message_name(api_version, kind)
    if name is None:
        raise ProtobufError(f"kubesim has no protobuf table for {api_version} {kind}")
    type_meta = _len_field(1, api_version.encode()) + _len_field(2, kind.encode())
    raw = encode_message(name, obj)
    envelope = _len_field(1, type_meta) + _len_field(2, raw)
    envelope += _len_field(3, b"") + _len_field(4, b"")
    return MAGIC + envelope


# -- content negotiation --------------------------------------------------------------------


def _media_types(accept: str) -> list[str]:
    return [part.split(";")[0].strip().lower() for part in accept.split(",") if part.strip()]


def wants_protobuf_only(accept: str | None) -> bool:
    """True when the client asked for protobuf and would not take JSON."""
    if not accept:
        return False
    types = _media_types(accept)
    json_ok = any(t in ("application/json", "application/*", "*/*") for t in types)
    return MEDIA_TYPE in types and not json_ok


def negotiated(accept: str | None, response: web.StreamResponse) -> web.StreamResponse:
    """The response re-encoded as protobuf for a client that takes nothing else.

    Handlers always build JSON; clients that also accept JSON (kubectl, client-go,
    the Python clients) get it unchanged. Streams (watches) stay JSON. A body with no
    protobuf table (custom resources, kinds without a table) is a 406, as upstream
    answers for custom resources.
    """
    if not wants_protobuf_only(accept) or not isinstance(response, web.Response):
        return response
    if response.content_type != "application/json" or not isinstance(response.body, bytes):
        return response
    try:
        body = encode(json.loads(response.body))
    except ProtobufError as exc:
        error = ApiError(
            406,
            "NotAcceptable",
            f"only the following media types are accepted: application/json, "
            f"application/yaml ({exc})",
        )
        return web.Response(
            body=json.dumps(error.status()).encode(), status=406, content_type="application/json"
        )
    return web.Response(body=body, status=response.status, content_type=MEDIA_TYPE)
