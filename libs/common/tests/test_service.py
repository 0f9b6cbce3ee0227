"""The shared service runtime against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import aiohttp
import pytest

from flotilla.common import events, membus, service
from flotilla.common.config import Settings
from flotilla.common.dispatch import Received
from flotilla.common.errors import InvalidObject
from flotilla.common.infra import NatsServer
from flotilla.common.router import Router
from flotilla.common.testing import eventually

pytestmark = pytest.mark.integration


def settings_for(server: NatsServer, prefix: str) -> Settings:
    return Settings(
        service="svc",
        instance="one",
        nats_url=server.url,
        stream_prefix=prefix,
        partitions=2,
        health_host="127.0.0.1",
        health_port=0,
    )


async def test_guarded_restarts_a_crashing_loop_and_stops_when_finished() -> None:
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError("watch broke")

    await asyncio.wait_for(service.guarded("flaky", flaky, finished=lambda: runs >= 3), 10)
    assert runs == 3


async def test_shutdown_cancels_again_a_loop_that_lost_its_cancellation() -> None:
    """A loop whose cancel was swallowed (Python 3.11's wait_for drops one that
    arrives as its future completes) is stopped by the next cancel, not waited on
    for ever; one that never stops is given up after the grace and reported."""
    swallowed = 0

    async def loses_one_cancel() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # what the library did: go on as if nothing happened

    released = False

    async def never_stops() -> None:
        while not released:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    lost = asyncio.create_task(service.guarded("lost", loses_one_cancel))
    stubborn = asyncio.create_task(never_stops())
    await asyncio.sleep(0)
    left = await service.cancel_and_wait([lost, stubborn], grace=1.5)
    assert lost.cancelled() and swallowed == 1
    assert left == {stubborn} and not stubborn.done()
    released = True  # the test's own cleanup
    stubborn.cancel()
    await stubborn


async def test_a_loop_stopping_its_own_loops_finishes_before_it_ends() -> None:
    """The runtime cancels a loop again and again while that loop's ``finally`` is
    stopping the loops it started: none of them is left running."""
    swallowed = 0

    async def inner() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    async def outer() -> None:
        started = asyncio.create_task(inner())
        try:
            await asyncio.sleep(3600)
        finally:
            await service.cancel_and_wait([started])

    task = asyncio.create_task(outer())
    await asyncio.sleep(0.05)
    assert await service.cancel_and_wait([task], grace=5) == set()
    assert task.cancelled() and swallowed == 1
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_the_composition_serves_handlers_health_and_shuts_down(
    nats_server: NatsServer, unique: str
) -> None:
    seen = asyncio.Event()
    ticks = 0
    order: list[str] = []

    async def on_cluster(received: Received[events.ClusterObserved]) -> None:
        seen.set()

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async def close_client() -> None:
        order.append("client")

    async def close_cache() -> None:
        order.append("cache")

    async def setup(runtime: service.Runtime) -> None:
        router = Router("svc")
        router.on(events.ClusterObserved)(on_cluster)
        runtime.serve(router)
        runtime.spawn("ticker", ticker)
        runtime.on_close(close_client)
        runtime.on_close(close_cache)

    async with service.started(settings_for(nats_server, f"rt{unique}"), setup) as started:
        runtime = started.runtime
        payload = events.ClusterObserved(cluster="us-east", object={"kind": "Cluster"})
        await runtime.bus.publish(events.envelope(payload, key="Cluster/us-east", producer="t"))
        await asyncio.wait_for(seen.wait(), 20)
        url = f"http://127.0.0.1:{runtime.health.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/readyz") as ready:
                assert ready.status == 200
            async with http.get(f"{url}/metrics") as metrics:
                text = await metrics.text()
        assert 'flotilla_events_handled_total{type="ClusterObserved"} 1.0' in text
        assert ticks > 0
        assert runtime.bus.connected
    assert not runtime.bus.connected
    assert order == ["cache", "client"]
    assert all(task.done() for task in runtime._tasks)


class Warnings:
    """A `middleware.Reporter` that keeps what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []

    async def warning(self, obj: dict[str, Any], reason: str, message: str) -> None:
        self.told.append((obj["metadata"]["name"], reason, message))


async def test_the_same_composition_runs_on_the_memory_bus_and_reports_dead_letters(
    unique: str,
) -> None:
    warnings = Warnings()
    handled: list[str] = []

    async def on_observed(received: Received[events.ResourceObserved]) -> None:
        if received.payload.ref.name == "broken":
            raise InvalidObject(
                "spec.strategy: 'sideways' is not a strategy", reason="InvalidPolicy"
            )
        handled.append(received.payload.ref.name)

    async def setup(runtime: service.Runtime) -> None:
        router = Router("svc")
        router.on(events.ResourceObserved)(on_observed)
        runtime.serve(router, reporter=warnings)

    bus = membus.MemoryBus()
    settings = Settings(service="svc", instance="one", health_host="127.0.0.1", health_port=0)
    async with service.started(settings, setup, bus=bus):
        for name in ("broken", "fine"):
            ref = events.ObjectRef(api_version="v1", kind="ConfigMap", name=name, namespace="ns")
            obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
            payload = events.ResourceObserved(ref=ref, object=obj)
            await bus.publish(events.envelope(payload, key=ref.key, producer="t", uid=name))
        await eventually(lambda: handled == ["fine"] and warnings.told, what="both outcomes")
    assert warnings.told[0][:2] == ("broken", "InvalidPolicy")
    assert "'sideways' is not a strategy" in warnings.told[0][2]
    assert bus.connected, "a bus the caller passed in is the caller's to close"
    await bus.close()


def test_main_runs_a_service_on_uvloop_until_it_is_stopped(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`main` is what every service process runs: it gets its settings from the
    environment and runs on uvloop (the event loop is most of a service's overhead
    per event; asyncio's own loop costs measurably more CPU)."""
    import uvloop

    monkeypatch.setenv("FLOTILLA_NATS_URL", nats_server.url)
    monkeypatch.setenv("FLOTILLA_STREAM_PREFIX", f"main{unique}")
    monkeypatch.setenv("FLOTILLA_HEALTH_HOST", "127.0.0.1")
    monkeypatch.setenv("FLOTILLA_HEALTH_PORT", "0")
    seen: list[object] = []

    async def setup(runtime: service.Runtime) -> None:
        seen.append(asyncio.get_running_loop())
        seen.append(runtime.settings.stream_prefix)
        runtime.stop()

    service.main("svc", setup)
    assert isinstance(seen[0], uvloop.Loop)
    assert seen[1] == f"main{unique}"


def test_a_sigterm_while_a_service_sets_up_stops_it_cleanly(
    nats_server: NatsServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod deleted right after it started gets SIGTERM while it is still setting
    up: the service stops once set up, rather than dying of the default action."""
    monkeypatch.setenv("FLOTILLA_NATS_URL", nats_server.url)
    monkeypatch.setenv("FLOTILLA_STREAM_PREFIX", f"term{unique}")
    monkeypatch.setenv("FLOTILLA_HEALTH_HOST", "127.0.0.1")
    monkeypatch.setenv("FLOTILLA_HEALTH_PORT", "0")
    unhandled: list[int] = []
    # Stands in for the default action (which would end this test process): it only
    # runs if the service did not take the signal itself.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    stopped_by: list[str] = []

    async def setup(runtime: service.Runtime) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.2)  # the signal is delivered while setting up
        loop = asyncio.get_running_loop()
        loop.call_later(5.0, lambda: (stopped_by.append("timer"), runtime.stop()))

    try:
        service.main("svc", setup)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (unhandled, stopped_by) == ([], [])
