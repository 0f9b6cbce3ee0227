"""What a real API server refuses, kubesim refuses the same way (fieldValidation, built-in
type rules, sizes, nesting, CEL rules of CRDs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import auth_session

from . import builders

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def http(hub: KubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    async with auth_session(hub, base_url=hub.url) as session:
        yield session


def with_unknown(name: str) -> dict[str, Any]:
    body = builders.deployment(name)
    body["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    body["spec"]["surprise"] = True
    return body


UNKNOWN = [
    'unknown field "spec.surprise"',
    'unknown field "spec.template.spec.containers[0].bogus"',
]


async def test_strict_refuses_unknown_fields_naming_them(http: aiohttp.ClientSession) -> None:
    async with http.post(f"{DEPLOYMENTS}?fieldValidation=Strict", json=with_unknown("s")) as r:
        status = await r.json()
    assert r.status == 400 and status["reason"] == "BadRequest"
    assert status["message"].startswith('Deployment in version "v1" cannot be handled')
    assert all(text in status["message"] for text in UNKNOWN)
    async with http.get(f"{DEPLOYMENTS}/s") as r:
        assert r.status == 404


@pytest.mark.parametrize("directive", ["Warn", None])
async def test_warn_answers_in_warning_headers_and_drops_the_fields(
    http: aiohttp.ClientSession, directive: str | None
) -> None:
    query = f"?fieldValidation={directive}" if directive else ""
    async with http.post(f"{DEPLOYMENTS}{query}", json=with_unknown("w")) as r:
        created = await r.json()
        warnings = r.headers.getall("Warning", [])
    assert r.status == 201
    assert sorted(warnings) == sorted(f"299 - {json.dumps(text)}" for text in UNKNOWN)
    assert "surprise" not in created["spec"]
    assert "bogus" not in created["spec"]["template"]["spec"]["containers"][0]


async def test_ignore_drops_silently(http: aiohttp.ClientSession) -> None:
    async with http.post(f"{DEPLOYMENTS}?fieldValidation=Ignore", json=with_unknown("i")) as r:
        assert r.status == 201 and "Warning" not in r.headers


async def test_duplicate_fields(http: aiohttp.ClientSession) -> None:
    raw = b'{"metadata": {"name": "dup", "name": "dup"}, "data": {"a": "1"}}'
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{CONFIGMAPS}?fieldValidation=Strict", data=raw, headers=headers) as r:
        assert r.status == 400
        assert 'duplicate field "name"' in (await r.json())["message"]
    async with http.post(f"{CONFIGMAPS}?fieldValidation=Warn", data=raw, headers=headers) as r:
        assert r.status == 201
        duplicate = json.dumps('duplicate field "name"')
        assert r.headers.getall("Warning") == [f"299 - {duplicate}"]


@pytest.mark.parametrize(
    ("replicas", "code", "reason"),
    [(-1, 422, "Invalid"), ("3", 400, "BadRequest"), (True, 400, "BadRequest")],
    ids=["negative", "string", "bool"],
)
async def test_bad_replicas_are_refused(
    http: aiohttp.ClientSession, replicas: Any, code: int, reason: str
) -> None:
    body = builders.deployment("r")
    body["spec"]["replicas"] = replicas
    async with http.post(DEPLOYMENTS, json=body) as r:
        status = await r.json()
    assert (r.status, status["reason"]) == (code, reason), status
    assert "spec.replicas" in status["message"]


async def test_annotations_over_256_kib_are_refused(http: aiohttp.ClientSession) -> None:
    body = {"metadata": {"name": "big", "annotations": {"a": "x" * (256 * 1024)}}}
    async with http.post(CONFIGMAPS, json=body) as r:
        status = await r.json()
    assert r.status == 422 and "metadata.annotations: Too long" in status["message"]
    body["metadata"]["annotations"] = {"a": "x" * (255 * 1024)}
    async with http.post(CONFIGMAPS, json=body) as r:
        assert r.status == 201


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_deep_nesting_is_400_not_500(http: aiohttp.ClientSession, depth: int) -> None:
    raw = '{"metadata": {"name": "deep"}, "data": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    headers = {"Content-Type": "application/json"}
    async with http.post(CONFIGMAPS, data=raw.encode(), headers=headers) as r:
        status = await r.json()
    assert r.status == 400 and "nested too deeply" in status["message"]


async def test_label_rules(http: aiohttp.ClientSession) -> None:
    body = {"metadata": {"name": "l", "labels": {"ok": "no spaces allowed"}}}
    async with http.post(CONFIGMAPS, json=body) as r:
        assert r.status == 422 and "metadata.labels" in (await r.json())["message"]


async def test_cel_rules_of_a_crd_refuse_with_422(http: aiohttp.ClientSession) -> None:
    spec = {
        "type": "object",
        "properties": {"low": {"type": "integer"}, "high": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.low <= self.high", "message": "low > high"},
            {"rule": "self.high >= oldSelf.high", "message": "high may only grow"},
        ],
    }
    crd = builders.crd("example.com", "Range", {"type": "object", "properties": {"spec": spec}})
    path = "/apis/example.com/v1/namespaces/default/ranges"
    async with http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd) as r:
        assert r.status == 201
    good = {"apiVersion": "example.com/v1", "kind": "Range", "metadata": {"name": "r"}}
    async with http.post(path, json={**good, "spec": {"low": 3, "high": 1}}) as r:
        status = await r.json()
    assert r.status == 422, status
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec",
            "message": 'Invalid value: "object": low > high',
        }
    ]
    async with http.post(path, json={**good, "spec": {"low": 1, "high": 5}}) as r:
        assert r.status == 201
    # The transition rule runs on updates only.
    patch = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(f"{path}/r", data=b'{"spec": {"high": 2}}', headers=patch) as r:
        assert r.status == 422 and "high may only grow" in (await r.json())["message"]
    async with http.patch(f"{path}/r", data=b'{"spec": {"high": 9}}', headers=patch) as r:
        assert r.status == 200
