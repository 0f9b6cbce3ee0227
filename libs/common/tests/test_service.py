"""The shared service runtime against a real nats-server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from flotilla.common import events, service
from flotilla.common.config import Settings
from flotilla.common.infra import NatsServer
from flotilla.common.topology import ConsumerSpec

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


async def test_runtime_consumes_serves_health_and_shuts_down(
    nats_server: NatsServer, unique: str
) -> None:
    seen = asyncio.Event()

    async def handler(event: events.Envelope) -> None:
        seen.set()

    async with service.Runtime.open(settings_for(nats_server, f"rt{unique}")) as runtime:
        runtime.consume(
            ConsumerSpec(service="svc", event_types=("ClusterObserved",)),
            {"ClusterObserved": handler},
        )
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        runtime.spawn("ticker", ticker)
        order: list[str] = []

        async def close_client() -> None:
            order.append("client")

        async def close_cache() -> None:
            order.append("cache")

        runtime.on_close(close_client)
        runtime.on_close(close_cache)
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
    assert runtime.bus.nc.is_closed
    assert order == ["cache", "client"]
    assert all(task.done() for task in runtime._tasks)
