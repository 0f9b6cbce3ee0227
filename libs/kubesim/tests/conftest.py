"""Fixtures for the kubesim API tests: a hub server and a kubernetes_asyncio client for it.

The client is built exactly as a Flotilla service builds one: from the kubeconfig file
kubesim wrote, through `config.new_client_from_config`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import config

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions, Simulator
from flotilla.kubesim.store import Store

from .simcluster import FAST, Cluster


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


@pytest.fixture
async def cluster_factory() -> AsyncIterator[Callable[..., Any]]:
    started: list[Simulator] = []

    async def make(**options: Any) -> Cluster:
        store = Store()
        sim = Simulator(store, SimOptions(**{**FAST, **options}), "test")
        await sim.start()
        started.append(sim)
        return Cluster(store, sim)

    yield make
    for sim in started:
        await sim.stop()


@pytest.fixture
async def cluster(cluster_factory: Callable[..., Any]) -> Cluster:
    result: Cluster = await cluster_factory(nodes=3)
    return result
