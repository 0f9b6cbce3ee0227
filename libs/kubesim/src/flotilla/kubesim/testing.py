"""pytest plugin: start kubesim clusters in a test and talk to them like a service would.

Loaded automatically through the `pytest11` entry point of `flotilla-kubesim`, so any
test in the workspace can ask for `kubesim_factory`:

    async def test_x(kubesim_factory):
        hub = await kubesim_factory("hub", hub=True)
        async with api_client(hub) as client:
            await CoreV1Api(client).list_namespace()

Every cluster the factory started is stopped at teardown, watches included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from flotilla.kubesim.server import KubeSim

KubeSimFactory = Callable[..., Awaitable[KubeSim]]


@pytest.fixture
async def kubesim_factory() -> AsyncIterator[KubeSimFactory]:
    """`await kubesim_factory(name, hub=..., sim=SimOptions(...), ...)` -> a started KubeSim."""
    started: list[KubeSim] = []

    async def factory(name: str, **kwargs: Any) -> KubeSim:
        kubesim = KubeSim(name, **kwargs)
        await kubesim.start()
        started.append(kubesim)
        return kubesim

    try:
        yield factory
    finally:
        for kubesim in reversed(started):
            await kubesim.stop()


def http_session(kubesim: KubeSim, **kwargs: Any) -> aiohttp.ClientSession:
    """A raw aiohttp session that trusts the cluster's CA (no Authorization header added)."""
    connector = aiohttp.TCPConnector(ssl=kubesim.client_ssl())
    return aiohttp.ClientSession(connector=connector, **kwargs)


def auth_session(kubesim: KubeSim, **kwargs: Any) -> aiohttp.ClientSession:
    """`http_session` that also sends the cluster's bearer token."""
    headers = {"Authorization": f"Bearer {kubesim.token}", **kwargs.pop("headers", {})}
    return http_session(kubesim, headers=headers, **kwargs)


@asynccontextmanager
async def api_client(kubesim: KubeSim) -> AsyncIterator[Any]:
    """A kubernetes_asyncio `ApiClient` configured from the cluster's own kubeconfig."""
    from kubernetes_asyncio import config

    client = await config.new_client_from_config_dict(kubesim.kubeconfig(), context=kubesim.name)
    try:
        yield client
    finally:
        await client.close()
