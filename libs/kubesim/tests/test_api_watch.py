"""Watch semantics through `kubernetes_asyncio.watch.Watch`, as services consume them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.kubesim import server
from flotilla.kubesim import watch as watch_module
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import http_session


def configmap(name: str, **labels: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name, labels=labels or None))


async def collect(stream: Any, count: int, seconds: float = 5.0) -> list[tuple[str, str]]:
    """The first `count` (type, name) events of a watch stream."""
    events: list[tuple[str, str]] = []

    async def run() -> None:
        async for event in stream:
            events.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
            if len(events) >= count:
                return

    await asyncio.wait_for(run(), seconds)
    return events


async def test_watch_without_resource_version_starts_with_synthetic_added(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    await core.create_namespaced_config_map("default", configmap("before"))
    async with watch.Watch() as w:
        stream = w.stream(core.list_namespaced_config_map, "default", timeout_seconds=5)
        first = await collect(stream, 1)
        await core.create_namespaced_config_map("default", configmap("after"))
        rest = await collect(stream, 1)
    assert first == [("ADDED", "before")]
    assert rest == [("ADDED", "after")]


async def test_watch_from_resource_version_replays_history(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    listed = await core.list_namespaced_config_map("default")
    rv = listed.metadata.resource_version
    await core.create_namespaced_config_map("default", configmap("a"))
    obj = await core.read_namespaced_config_map("a", "default")
    obj.data = {"x": "1"}
    await core.replace_namespaced_config_map("a", "default", obj)
    await core.delete_namespaced_config_map("a", "default")
    async with watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=5
        )
        events = await collect(stream, 3)
    assert events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


async def test_watch_objects_are_typed_and_carry_resource_versions(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    async with watch.Watch() as w:
        stream = w.stream(core.list_namespaced_config_map, "default", timeout_seconds=5)
        await core.create_namespaced_config_map("default", configmap("typed"))
        event = await asyncio.wait_for(stream.__anext__(), 5)
    assert isinstance(event["object"], k8s.V1ConfigMap)
    assert w.resource_version == event["object"].metadata.resource_version


async def test_label_selector_watch_sees_objects_enter_and_leave(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    listed = await core.list_namespaced_config_map("default")
    async with watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            "default",
            label_selector="app=web",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        )
        await core.create_namespaced_config_map("default", configmap("m", app="db"))
        obj = await core.read_namespaced_config_map("m", "default")
        obj.metadata.labels = {"app": "web"}
        obj = await core.replace_namespaced_config_map("m", "default", obj)
        obj.data = {"k": "v"}
        obj = await core.replace_namespaced_config_map("m", "default", obj)
        obj.metadata.labels = {"app": "db"}
        await core.replace_namespaced_config_map("m", "default", obj)
        events = await collect(stream, 3)
    assert events == [("ADDED", "m"), ("MODIFIED", "m"), ("DELETED", "m")]


async def test_timeout_seconds_ends_the_stream(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    started = time.monotonic()
    async with watch.Watch() as w:
        events = [e async for e in w.stream(core.list_namespace, timeout_seconds=1)]
    assert 0.9 <= time.monotonic() - started < 4
    assert {e["type"] for e in events} == {"ADDED"}


async def test_bookmarks(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    async with watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            "default",
            allow_watch_bookmarks=True,
            resource_version="1",
            timeout_seconds=5,
        )
        event = await asyncio.wait_for(stream.__anext__(), 5)
    assert event["type"] == "BOOKMARK"
    assert int(event["raw_object"]["metadata"]["resourceVersion"]) >= 4


async def test_expired_resource_version_is_410(hub: KubeSim, client: Any) -> None:
    core = k8s.CoreV1Api(client)
    for i in range(60):  # the fixture's window is 50 events per type
        await core.create_namespaced_config_map("default", configmap(f"c{i}"))

    async def drain() -> None:
        async with watch.Watch() as w:
            async for _ in w.stream(
                core.list_namespaced_config_map, "default", resource_version="2", timeout_seconds=2
            ):
                pass

    with pytest.raises(ApiException) as err:
        await drain()
    assert err.value.status == 410


async def test_outage_ends_watches_and_returns_503(hub: KubeSim, client: Any) -> None:
    core = k8s.CoreV1Api(client)
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with http_session(hub, headers=headers) as session:
        async with session.get(
            f"{hub.url}/api/v1/namespaces/default/configmaps?watch=true"
        ) as resp:
            assert resp.status == 200
            async with session.post(f"{hub.url}/sim/v1/outage", json={"down": True}) as down:
                assert down.status == 200
            rest = await asyncio.wait_for(resp.content.read(), 5)
            assert rest == b""
        with pytest.raises(ApiException) as err:
            await core.list_namespace()
        assert err.value.status == 503
        async with session.get(f"{hub.url}/sim/v1/stats") as resp:
            stats = await resp.json()
        assert stats["down"] is True
        assert stats["watches"] == 0
        async with session.post(f"{hub.url}/sim/v1/outage", json={"down": False}):
            pass
    assert (await core.list_namespace()).items


async def test_latency_injection(hub: KubeSim, client: Any) -> None:
    core = k8s.CoreV1Api(client)
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with http_session(hub, headers=headers) as session:
        async with session.post(f"{hub.url}/sim/v1/latency", json={"ms": 200}) as resp:
            assert resp.status == 200
        started = time.monotonic()
        await core.list_namespace()
        assert time.monotonic() - started >= 0.2
        async with session.post(f"{hub.url}/sim/v1/latency", json={"ms": -1}) as resp:
            assert resp.status == 400
        async with session.post(f"{hub.url}/sim/v1/latency", json={"ms": 0}):
            pass


async def test_many_watchers_share_every_event(client: Any) -> None:
    core = k8s.CoreV1Api(client)
    listed = await core.list_namespaced_config_map("default")
    watches = [watch.Watch() for _ in range(5)]
    streams = [
        w.stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=10,
        )
        for w in watches
    ]
    for i in range(30):
        await core.create_namespaced_config_map("default", configmap(f"fan-{i}"))
    results = await asyncio.gather(*(collect(s, 30) for s in streams))
    for w in watches:
        await w.close()
    expected = [("ADDED", f"fan-{i}") for i in range(30)]
    assert all(r == expected for r in results)


async def test_legacy_watch_path_for_one_object(hub: KubeSim, client: Any) -> None:
    core = k8s.CoreV1Api(client)
    listed = await core.list_namespaced_config_map("default")
    await core.create_namespaced_config_map("default", configmap("other"))
    await core.create_namespaced_config_map("default", configmap("mine"))
    url = (
        f"{hub.url}/api/v1/watch/namespaces/default/configmaps/mine"
        f"?resourceVersion={listed.metadata.resource_version}&timeoutSeconds=1"
    )
    async with (
        http_session(hub, headers={"Authorization": f"Bearer {hub.token}"}) as session,
        session.get(url) as resp,
    ):
        lines = (await resp.read()).splitlines()
    events = [json.loads(line) for line in lines]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "mine")]


async def test_watch_of_a_vanished_client_is_reaped(
    hub: KubeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_WATCH_POLL_SECONDS", 0.05)
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with (
        http_session(hub, headers=headers) as session,
        session.get(f"{hub.url}/api/v1/namespaces?watch=true") as resp,
    ):
        await resp.content.readline()
        assert hub.stats()["watches"] == 1
    for _ in range(250):  # bounded polling: up to 5 s
        if hub.stats()["watches"] == 0:
            break
        await asyncio.sleep(0.02)
    assert hub.stats()["watches"] == 0


async def test_a_watcher_too_far_behind_is_cut_off(
    hub: KubeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module, "MAX_BACKLOG", 5)
    configmaps = hub.store.resource_type("v1", "ConfigMap")
    headers = {"Authorization": f"Bearer {hub.token}"}
    url = f"{hub.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1"
    async with (
        http_session(hub, headers=headers) as session,
        session.get(url) as resp,
    ):
        for i in range(10):  # committed synchronously, before the writer can drain
            hub.store.create(configmaps, {"metadata": {"name": f"c{i}", "namespace": "default"}})
        body = await asyncio.wait_for(resp.content.read(), 5)
    assert body == b""  # cut off; the client re-watches from its last resourceVersion
