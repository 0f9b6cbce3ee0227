"""The protobuf codec: golden bytes from the proto spec, JSON round trips, and bodies over HTTP."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flotilla.kubesim import protobuf, protobuf_messages
from flotilla.kubesim.protobuf import Field, ProtobufError
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import http_session


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field written out by hand: tag, length, payload."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


# ConfigMap {metadata {name "c1", namespace "default", labels {app: web}},
#            data {k: v}, immutable true}, spelled field by field from core/v1's
# generated.proto (ConfigMap: 1 metadata, 2 data, 4 immutable; ObjectMeta: 1 name,
# 3 namespace, 11 labels; map entries: 1 key, 2 value).
GOLDEN_META = _ld(1, b"c1") + _ld(3, b"default") + _ld(11, _ld(1, b"app") + _ld(2, b"web"))
GOLDEN_CONFIGMAP = _ld(1, GOLDEN_META) + _ld(2, _ld(1, b"k") + _ld(2, b"v")) + bytes([4 << 3, 1])
GOLDEN_JSON = {
    "metadata": {"name": "c1", "namespace": "default", "labels": {"app": "web"}},
    "data": {"k": "v"},
    "immutable": True,
}

# What kubectl v1.34.5 sent for `kubectl create namespace foo` (captured on the wire).
KUBECTL_CREATE_NAMESPACE = (
    b"k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x1b\n\x13\n\x03foo\x12\x00\x1a\x00"
    b'"\x00*\x002\x008\x00B\x00\x12\x00\x1a\x02\n\x00\x1a\x00"\x00'
)


def test_golden_configmap_bytes_match_the_proto_spec() -> None:
    assert protobuf.encode_message("ConfigMap", GOLDEN_JSON) == GOLDEN_CONFIGMAP
    assert protobuf.decode_message("ConfigMap", GOLDEN_CONFIGMAP) == GOLDEN_JSON


def test_envelope_carries_type_meta_around_the_raw_message() -> None:
    body = protobuf.encode({"apiVersion": "v1", "kind": "ConfigMap", **GOLDEN_JSON})
    type_meta = _ld(1, b"v1") + _ld(2, b"ConfigMap")
    expected_start = b"k8s\x00" + _ld(1, type_meta) + bytes([2 << 3 | 2, len(GOLDEN_CONFIGMAP)])
    assert body.startswith(expected_start)
    assert body[len(expected_start) :] == GOLDEN_CONFIGMAP + _ld(3, b"") + _ld(4, b"")


def test_kubectl_create_namespace_body_decodes_to_what_kubectl_sends_as_json() -> None:
    # kubectl's JSON for the same object: zero-valued plain fields are omitted,
    # the zero creationTimestamp is null and the empty spec/status are {}.
    assert protobuf.decode(KUBECTL_CREATE_NAMESPACE) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "foo", "creationTimestamp": None},
        "spec": {},
        "status": {},
    }


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"kind": "Namespace"}', "magic"),
        (KUBECTL_CREATE_NAMESPACE[:-9], "truncated"),
        (b"k8s\x00" + _ld(1, _ld(1, b"example.com/v1") + _ld(2, b"Widget")), "no protobuf table"),
        (b"k8s\x00" + _ld(3, b"gzip"), "contentEncoding"),
    ],
    ids=["json-not-protobuf", "truncated", "unknown-kind", "compressed"],
)
def test_bad_bodies_are_refused_with_a_reason(body: bytes, error: str) -> None:
    with pytest.raises(ProtobufError, match=error):
        protobuf.decode(body)


def test_encoding_refuses_fields_it_has_no_number_for() -> None:
    with pytest.raises(ProtobufError, match="surprise"):
        protobuf.encode({"apiVersion": "v1", "kind": "ConfigMap", "surprise": 1})


def test_pointer_zeroes_survive_and_plain_zeroes_are_omitted() -> None:
    spec = {"replicas": 0, "minReadySeconds": 0, "paused": False}
    assert protobuf.decode_message(
        "DeploymentSpec", protobuf.encode_message("DeploymentSpec", spec)
    ) == {"replicas": 0}


def test_special_messages_map_to_their_json_forms() -> None:
    obj = {
        "spec": {
            "minAvailable": "50%",
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app": "web"}},
        },
        "status": {"disruptedPods": {"p": "2026-01-02T03:04:05Z"}, "expectedPods": 3},
    }
    wire = protobuf.encode_message("PodDisruptionBudget", obj)
    assert protobuf.decode_message("PodDisruptionBudget", wire) == obj
    stamp = {"eventTime": "2026-01-02T03:04:05.123456Z", "deprecatedCount": -1}
    wire = protobuf.encode_message("events.Event", stamp)
    assert protobuf.decode_message("events.Event", wire) == stamp


def test_lists_carry_items_with_their_type_meta() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "ConfigMapList",
        "metadata": {"resourceVersion": "7", "continue": "abc", "remainingItemCount": 0},
        "items": [{"apiVersion": "v1", "kind": "ConfigMap", **GOLDEN_JSON}],
    }
    assert protobuf.decode(protobuf.encode(listed)) == listed


def test_unpacked_and_packed_repeated_integers_both_decode() -> None:
    unpacked = bytes([4 << 3, 5, 4 << 3, 7])
    packed = _ld(4, bytes([5, 7]))
    for wire in (unpacked, packed):
        assert protobuf.decode_message("PodSecurityContext", wire) == {"supplementalGroups": [5, 7]}


# -- round trips for every table, driven by the tables themselves ------------------------------

_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _times(micro: bool) -> st.SearchStrategy[str]:
    moments = st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    )
    if micro:
        return moments.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    return moments.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))


_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8
)


def _value(kind: str, pointer: bool, depth: int) -> st.SearchStrategy[Any]:
    if kind == "string":
        return st.text(max_size=8) if pointer else _TEXT
    if kind == "bytes":
        return st.binary(min_size=1, max_size=8).map(lambda b: base64.b64encode(b).decode())
    if kind == "bool":
        return st.booleans() if pointer else st.just(True)
    if kind in _INT_RANGE:
        low, high = _INT_RANGE[kind]
        ints = st.integers(low, high)
        return ints if pointer else ints.filter(bool)
    if kind in ("Time", "MicroTime"):
        return _times(kind == "MicroTime")
    if kind == "Quantity":
        return st.sampled_from(["1", "100m", "2Gi", "0.5"])
    if kind == "IntOrString":
        return st.one_of(st.integers(-(2**31), 2**31 - 1), _TEXT)
    if kind == "FieldsV1":
        return st.dictionaries(_TEXT.map(lambda t: f"f:{t}"), st.just({}), max_size=3)
    return _object(kind, depth + 1)


def _object(name: str, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    if depth > 6:
        return st.just({})
    msg = protobuf.message(name)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    inline: list[st.SearchStrategy[dict[str, Any]]] = []
    for f in msg.fields:
        if f.inline:
            inline.append(_object(f.kind, depth + 1))
            continue
        item = _value(f.kind, f.pointer or f.is_map or f.repeated, depth)
        if f.is_map:
            optional[f.name] = st.dictionaries(_TEXT, item, min_size=1, max_size=2)
        elif f.repeated:
            optional[f.name] = st.lists(item, min_size=1, max_size=2)
        else:
            optional[f.name] = item
    own = st.fixed_dictionaries({}, optional=optional)
    if not inline:
        return own
    return st.tuples(own, *inline).map(lambda parts: {k: v for p in parts for k, v in p.items()})


@pytest.mark.parametrize("name", sorted(protobuf_messages.MESSAGES))
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_table_round_trips_json(name: str, data: st.DataObject) -> None:
    obj = data.draw(_object(name))
    wire = protobuf.encode_message(name, obj)
    assert protobuf.decode_message(name, wire) == obj


def test_every_field_type_in_the_tables_is_known() -> None:
    known = {"string", "bytes", "bool", "int32", "int64"} | {
        "Time",
        "MicroTime",
        "Quantity",
        "IntOrString",
        "FieldsV1",
    }
    for name in protobuf_messages.MESSAGES:
        for f in protobuf.message(name).fields:
            assert isinstance(f, Field)
            assert f.kind in known or f.kind in protobuf_messages.MESSAGES, (name, f)
    for message in protobuf_messages.KINDS.values():
        assert message in protobuf_messages.MESSAGES


# -- over HTTP ---------------------------------------------------------------------------------


def _headers(hub: KubeSim, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {hub.token}", **extra}


async def test_protobuf_bodies_create_and_delete_over_http(hub: KubeSim) -> None:
    pb = protobuf.MEDIA_TYPE
    body = protobuf.encode({"apiVersion": "v1", "kind": "ConfigMap", **GOLDEN_JSON})
    async with http_session(hub) as http:
        url = f"{hub.url}/api/v1/namespaces/default/configmaps"
        async with http.post(
            url,
            data=body,
            headers=_headers(hub, **{"Content-Type": pb, "Accept": f"{pb},application/json"}),
        ) as resp:
            assert resp.status == 201, await resp.text()
            assert resp.content_type == "application/json"
            created = await resp.json()
        assert created["data"] == {"k": "v"}
        assert created["immutable"] is True
        assert created["metadata"]["labels"] == {"app": "web"}

        async with http.get(f"{url}/c1", headers=_headers(hub, Accept=pb)) as resp:
            assert resp.status == 200
            assert resp.content_type == pb
            assert protobuf.decode(await resp.read()) == created

        stale = protobuf.encode(
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": "1"},
            }
        )
        async with http.delete(
            f"{url}/c1", data=stale, headers=_headers(hub, **{"Content-Type": pb})
        ) as resp:
            assert resp.status == 409, await resp.text()
            assert "Precondition failed" in (await resp.json())["message"]
        options = protobuf.encode(
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        )
        async with http.delete(
            f"{url}/c1", data=options, headers=_headers(hub, **{"Content-Type": pb})
        ) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{url}/c1", headers=_headers(hub)) as resp:
            assert resp.status == 404


async def test_garbage_protobuf_is_a_400_and_untabled_kinds_a_406(hub: KubeSim) -> None:
    pb = protobuf.MEDIA_TYPE
    async with http_session(hub) as http:
        async with http.post(
            f"{hub.url}/api/v1/namespaces/default/configmaps",
            data=b"k8s\x00\xff",
            headers=_headers(hub, **{"Content-Type": pb}),
        ) as resp:
            assert resp.status == 400
            assert "could not be decoded" in (await resp.json())["message"]
        async with http.get(
            f"{hub.url}/apis/rbac.authorization.k8s.io/v1/clusterroles",
            headers=_headers(hub, Accept=pb),
        ) as resp:
            assert resp.status == 406
            assert json.loads(await resp.read())["reason"] == "NotAcceptable"
