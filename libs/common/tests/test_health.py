"""The health/metrics HTTP server every service runs, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from flotilla.common.errors import Unavailable
from flotilla.common.health import EventMetrics, HealthServer


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def url(server: HealthServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


async def test_port_zero_picks_a_port_and_exit_closes_it(http: aiohttp.ClientSession) -> None:
    async with HealthServer("127.0.0.1", 0, CollectorRegistry()) as server:
        assert server.port != 0
        async with http.get(url(server, "/healthz")) as response:
            assert response.status == 200
            assert await response.text() == "ok"
        async with http.get(url(server, "/readyz")) as response:
            assert response.status == 200
            assert await response.json() == {"ready": True, "checks": {}}
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(url(server, "/healthz"))


async def test_readyz_is_503_until_every_check_passes(http: aiohttp.ClientSession) -> None:
    nats_connected = asyncio.Event()

    async def nats() -> bool:
        return nats_connected.is_set()

    async def redis() -> bool | str:
        return True

    async with HealthServer("127.0.0.1", 0, CollectorRegistry()) as server:
        server.add_readiness_check("nats", nats)
        server.add_readiness_check("redis", redis)
        async with http.get(url(server, "/readyz")) as response:
            assert response.status == 503
            assert await response.json() == {
                "ready": False,
                "checks": {"nats": "not ready", "redis": "ok"},
            }
        # Liveness does not depend on readiness.
        async with http.get(url(server, "/healthz")) as response:
            assert response.status == 200
        nats_connected.set()
        async with http.get(url(server, "/readyz")) as response:
            assert response.status == 200
            assert (await response.json())["checks"] == {"nats": "ok", "redis": "ok"}


async def test_failing_checks_say_why(http: aiohttp.ClientSession) -> None:
    async def reason() -> bool | str:
        return "waiting for hub cache sync"

    async def broken() -> bool:
        raise Unavailable("redis refused")

    async def hung() -> bool:
        await asyncio.sleep(10)
        return True

    async with HealthServer("127.0.0.1", 0, CollectorRegistry(), check_timeout=0.05) as server:
        server.add_readiness_check("hub", reason)
        server.add_readiness_check("redis", broken)
        server.add_readiness_check("slow", hung)
        async with http.get(url(server, "/readyz")) as response:
            assert response.status == 503
            assert (await response.json())["checks"] == {
                "hub": "waiting for hub cache sync",
                "redis": "Unavailable: redis refused",
                "slow": "timed out after 0.05s",
            }


def test_a_check_name_is_registered_once() -> None:
    async def ok() -> bool:
        return True

    server = HealthServer("127.0.0.1", 0, CollectorRegistry())
    server.add_readiness_check("nats", ok)
    with pytest.raises(ValueError, match="already registered"):
        server.add_readiness_check("nats", ok)


async def test_metrics_exposes_the_service_registry(http: aiohttp.ClientSession) -> None:
    registry = CollectorRegistry()
    metrics = EventMetrics(registry)
    # A second service in the same process has its own registry: no duplicate error.
    EventMetrics(CollectorRegistry())

    with metrics.observe("ResourceAnalyzed"):
        pass
    with pytest.raises(Unavailable), metrics.observe("ResourceAnalyzed"):
        raise Unavailable("redis down")

    async with HealthServer("127.0.0.1", 0, registry) as server:
        async with http.get(url(server, "/metrics")) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = await response.text()
        openmetrics = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with http.get(url(server, "/metrics"), headers=openmetrics) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await response.text()).endswith("# EOF\n")
    assert 'flotilla_events_handled_total{type="ResourceAnalyzed"} 1.0' in body
    assert 'flotilla_events_failed_total{error="Unavailable",type="ResourceAnalyzed"} 1.0' in body
    assert 'flotilla_handler_duration_seconds_count{type="ResourceAnalyzed"} 2.0' in body
    assert "python_gc" not in body  # not the global registry


async def test_a_taken_port_fails_start_cleanly() -> None:
    async with HealthServer("127.0.0.1", 0, CollectorRegistry()) as first:
        second = HealthServer("127.0.0.1", first.port, CollectorRegistry())
        with pytest.raises(OSError, match=r"(?i)address already in use"):
            await second.start()
        await second.stop()
