"""The syncer's REST calls against a plain HTTP server: what reaches the server
(credentials, the client's headers, the body as JSON, the query) and what comes back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.common import kube
from flotilla.common.testing import token_kubeconfig
from flotilla.syncer import rest

pytestmark = pytest.mark.integration

WEB = "/apis/apps/v1/namespaces/shop/deployments/web"


@pytest.fixture
async def server() -> AsyncIterator[tuple[ApiClient, list[dict[str, Any]]]]:
    """A client (bearer token) and the requests a stand-in API server saw."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": list(request.query.items()),
                "authorization": request.headers.get("Authorization"),
                "user_agent": request.headers.get("User-Agent", ""),
                "content_type": request.headers.get("Content-Type"),
                "body": json.loads(body) if body else None,
            }
        )
        if request.path.endswith("/missing"):
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            for kind in ("ADDED", "MODIFIED"):
                line = {"type": kind, "object": {"metadata": {"name": "web"}}}
                await response.write(json.dumps(line).encode() + b"\n\n")
            await response.write_eof()
            return response
        return web.json_response({"kind": "Deployment", "metadata": {"name": "web"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    kubeconfig = token_kubeconfig(f"http://127.0.0.1:{port}", "member-token", "m")
    try:
        async with await kube.client_from_kubeconfig(kubeconfig=kubeconfig) as api:
            yield api, seen
    finally:
        await runner.cleanup()


async def test_an_apply_sends_the_manifest_as_json_with_the_clients_credentials(
    server: tuple[ApiClient, list[dict[str, Any]]],
) -> None:
    api, seen = server
    manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}}
    query = [("fieldManager", "flotilla"), ("force", "true")]
    answer = await rest.call(
        api, "PATCH", WEB, query=query, body=manifest, content_type=rest.APPLY_PATCH, decode=False
    )
    assert answer == {}
    assert await rest.call(api, "GET", WEB) == {"kind": "Deployment", "metadata": {"name": "web"}}
    applied, read = seen
    assert applied["method"] == "PATCH" and applied["path"] == WEB
    assert applied["query"] == query
    assert applied["body"] == manifest
    assert applied["content_type"] == rest.APPLY_PATCH
    assert applied["authorization"] == read["authorization"] == "Bearer member-token"
    assert applied["user_agent"] == api.default_headers["User-Agent"]
    assert read["method"] == "GET" and read["body"] is None


async def test_a_failure_is_the_api_exception_with_the_servers_answer(
    server: tuple[ApiClient, list[dict[str, Any]]],
) -> None:
    api, _ = server
    with pytest.raises(ApiException) as caught:
        await rest.call(api, "DELETE", "/apis/apps/v1/namespaces/shop/deployments/missing")
    assert caught.value.status == 404
    assert json.loads(caught.value.body)["code"] == 404


async def test_a_watch_streams_its_events(
    server: tuple[ApiClient, list[dict[str, Any]]],
) -> None:
    api, seen = server
    path = "/apis/apps/v1/deployments"
    changes = [c async for c in rest.stream(api, path, [("labelSelector", "flotilla.io/origin")])]
    assert [c["type"] for c in changes] == ["ADDED", "MODIFIED"]
    (watch,) = seen
    assert watch["authorization"] == "Bearer member-token"
    assert ("watch", "true") in watch["query"]
    assert ("labelSelector", "flotilla.io/origin") in watch["query"]
