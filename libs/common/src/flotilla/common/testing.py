"""Pytest plugin: real NATS JetStream and Redis servers for tests.

Enabled from the root `conftest.py`. Session-scoped servers are shared by tests
that only need *a* server (each test isolates itself by unique stream/key names);
the function-scoped `fresh_nats` / `fresh_redis` belong to one test, which may kill
and restart them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from flotilla.common.infra import NatsServer, RedisServer


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
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
