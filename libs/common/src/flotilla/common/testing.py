"""Pytest plugin: real NATS JetStream and Redis servers, and the shared test habits.

Enabled from the root `conftest.py`. Module-scoped NATS and session-scoped Redis
servers are shared by tests that only need *a* server (each test isolates itself
by unique stream/key names); the function-scoped `fresh_nats` / `fresh_redis`
belong to one test, which may kill and restart them.

Every async test also fails if it leaves asyncio tasks running (kopf's
``_no_asyncio_pending_tasks``), and `eventually` is the one way tests wait for an
asynchronous outcome: bounded polling on a condition, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from flotilla.common.config import Settings, SettingsT
from flotilla.common.infra import NatsServer, RedisServer


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    """One JetStream server per test module: tests share it by unique prefixes, and a
    module's streams and buckets go away with it (one server holding every test's
    streams slowed JetStream down enough to time tests out late in a run)."""
    with NatsServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def fresh_nats() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def unique() -> str:
    """A short unique token to keep tests sharing a server apart."""
    return uuid.uuid4().hex[:8]


CRD_DIR = Path(__file__).resolve().parents[5] / "deploy" / "k8s" / "crds"
"""The hub's CRDs in this repository (tests install them with `kube.install_crds`)."""


def schemaless_crd(group: str, kind: str, version: str = "v1") -> dict[str, Any]:
    """A namespaced CustomResourceDefinition that accepts any spec: a user type a test
    can place, interpret or watch (plural = lowercase kind + "s")."""
    plural = f"{kind.lower()}s"
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [{"name": version, "served": True, "storage": True, "schema": schema}],
        },
    }


def service_settings(
    service: str,
    nats: NatsServer,
    prefix: str,
    settings_type: type[SettingsT] = Settings,  # type: ignore[assignment]
    **overrides: Any,
) -> SettingsT:
    """Settings (of the service's own `settings_type`) for a service under test: the
    given NATS, its own stream prefix, two partitions and a health endpoint on a
    free loopback port."""
    values: dict[str, Any] = {
        "service": service,
        "instance": f"{service}-1",
        "nats_url": nats.url,
        "stream_prefix": prefix,
        "partitions": 2,
        "health_host": "127.0.0.1",
        "health_port": 0,
    }
    values.update(overrides)
    return settings_type(**values)


def token_kubeconfig(server: str, token: str, name: str = "c") -> dict[str, Any]:
    """A kubeconfig for `server` with a bearer `token` and one context, `name` (for
    a test's own plain HTTP server standing in for an API server)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


@contextlib.contextmanager
def kubeconfig_file(kubeconfig: Mapping[str, Any]) -> Iterator[Path]:
    """`kubeconfig` (a kubesim's ``kubeconfig()``) written to a private temporary file,
    for a service composed from settings (``hub_kubeconfig``) the way it runs."""
    with tempfile.TemporaryDirectory(prefix="flotilla-kubeconfig-") as folder:
        path = Path(folder) / "kubeconfig"
        path.write_text(json.dumps(kubeconfig))
        path.chmod(0o600)
        yield path


async def eventually(
    probe: Callable[[], Any], timeout: float = 10.0, *, what: str = "a condition"
) -> Any:
    """Poll `probe` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


LEFTOVER_GRACE = 2.0


@pytest.fixture(autouse=True)
async def _no_leftover_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """An async test must stop every task it started (servers, watches, consumers)."""
    yield
    if not inspect.iscoroutinefunction(getattr(request.node, "function", None)):
        return
    current = asyncio.current_task()
    deadline = time.monotonic() + LEFTOVER_GRACE
    while True:
        leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not leftover or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert not leftover, f"test left asyncio tasks running: {_stacks(leftover)}"


def _stacks(tasks: list[asyncio.Task[Any]]) -> str:
    """Each task with where it waits (what a hang at shutdown needs to be found)."""
    out = io.StringIO()
    for task in tasks:
        out.write(f"\n{task!r}\n")
        task.print_stack(limit=30, file=out)
    return out.getvalue()
