"""The HTTP side every service exposes to Kubernetes and Prometheus.

* ``/healthz`` — liveness: 200 as long as the event loop answers. It deliberately
  checks nothing else; a service whose NATS is down must not be restarted for it,
  only taken out of rotation.
* ``/readyz`` — readiness: 503 until every registered check passes. A check is an
  async callable returning ``True`` (ready), ``False`` (not ready) or a string (not
  ready, and why). A check that raises or takes longer than `check_timeout` counts
  as not ready. The body is JSON naming each check's state, so ``kubectl describe``
  and a human with curl see *why* a pod is not ready.
* ``/metrics`` — the service's own `CollectorRegistry` in Prometheus text format
  (or OpenMetrics, when the scraper's Accept header asks for it).
  Each service (and each test) has its own registry instead of the process-global
  one, so two in one process never collide.

`EventMetrics` holds the standard metrics the bus records for every handler.

    registry = CollectorRegistry()
    metrics = EventMetrics(registry)
    async with HealthServer("0.0.0.0", 8080, registry) as server:
        server.add_readiness_check("nats", bus.connected)
        ...

prometheus_client's own ``start_http_server`` runs a thread with no readiness
endpoint, so the three routes live on the aiohttp the services already use.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder

ReadinessCheck = Callable[[], Awaitable[bool | str]]

HANDLER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Event handlers run from about a millisecond (pure decisions) to seconds (member API calls)."""


class EventMetrics:
    """Counters and a duration histogram per event type, for the bus to record.

    ``flotilla_events_handled_total{type}``, ``flotilla_events_failed_total{type,error}``
    (`error` is the exception class name, bounded by the error vocabulary) and
    ``flotilla_handler_duration_seconds{type}``.
    """

    def __init__(self, registry: CollectorRegistry, *, namespace: str = "flotilla") -> None:
        self.handled = Counter(
            "events_handled",
            "Events whose handler completed.",
            ["type"],
            namespace=namespace,
            registry=registry,
        )
        self.failed = Counter(
            "events_failed",
            "Events whose handler raised, by exception class.",
            ["type", "error"],
            namespace=namespace,
            registry=registry,
        )
        self.duration = Histogram(
            "handler_duration_seconds",
            "Time spent in an event handler, successful or not.",
            ["type"],
            namespace=namespace,
            registry=registry,
            buckets=HANDLER_BUCKETS,
        )
        self._per_type: dict[str, tuple[Any, Any]] = {}
        """Event type → its (handled, duration) children: `labels` takes a lock and
        builds a key on every call, and this runs on every message."""

    @contextmanager
    def observe(self, event_type: str) -> Iterator[None]:
        """Time a handler and count it as handled, or failed with the exception's class."""
        children = self._per_type.get(event_type)
        if children is None:
            children = self._per_type[event_type] = (
                self.handled.labels(type=event_type),
                self.duration.labels(type=event_type),
            )
        started = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            self.failed.labels(type=event_type, error=type(exc).__name__).inc()
            raise
        else:
            children[0].inc()
        finally:
            children[1].observe(time.perf_counter() - started)


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on one port; ``port=0`` picks a free one."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        check_timeout: float = 2.0,
    ) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.check_timeout = check_timeout
        self._checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        self._checks[name] = check

    async def _run_check(self, check: ReadinessCheck) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(self.check_timeout):
                result = await check()
        except TimeoutError:
            return False, f"timed out after {self.check_timeout}s"
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        if result is True:
            return True, "ok"
        return False, result or "not ready"

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """Run every check concurrently: (all passed?, "ok" or the reason, per check)."""
        names = list(self._checks)
        results = await asyncio.gather(*(self._run_check(self._checks[n]) for n in names))
        checks = {name: detail for name, (_, detail) in zip(names, results, strict=True)}
        return all(ok for ok, _ in results), checks

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _request: web.Request) -> web.Response:
        ready, checks = await self.readiness()
        return web.Response(
            status=200 if ready else 503,
            text=json.dumps({"ready": ready, "checks": checks}),
            content_type="application/json",
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        # The client library negotiates the format (0.0.4 text, or OpenMetrics when the
        # scraper asks for it) from the Accept header, as its own HTTP handler does.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


__all__ = ["HANDLER_BUCKETS", "EventMetrics", "HealthServer", "ReadinessCheck"]
