"""`dryRun=All`: full validation and defaulting, nothing stored, no watch event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import auth_session

from . import builders

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


@pytest.fixture
async def http(hub: KubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    async with auth_session(hub, base_url=hub.url) as session:
        yield session


async def test_no_write_is_stored_or_watched(http: aiohttp.ClientSession, hub: KubeSim) -> None:
    async with http.post(DEPLOYMENTS, json=builders.deployment("live")) as r:
        live = await r.json()
    rv = hub.store.resource_version
    watch = await http.get(f"{DEPLOYMENTS}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    async with http.post(f"{DEPLOYMENTS}?dryRun=All", json=builders.deployment("ghost")) as r:
        ghost = await r.json()
    assert r.status == 201 and ghost["spec"]["revisionHistoryLimit"] == 10
    assert ghost["metadata"]["uid"] and not ghost["metadata"].get("resourceVersion")
    async with http.patch(
        f"{DEPLOYMENTS}/live?dryRun=All", data=b'{"spec":{"replicas":5}}', headers=MERGE
    ) as r:
        assert r.status == 200 and (await r.json())["spec"]["replicas"] == 5
    live["spec"]["replicas"] = 7
    async with http.put(f"{DEPLOYMENTS}/live?dryRun=All", json=live) as r:
        assert r.status == 200 and (await r.json())["spec"]["replicas"] == 7
    applied = json.dumps({**builders.deployment("applied"), "spec": {"replicas": 2}})
    async with http.patch(
        f"{DEPLOYMENTS}/applied?dryRun=All&fieldManager=me", data=applied, headers=APPLY
    ) as r:
        assert r.status == 201, await r.text()
    async with http.delete(f"{DEPLOYMENTS}/live?dryRun=All") as r:
        assert r.status == 200
    async with http.delete(f"{DEPLOYMENTS}/live", json={"dryRun": ["All"]}) as r:
        assert r.status == 200
    # A dry run still validates.
    async with http.post(
        f"{DEPLOYMENTS}?dryRun=All", json={**builders.deployment("x"), "metadata": {"name": "Bad!"}}
    ) as r:
        assert r.status == 422
    async with http.post(f"{DEPLOYMENTS}?dryRun=Some", json=builders.deployment("y")) as r:
        assert r.status == 400
    assert hub.store.resource_version == rv
    async with http.get(f"{DEPLOYMENTS}/live") as r:
        assert (await r.json())["spec"]["replicas"] == 1
    for name in ("ghost", "applied"):
        async with http.get(f"{DEPLOYMENTS}/{name}") as r:
            assert r.status == 404
    events = await asyncio.wait_for(watch.read(), 5)
    watch.close()
    assert events == b""
