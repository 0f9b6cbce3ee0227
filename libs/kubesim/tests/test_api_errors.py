"""Bad requests get the right 4xx Status, and the server keeps serving afterwards."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from flotilla.kubesim.server import BODY_LIMIT, KubeSim
from flotilla.kubesim.testing import http_session

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
JSON = {"Content-Type": "application/json"}


def as_file(obj: Any) -> io.BytesIO:
    """Large bodies go as a file object, which aiohttp streams without a warning."""
    return io.BytesIO(json.dumps(obj).encode())


@pytest.fixture
async def session(hub: KubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with http_session(hub, base_url=hub.url, headers=headers) as http:
        yield http


@pytest.mark.parametrize(
    ("method", "path", "content_type", "body", "code", "reason"),
    [
        ("POST", CONFIGMAPS, "application/json", b"{not json", 400, "BadRequest"),
        ("POST", CONFIGMAPS, "application/yaml", b"a: [unclosed", 400, "BadRequest"),
        ("POST", CONFIGMAPS, "application/json", b"[1, 2]", 400, "BadRequest"),
        ("POST", CONFIGMAPS, "application/json", b"", 400, "BadRequest"),
        ("POST", CONFIGMAPS, "text/plain", b"{}", 415, "UnsupportedMediaType"),
        ("PATCH", f"{CONFIGMAPS}/x", "application/json", b"{}", 415, "UnsupportedMediaType"),
        (
            "POST",
            CONFIGMAPS,
            "application/json",
            b'{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}',
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/widgets",
            "application/json",
            b"{}",
            404,
            "NotFound",
        ),
        ("GET", "/apis/example.com/v1/widgets", None, None, 404, "NotFound"),
        ("GET", "/nonsense", None, None, 404, "NotFound"),
        ("GET", f"{CONFIGMAPS}?labelSelector=a%20in%20(", None, None, 400, "BadRequest"),
        ("GET", f"{CONFIGMAPS}?limit=abc", None, None, 400, "BadRequest"),
        ("GET", f"{CONFIGMAPS}?continue=garbage", None, None, 400, "BadRequest"),
        ("PUT", CONFIGMAPS, "application/json", b"{}", 405, "MethodNotAllowed"),
        (
            "POST",
            CONFIGMAPS,
            "application/json",
            b'{"metadata": {"name": "x", "resourceVersion": "5"}}',
            400,
            "BadRequest",
        ),
    ],
    ids=[
        "malformed-json",
        "malformed-yaml",
        "json-not-an-object",
        "empty-body",
        "wrong-content-type",
        "patch-wrong-content-type",
        "kind-mismatch",
        "unknown-kind",
        "unknown-group",
        "unknown-path",
        "bad-label-selector",
        "bad-limit",
        "bad-continue",
        "put-on-collection",
        "resource-version-on-create",
    ],
)
async def test_bad_requests(
    session: aiohttp.ClientSession,
    method: str,
    path: str,
    content_type: str | None,
    body: bytes | None,
    code: int,
    reason: str,
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    async with session.request(method, path, data=body, headers=headers) as resp:
        assert resp.status == code
        status = await resp.json()
    assert status["kind"] == "Status"
    assert status["reason"] == reason
    assert status["code"] == code
    async with session.get(CONFIGMAPS) as resp:
        assert resp.status == 200


async def test_yaml_create(session: aiohttp.ClientSession) -> None:
    body = (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\n"
        b"  annotations:\n    when: 2026-01-01T00:00:00Z\ndata:\n  k: v\n  day: 2026-01-01\n"
    )
    async with session.post(
        CONFIGMAPS, data=body, headers={"Content-Type": "application/yaml"}
    ) as resp:
        assert resp.status == 201
        created = await resp.json()
    assert created["data"] == {"k": "v", "day": "2026-01-01"}
    assert created["metadata"]["annotations"] == {"when": "2026-01-01T00:00:00Z"}


async def test_body_over_limit_is_413(session: aiohttp.ClientSession) -> None:
    big = {"metadata": {"name": "big"}, "data": {"blob": "x" * (BODY_LIMIT + 10)}}
    async with session.post(CONFIGMAPS, data=as_file(big), headers=JSON) as resp:
        assert resp.status == 413
        status = await resp.json()
    assert status["reason"] == "RequestEntityTooLarge"

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b" " * (1 << 20)

    async with session.post(
        CONFIGMAPS, data=chunks(), headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 413
    fine = {"metadata": {"name": "fine"}, "data": {"blob": "x" * (BODY_LIMIT - 1000)}}
    async with session.post(CONFIGMAPS, data=as_file(fine), headers=JSON) as resp:
        assert resp.status == 201


async def test_stats(session: aiohttp.ClientSession, client: Any) -> None:
    async with session.get("/sim/v1/stats") as resp:
        stats = await resp.json()
    assert stats["hub"] is True
    assert stats["objects"]["namespaces"] == 4
    assert stats["podsByPhase"] == {}
    assert stats["watches"] == 0


async def test_sim_endpoints_need_the_token(hub: KubeSim) -> None:
    async with (
        http_session(hub) as http,
        http.post(f"{hub.url}/sim/v1/outage", json={"down": True}) as resp,
    ):
        assert resp.status == 401
    assert not hub.down
