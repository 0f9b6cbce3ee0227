"""The composition root every Flotilla service shares.

A service's ``__main__`` is one line, ``service.main("scheduler", setup)``: this
module loads and validates the settings, sets up JSON logs and tracing, connects
the bus, serves ``/healthz`` ``/readyz`` ``/metrics``, and hands a `Runtime` to the
service's ``setup``, which declares its handlers (`Runtime.serve` with a
`flotilla.common.router.Router`) and long-running loops. Then it waits for
SIGTERM/SIGINT and shuts everything down in order: loops, consumers (draining
in-flight work and handing back the rest), close hooks, bus, health endpoint.

Production and tests compose a service the same way, through `started`: tests
pass their own settings (and, for handler tests, an in-memory bus) and get the
running `Runtime` back; `main` is `started` plus waiting for a signal.

Long-running work runs through `Runtime.spawn`, the one guarded helper: a crash is
logged and the loop restarted with backoff, so one failing watch never takes the
service down (kopf's ``aiotasks`` is the model).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import uvloop
from prometheus_client import CollectorRegistry

from flotilla.common import config, logs, middleware, telemetry
from flotilla.common.bus import Bus
from flotilla.common.config import Settings, SettingsT
from flotilla.common.dispatch import EventBus, EventConsumer
from flotilla.common.errors import ConfigError, FlotillaError
from flotilla.common.health import EventMetrics, HealthServer
from flotilla.common.middleware import DeadLetterReport, Reporter, StaleDrop
from flotilla.common.router import Router
from flotilla.common.topology import Topology

log = logging.getLogger(__name__)

MAX_RESTART_DELAY = 30.0


async def guarded(
    name: str,
    factory: Callable[[], Awaitable[None]],
    *,
    finished: Callable[[], bool] = lambda: False,
) -> None:
    """Run `factory()` until `finished()`: restart it with exponential backoff when it
    crashes or returns early; cancellation ends it too."""
    delay = 0.5
    while True:
        try:
            await factory()
            if finished():
                return
            log.warning("task %s returned; restarting", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task %s crashed; restarting in %.1fs", name, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RESTART_DELAY)


STOP_GRACE = 10.0
"""Seconds shutdown waits for cancelled loops before giving up on them."""
RECANCEL_EVERY = 0.5


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], *, grace: float = STOP_GRACE
) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` and wait until they end; the ones still running after `grace`
    seconds are logged with where they wait and returned.

    A task still running a moment after its cancel lost it: on Python 3.11,
    ``asyncio.wait_for`` returns its result and drops a cancellation that arrives as
    the awaited future completes (nats-py awaits every request and publish ack
    through it), and the loop goes on as if nothing happened. Such a task is
    cancelled again, every `RECANCEL_EVERY` seconds, until it ends.

    Called from a task that is itself being cancelled (a loop stopping the loops it
    started, in a ``finally``), it still finishes stopping them before it lets the
    cancellation through: the caller's shutdown cancels again too, and must not
    leave the inner loops running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    pending = {task for task in tasks if not task.done()}
    interrupted = False
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY, remaining))
        except asyncio.CancelledError:
            interrupted = True
            pending = {task for task in pending if not task.done()}
    for task in pending:
        where = io.StringIO()
        task.print_stack(limit=20, file=where)
        log.error(
            "task %s did not stop within %.0fs:\n%s", task.get_name(), grace, where.getvalue()
        )
    if interrupted:
        raise asyncio.CancelledError
    return pending


class Runtime:
    """One service replica's shared parts. Build it with `Runtime.open`."""

    def __init__(
        self,
        settings: Settings,
        bus: EventBus,
        health: HealthServer,
        registry: CollectorRegistry,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.health = health
        self.registry = registry
        self.metrics = EventMetrics(registry)
        self.consumers: list[EventConsumer] = []
        self._consumer_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closers: list[Callable[[], Awaitable[object]]] = []
        self._stopped = asyncio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        topology: Topology | None = None,
        bus: EventBus | None = None,
    ) -> AsyncIterator[Runtime]:
        """A runtime on `settings`; on `bus` when given (the caller keeps owning it),
        else on a new JetStream connection that this runtime closes."""
        owned: EventBus | None = None
        if bus is None:
            topology = topology or Topology(
                prefix=settings.stream_prefix, partitions=settings.partitions
            )
            password = settings.nats_password.get_secret_value() if settings.nats_password else None
            bus = owned = await Bus.connect(
                settings.nats_url,
                topology=topology,
                producer=f"{settings.service}/{settings.instance}",
                credentials=str(settings.nats_creds) if settings.nats_creds else None,
                user=settings.nats_user,
                password=password,
            )
        registry = CollectorRegistry()
        health = HealthServer(settings.health_host, settings.health_port, registry)
        runtime = cls(settings, bus, health, registry)
        health.add_readiness_check("nats", runtime._bus_ready)
        try:
            await health.start()
            yield runtime
        finally:
            await runtime._shutdown()
            if owned is not None:
                await owned.close()
            await health.stop()

    async def _bus_ready(self) -> bool | str:
        return True if self.bus.connected else "not connected to NATS"

    def serve(
        self,
        router: Router,
        *,
        reporter: Reporter | None = None,
        stale: StaleDrop | None = None,
    ) -> EventConsumer:
        """Consume `router`'s events, each handler inside the standard middleware
        chain; dead letters are reported as Warning Events through `reporter`."""
        dispatch = router.dispatch(
            middleware.standard(
                router.service,
                recorder=self.metrics,
                handler_deadline=self.settings.handler_deadline,
                stale=stale,
            )
        )
        consumer = self.bus.consumer(
            router.spec,
            dispatch,
            instance=self.settings.instance,
            concurrency=self.settings.max_concurrency,
            on_dead_letter=DeadLetterReport(reporter, router.service) if reporter else None,
        )
        self.consumers.append(consumer)
        self._consumer_tasks.append(
            asyncio.create_task(
                guarded(f"consume-{router.service}", consumer.run, finished=self._stopped.is_set)
            )
        )
        return consumer

    def settings_as(self, settings_type: type[SettingsT]) -> SettingsT:
        """The settings as a service's own settings type (`main` already builds that
        type; a test may pass plain `Settings`, completed here with the defaults)."""
        if isinstance(self.settings, settings_type):
            return self.settings
        return settings_type.model_validate(self.settings.model_dump())

    def spawn(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run a long-running loop (a watch, a ticker) under `guarded`."""
        self._tasks.append(asyncio.create_task(guarded(name, factory), name=name))

    def on_close(self, closer: Callable[[], Awaitable[object]]) -> None:
        """Run `closer` at shutdown after consumers have drained (last registered first):
        the place to close clients that handlers use."""
        self._closers.append(closer)

    def stop(self) -> None:
        self._stopped.set()

    async def wait(self) -> None:
        """Until `stop()` or SIGTERM/SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(RuntimeError):  # not the main thread: no signals
                loop.add_signal_handler(sig, self.stop)
        await self._stopped.wait()

    async def _shutdown(self, timeout: float = 30.0) -> None:
        self._stopped.set()
        await cancel_and_wait(self._tasks)
        for consumer in self.consumers:
            await consumer.stop()
        if self._consumer_tasks:
            # Consumer.run drains in-flight work and releases its leases, then returns.
            _, late = await asyncio.wait(self._consumer_tasks, timeout=timeout)
            await cancel_and_wait(late)
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception:
                log.exception("closing %r failed", closer)


App = TypeVar("App")
Setup = Callable[[Runtime], Awaitable[App]]
"""Composes one service on a runtime: declares its handlers and loops and returns
the service object (what tests look into; production ignores it)."""


@dataclass(frozen=True)
class Started(Generic[App]):
    runtime: Runtime
    app: App


@contextlib.asynccontextmanager
async def started(
    settings: Settings, setup: Setup[App], *, bus: EventBus | None = None
) -> AsyncIterator[Started[App]]:
    """The one composition of a service, for production (`main`) and tests alike:
    a runtime with `setup`'s handlers and loops running, shut down on exit."""
    async with Runtime.open(settings, bus=bus) as runtime:
        app = await setup(runtime)
        log.info("%s started", settings.service, extra={"instance": settings.instance})
        yield Started(runtime, app)


def main(
    name: str,
    setup: Setup[Any],
    settings_type: type[Settings] = Settings,
) -> None:
    """The whole of a service's ``__main__``."""
    defaults = config.service_defaults(name, os.environ)
    try:
        settings = config.load(settings_type, service=name, **defaults)
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        sys.exit(2)
    logs.setup(settings.log_level, name)
    telemetry.setup(name)

    async def run() -> None:
        # From the start, not only once set up: a SIGTERM while the service is still
        # connecting (a pod deleted right after it started) stops it cleanly when the
        # setup is done, instead of killing it half-way with the default action.
        stop_asked = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(RuntimeError):  # not the main thread: no signals
                loop.add_signal_handler(sig, stop_asked.set)
        async with started(settings, setup) as service:
            if stop_asked.is_set():
                service.runtime.stop()
            await service.runtime.wait()
            log.info("%s stopping", name)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run())
    except FlotillaError as exc:
        log.error("%s failed: %s", name, exc)
        sys.exit(1)
