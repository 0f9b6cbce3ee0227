"""The per-type informer loop against a kubesim API server: resume, 410, bookmarks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.common.api import GroupVersionKind
from flotilla.common.errors import InvalidObject, Unavailable
from flotilla.kubesim.server import KubeSim
from flotilla.watcher.watching import TypeClient, TypeWatch

pytestmark = pytest.mark.integration

CONFIG_MAP = GroupVersionKind("", "v1", "ConfigMap")


class RecordingSink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.relists: list[list[str]] = []

    async def relisted(self, gvk: GroupVersionKind, items: list[Any], revision: int) -> None:
        self.relists.append(sorted(i["metadata"]["name"] for i in items))
        assert all(i["kind"] == "ConfigMap" and i["apiVersion"] == "v1" for i in items)

    async def changed(self, gvk: GroupVersionKind, obj: Any) -> None:
        name = obj["metadata"]["name"]
        if name.startswith("poison"):
            raise InvalidObject(f"{name} can never be handled", reason="ObjectTooLarge")
        if name.startswith("flaky") and ("failed", name) not in self.seen:
            self.seen.append(("failed", name))
            raise Unavailable(f"{name}: the bus is down for a moment")
        self.seen.append(("changed", name))

    async def deleted(self, gvk: GroupVersionKind, obj: Any) -> None:
        self.seen.append(("deleted", obj["metadata"]["name"]))


class MemoryPositions:
    def __init__(self, start: str | None = None) -> None:
        self.value = start

    async def get(self, gvk: GroupVersionKind) -> str | None:
        return self.value

    async def put(self, gvk: GroupVersionKind, resource_version: str) -> None:
        self.value = resource_version


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching(
    hub: KubeSim, positions: MemoryPositions, *, resume: bool = True
) -> AsyncIterator[tuple[RecordingSink, Any]]:
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api, DynamicClient(api) as dyn:
        sink = RecordingSink()
        client = await TypeClient.discover(api, dyn, CONFIG_MAP)
        watch = TypeWatch(client, sink, positions, resume=resume)
        task = asyncio.create_task(watch.run())
        try:
            await asyncio.wait_for(watch.synced.wait(), 10)
            yield sink, k8s.CoreV1Api(api)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def config_map(name: str) -> Any:
    return {"metadata": {"name": name}, "data": {"k": "v"}}


async def test_resumes_from_the_position_and_sees_what_happened_after_it(
    kubesim_factory: Any,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    positions = MemoryPositions()
    async with watching(hub, positions) as (sink, core):
        await core.create_namespaced_config_map("default", config_map("before"))
        await eventually(lambda: ("changed", "before") in sink.seen)
    assert sink.relists == [[]]
    stopped_at = positions.value
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api:
        core = k8s.CoreV1Api(api)
        await core.create_namespaced_config_map("default", config_map("while-down"))
        await core.delete_namespaced_config_map("while-down", "default")
    async with watching(hub, positions) as (sink, _):
        await eventually(lambda: ("deleted", "while-down") in sink.seen)
    assert sink.relists == []
    assert sink.seen == [("changed", "while-down"), ("deleted", "while-down")]
    assert positions.value is not None and int(positions.value) > int(stopped_at or 0)


async def test_an_expired_position_relists(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True, watch_window=2)
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api:
        core = k8s.CoreV1Api(api)
        for index in range(5):
            await core.create_namespaced_config_map("default", config_map(f"cm-{index}"))
    async with watching(hub, MemoryPositions("1")) as (sink, _):
        await eventually(lambda: sink.relists)
    assert sink.relists == [[f"cm-{index}" for index in range(5)]]


async def test_bookmarks_move_a_quiet_types_position(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True, bookmark_interval=0.1)
    positions = MemoryPositions()
    async with watching(hub, positions, resume=False) as (_, core):
        listed_at = int(positions.value or 0)
        await core.create_namespace({"metadata": {"name": "elsewhere"}})
        await eventually(lambda: int(positions.value or 0) > listed_at)


async def test_a_hub_outage_is_ridden_out(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    positions = MemoryPositions()
    async with watching(hub, positions) as (sink, core):
        await hub.set_outage(True)
        await eventually(lambda: hub.stats()["watches"] == 0)
        await hub.set_outage(False)
        await core.create_namespaced_config_map("default", config_map("after"))
        await eventually(lambda: ("changed", "after") in sink.seen)
    # It resumed from its position rather than re-listing.
    assert sink.relists == [[]]


async def test_a_permanent_sink_error_skips_the_event_and_a_transient_one_retries_it(
    kubesim_factory: Any,
) -> None:
    """A poison event retried from the same position would be replayed forever and
    every later change of the type lost; a transient failure must not lose one."""
    hub = await kubesim_factory("hub", hub=True)
    positions = MemoryPositions()
    async with watching(hub, positions) as (sink, core):
        for name in ("poison", "flaky", "after"):
            await core.create_namespaced_config_map("default", config_map(name))
        await eventually(lambda: ("changed", "after") in sink.seen)
    assert sink.seen == [("failed", "flaky"), ("changed", "flaky"), ("changed", "after")]


async def test_a_watch_connection_closed_under_a_read_is_resumed(
    kubesim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp raises RuntimeError("Connection closed.") when the connection goes away
    under a read with neither an end nor an error fed to the stream; the watch resumes
    from its position instead of the loop dying."""
    hub = await kubesim_factory("hub", hub=True)
    positions = MemoryPositions()
    real_readuntil = aiohttp.StreamReader.readuntil
    broken: list[bool] = []

    async def closing_once(self: aiohttp.StreamReader, *args: Any, **kwargs: Any) -> bytes:
        if not broken and positions.value is not None:
            broken.append(True)
            raise RuntimeError("Connection closed.")
        return await real_readuntil(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.StreamReader, "readuntil", closing_once)
    async with watching(hub, positions) as (sink, core):
        await eventually(lambda: bool(broken))
        await core.create_namespaced_config_map("default", config_map("after"))
        await eventually(lambda: ("changed", "after") in sink.seen)
    assert sink.relists == [[]]  # resumed from its position, not re-listed
