"""The watcher's positions and records on the common store, against real JetStream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from flotilla.common.api import GroupVersionKind
from flotilla.common.bus import Bus
from flotilla.common.infra import NatsServer
from flotilla.common.testing import eventually
from flotilla.common.topology import Topology
from flotilla.watcher import state
from flotilla.watcher.observations import Record

pytestmark = pytest.mark.integration

DEPLOYMENTS = GroupVersionKind(group="apps", version="v1", kind="Deployment")


@pytest.fixture
async def watch_state(nats_server: NatsServer, unique: str) -> AsyncIterator[state.WatchState]:
    bus = await Bus.connect(nats_server.url, topology=Topology(prefix=f"w{unique}"), producer="t")
    try:
        yield await state.WatchState.open(bus)
    finally:
        await bus.close()


def record(name: str) -> Record:
    return Record(
        key=f"apps/v1/Deployment/shop/{name}",
        api_version="apps/v1",
        kind="Deployment",
        uid=f"uid-{name}",
        revision=3,
        fingerprint="f",
        stub={"metadata": {"name": name}},
    )


async def test_positions_resume_and_are_forgotten(watch_state: state.WatchState) -> None:
    assert await watch_state.get(DEPLOYMENTS) is None
    await watch_state.put(DEPLOYMENTS, "42")
    assert await watch_state.get(DEPLOYMENTS) == "42"
    await watch_state.forget_position(DEPLOYMENTS)
    assert await watch_state.get(DEPLOYMENTS) is None


async def test_a_position_in_an_older_format_means_re_listing(
    watch_state: state.WatchState,
) -> None:
    await watch_state.positions.bucket.put(state.position_key(DEPLOYMENTS), b"42")
    assert await watch_state.get(DEPLOYMENTS) is None


async def test_forgotten_records_leave_tombstones_that_are_purged(
    watch_state: state.WatchState,
) -> None:
    for name in ("a", "b", "c"):
        await watch_state.save(record(name))
    await watch_state.forget(record("a").key)
    await watch_state.forget(record("b").key)
    assert set(await watch_state.load_records()) == {record("c").key}
    assert await watch_state.records.size() == 3  # c and two tombstones
    purging = asyncio.create_task(watch_state.forget_deleted(retention=0.2))
    try:
        # The newest tombstone stays until something is written after it.
        await eventually(lambda: _size(watch_state, 2), what="old tombstones purged")
        await watch_state.save(record("d"))
        await eventually(lambda: _size(watch_state, 2), what="the last tombstone purged")
    finally:
        purging.cancel()
        await asyncio.gather(purging, return_exceptions=True)
    assert set(await watch_state.load_records()) == {record("c").key, record("d").key}


async def _size(watch_state: state.WatchState, expected: int) -> bool:
    return await watch_state.records.size() == expected
