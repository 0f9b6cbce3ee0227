"""The aggregator's records: a compare-and-set that starts from the record this
replica last wrote (no read first) stays correct when another writer changed it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.aggregator import service
from flotilla.aggregator.aggregation import MemberReport, ObjectReports
from flotilla.aggregator.service import Aggregator, ClusterReadiness
from flotilla.common.store import MemoryBucket, Recent, Store

KEY = "apps/v1/Deployment/shop/web"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class CountingBucket(MemoryBucket):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, key: str) -> Any:
        self.reads += 1
        return await super().get(key)


def report(cluster: str, ready: int, seconds: float = 0) -> MemberReport:
    return MemberReport(
        cluster=cluster,
        status={"readyReplicas": ready},
        observed_at=T0 + timedelta(seconds=seconds),
    )


def aggregator() -> tuple[Aggregator, Store[ObjectReports], CountingBucket]:
    bucket = CountingBucket()
    reports: Store[ObjectReports] = Store(bucket, ObjectReports)
    clusters: Store[ClusterReadiness] = Store(MemoryBucket(), ClusterReadiness)
    return Aggregator(cast(DynamicClient, None), reports, clusters), reports, bucket


async def test_an_update_after_this_replica_wrote_the_record_does_not_read_it() -> None:
    app, reports, bucket = aggregator()
    await app._update(KEY, lambda r: r.with_report(report("a", 1)))
    reads = bucket.reads
    await app._update(KEY, lambda r: r.with_report(report("b", 1)))
    assert bucket.reads == reads
    stored = await reports.get(KEY)
    assert stored is not None and set(stored.value.members) == {"a", "b"}


async def test_a_record_another_writer_changed_is_read_again_not_overwritten() -> None:
    app, reports, _ = aggregator()
    await app._update(KEY, lambda r: r.with_report(report("a", 1)))
    stored = await reports.get(KEY)
    assert stored is not None
    # Another replica (the partition moved meanwhile) adds b's report.
    await reports.update(KEY, stored.value.with_report(report("b", 2)), stored.revision)
    await app._update(KEY, lambda r: r.with_report(report("c", 3)))
    stored = await reports.get(KEY)
    assert stored is not None and set(stored.value.members) == {"a", "b", "c"}


async def test_a_change_that_writes_nothing_is_only_trusted_on_a_fresh_read() -> None:
    """By this replica's memory the report is already kept; by the bucket an older
    one is (written by another replica): the newer report must still be written."""
    app, reports, _ = aggregator()
    newer = report("a", 2, seconds=10)
    await app._update(KEY, lambda r: r.with_report(newer))
    stored = await reports.get(KEY)
    assert stored is not None
    older = ObjectReports(key=KEY, members={"a": report("a", 1)})
    await reports.update(KEY, older, stored.revision)
    await app._update(KEY, lambda r: r.with_report(newer))
    stored = await reports.get(KEY)
    assert stored is not None and stored.value.members["a"] == newer


async def test_a_deleted_record_is_forgotten() -> None:
    app, reports, _ = aggregator()
    await app._update(KEY, lambda r: r.with_report(report("a", 1)))
    await app._update(KEY, lambda _: None)
    assert await reports.get(KEY) is None and not len(app._records)
    await app._update(KEY, lambda r: r.with_report(report("b", 1)))
    stored = await reports.get(KEY)
    assert stored is not None and set(stored.value.members) == {"b"}


def test_recent_forgets_the_least_recently_put_first() -> None:
    recent: Recent[int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)
    recent.put("c", 4)
    assert (recent.pop("b"), recent.pop("a"), recent.pop("c"), len(recent)) == (None, 3, 4, 0)


async def test_a_busy_aggregator_waits_longer_before_each_flush() -> None:
    """Beyond `BUSY_FLUSHES` waiting flushes the window stretches in proportion, up
    to `BUSY_WINDOW`; an idle aggregator keeps its window."""
    app, _, _ = aggregator()
    busy = service.BUSY_FLUSHES
    try:
        assert app.flush_delay() == app.window == 0.2
        for i in range(busy):
            app.schedule(f"{KEY}-{i}")
        assert app.flush_delay() == 0.2
        for i in range(busy, 4 * busy):
            app.schedule(f"{KEY}-{i}")
        assert app.flush_delay() == pytest.approx(0.8)
        for i in range(4 * busy, 40 * busy):
            app.schedule(f"{KEY}-{i}")
        assert app.flush_delay() == service.BUSY_WINDOW
    finally:
        await app.close()


async def test_a_burst_of_flushes_writes_a_bounded_few_at_a_time() -> None:
    """A thousand objects reporting at once must not open a hub connection each."""
    app, _, _ = aggregator()
    writing = peak = 0
    flushed: list[str] = []
    count = 4 * service.FLUSH_CONCURRENCY
    all_flushed = asyncio.Event()

    async def flush(key: str) -> None:
        nonlocal writing, peak
        writing += 1
        peak = max(peak, writing)
        await asyncio.sleep(0.01)
        writing -= 1
        flushed.append(key)
        if len(flushed) == count:
            all_flushed.set()

    app.flush = flush  # type: ignore[method-assign]
    try:
        for i in range(count):
            app.schedule(f"{KEY}-{i}", 0)
        await asyncio.wait_for(all_flushed.wait(), 10)
    finally:
        await app.close()
    assert sorted(flushed) == sorted(f"{KEY}-{i}" for i in range(count))
    assert peak == service.FLUSH_CONCURRENCY
