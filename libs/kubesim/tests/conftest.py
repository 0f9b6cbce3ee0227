"""Fixtures for the kubesim API tests: a hub server and a kubernetes_asyncio client for it.

The client is built exactly as a Flotilla service builds one: from the kubeconfig file
kubesim wrote, through `config.new_client_from_config`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import config

from flotilla.kubesim.server import KubeSim


@pytest.fixture(autouse=True)
async def _no_leftover_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """API/CLI tests must not leave asyncio tasks behind (servers, watches, pumps)."""
    yield
    module = request.module.__name__.rpartition(".")[2]
    if not module.startswith(("test_api_", "test_cli")):
        return
    current = asyncio.current_task()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
    while True:
        leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not leftover or loop.time() > deadline:
            break
        await asyncio.sleep(0.02)
    assert not leftover, f"test left asyncio tasks running: {leftover}"


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with KubeSim("hub", hub=True, watch_window=50, bookmark_interval=0.2) as kubesim:
        kubesim.write_kubeconfig(tmp_path / "hub.kubeconfig")
        yield kubesim


@pytest.fixture
async def client(hub: KubeSim, tmp_path: Path) -> AsyncIterator[Any]:
    api = await config.new_client_from_config(
        config_file=str(tmp_path / "hub.kubeconfig"), context="hub"
    )
    try:
        yield api
    finally:
        await api.close()
