"""The capacity cache adapters: the Redis one against a real Redis, and the fake.

Behaviour tests run against both (`cache` is parametrized), which is what keeps the
fake honest for the other services' unit tests.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from flotilla.common import capacity
from flotilla.common.capacity import (
    CapacityCache,
    Claim,
    ClusterCapacity,
    FakeCapacityCache,
    NodeCapacity,
)
from flotilla.common.errors import Unavailable
from flotilla.common.infra import RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache

pytestmark = pytest.mark.integration


def record(name: str, *node_free: dict[str, int], observed_at: float = 100.0) -> ClusterCapacity:
    nodes = [
        NodeCapacity(name=f"{name}-n{i}", allocatable=dict(free), free=dict(free))
        for i, free in enumerate(node_free)
    ]
    total = capacity.add(*node_free)
    return ClusterCapacity(
        cluster=name,
        allocatable=total,
        available=total,
        nodes=nodes,
        observed_at=observed_at,
    )


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Bounded polling on a condition that lives in Redis (no event to wait on)."""
    async with asyncio.timeout(5):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


@pytest.fixture(params=["redis", "fake"])
async def cache(
    request: pytest.FixtureRequest, redis_server: RedisServer, unique: str
) -> AsyncIterator[CapacityCache]:
    if request.param == "fake":
        yield FakeCapacityCache()
        return
    async with RedisCapacityCache.from_url(
        redis_server.url, prefix=f"test:{unique}:capacity:"
    ) as redis_cache:
        yield redis_cache


async def test_put_snapshot_round_trip(cache: CapacityCache) -> None:
    east = record("east", {"cpu": 4000, "memory": 2**34, "pods": 110})
    west = record("west", {"cpu": 2000, "pods": 10}, {"cpu": 1000, "pods": 10})
    await cache.put(east)
    await cache.put(west.model_copy(update={"reserved": {"cpu": 999}}))

    snap = await cache.snapshot()
    assert snap.clusters == {"east": east, "west": west}
    assert snap.taken_at == pytest.approx(time.time(), abs=5)

    only = await cache.snapshot(["west", "gone"])
    assert list(only.clusters) == ["west"]
    assert (await cache.snapshot([])).clusters == {}


async def test_put_replaces_record_but_keeps_reservations(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 4000, "pods": 10}))
    assert await cache.reserve("c", "r1", {"cpu": 1000}, 2, ttl=60)
    await cache.put(record("c", {"cpu": 3000, "pods": 10}, observed_at=200.0))
    current = (await cache.snapshot()).clusters["c"]
    assert current.observed_at == 200.0
    assert current.reserved == {"cpu": 2000, "pods": 2}
    assert current.fit_replicas({"cpu": 1000}) == 1


async def test_a_claim_is_all_or_nothing_across_clusters(cache: CapacityCache) -> None:
    await cache.put(record("a", {"cpu": 4000, "pods": 10}))
    await cache.put(record("b", {"cpu": 1000, "pods": 10}))
    assert await cache.reserve("a", "old", {"cpu": 500}, 1, ttl=60)
    too_big = [Claim("a", "k", {"cpu": 1000}, 2), Claim("b", "k", {"cpu": 1000}, 2)]
    assert await cache.claim(too_big, 60, releases=[("a", "old")]) == {"b"}
    # Nothing changed: not the claim that fitted, not the release.
    assert (await cache.snapshot()).clusters["a"].reserved == {"cpu": 500, "pods": 1}
    assert "b" not in {c for c, r in (await cache.snapshot()).clusters.items() if r.reserved}
    fits = [Claim("a", "k", {"cpu": 1000}, 2), Claim("b", "k", {"cpu": 1000}, 1)]
    assert await cache.claim(fits, 60, releases=[("a", "old")]) == set()
    snap = await cache.snapshot()
    assert snap.clusters["a"].reserved == {"cpu": 2000, "pods": 2}
    assert snap.clusters["b"].reserved == {"cpu": 1000, "pods": 1}
    assert await cache.claim([Claim("gone", "k", {"cpu": 1}, 1)], 60) == {"gone"}


async def test_claims_on_one_cluster_count_together(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 3000, "pods": 10}))
    both = [Claim("c", "k#web", {"cpu": 2000}, 1), Claim("c", "k#db", {"cpu": 2000}, 1)]
    assert await cache.claim(both, 60) == {"c"}
    assert await cache.reservations("c") == []
    # Re-claiming held ids replaces them: their own room is not in the way.
    assert await cache.claim(both[:1], 60) == set()
    assert await cache.claim([Claim("c", "k#web", {"cpu": 3000}, 1)], 60) == set()


async def test_an_unchecked_claim_puts_reservations_back(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 1000, "pods": 10}))
    assert await cache.reserve("c", "other", {"cpu": 1000}, 1, ttl=60)
    assert await cache.claim([Claim("c", "k", {"cpu": 500}, 1)], 60) == {"c"}
    assert await cache.claim([Claim("c", "k", {"cpu": 500}, 1)], 60, check=False) == set()
    assert {r.id for r in await cache.reservations("c")} == {"other", "k"}


async def test_a_copy_sized_claim_with_mixed_shapes_releases_and_its_undo(
    cache: CapacityCache,
) -> None:
    """What a copy object claims: one shared shape on forty clusters, a component
    of another shape (equal requests, separate mappings) on some, releases of what
    it held before; refused as a whole, then applied, then undone unchecked."""
    names = [f"c-{i:02d}" for i in range(40)]
    for name in names:
        free = 400 if name == "c-07" else 4000
        await cache.put(record(name, {"cpu": free, "gpu": 2, "pods": 10}))
    for name in names[:5]:
        assert await cache.reserve(name, "old", {"cpu": 300}, 1, ttl=60)
    before = (await cache.snapshot()).clusters
    agent = {"cpu": 500}
    claims = [Claim(name, "k#agent", agent, 1) for name in names]
    claims += [Claim(name, "k#side", {"cpu": 100, "gpu": 1}, 2) for name in names[::3]]
    releases = [(name, "old") for name in names[:5]]
    assert await cache.claim(claims, 60, releases=releases) == {"c-07"}
    assert (await cache.snapshot()).clusters == before

    claims = [c for c in claims if c.cluster != "c-07"]
    assert await cache.claim(claims, 60, releases=releases) == set()
    after = (await cache.snapshot()).clusters
    for name in names:
        side = name in names[::3]
        expected = {"cpu": 500 + (200 if side else 0), "pods": 1 + (2 if side else 0)}
        if side:
            expected["gpu"] = 2
        assert after[name].reserved == ({} if name == "c-07" else expected), name
    # Claimed again (a redelivery): each id replaces itself, nothing counts twice.
    assert await cache.claim(claims, 60) == set()
    assert (await cache.snapshot()).clusters == after

    undo_claims = [Claim(name, "old", {"cpu": 300}, 1) for name in names[:5]]
    undo_releases = [(c.cluster, c.reservation_id) for c in claims]
    assert await cache.claim(undo_claims, 60, releases=undo_releases, check=False) == set()
    assert (await cache.snapshot()).clusters == before


async def test_claims_of_many_clusters_match_the_fake(
    redis_server: RedisServer, unique: str
) -> None:
    """Random multi-cluster claims (shared and separate shapes, re-claimed ids,
    releases, unchecked undos) against the fake: the same refusals, the same totals."""
    rng = random.Random(20261201)
    fake = FakeCapacityCache()
    names = [f"c{i}" for i in range(12)]
    shapes = [{"cpu": 700}, {"cpu": 250, "gpu": 1}, {"memory": 3}, {}]
    async with RedisCapacityCache.from_url(redis_server.url, prefix=f"test:{unique}:many:") as real:
        for name in names:
            free = {"cpu": rng.randrange(0, 6000), "gpu": rng.randrange(0, 3), "memory": 9}
            for cache in (fake, real):
                await cache.put(record(name, {**free, "pods": 8}, {**free, "pods": 4}))
        for step in range(120):
            chosen = rng.sample([*names, "missing"], rng.randrange(1, 13))
            shared = rng.choice(shapes)
            claims = [
                Claim(
                    name,
                    f"k{rng.randrange(4)}#{part}",
                    shared if rng.random() < 0.7 else dict(rng.choice(shapes)),
                    rng.randrange(0, 3),
                )
                for name in chosen
                for part in range(rng.randrange(1, 3))
            ]
            releases = [(rng.choice(names), f"k{rng.randrange(4)}#0") for _ in range(3)]
            check = rng.random() < 0.8
            expected = await fake.claim(claims, 600, releases=releases, check=check)
            assert await real.claim(claims, 600, releases=releases, check=check) == expected, step
            real_snap, fake_snap = await real.snapshot(), await fake.snapshot()
            assert real_snap.clusters == fake_snap.clusters, step


async def test_a_new_record_is_judged_by_its_own_nodes(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 1000, "pods": 10}))
    assert await cache.claim([Claim("c", "k", {"cpu": 1000}, 2)], 60) == {"c"}
    await cache.put(record("c", {"cpu": 1000, "pods": 10}, {"cpu": 1000, "pods": 10}))
    assert await cache.claim([Claim("c", "k", {"cpu": 1000}, 2)], 60) == set()


async def test_fragmentation_is_respected(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 3000, "pods": 10}, {"cpu": 3000, "pods": 10}))
    assert not await cache.reserve("c", "big", {"cpu": 4000}, 1, ttl=60)
    assert await cache.reserve("c", "small", {"cpu": 1500}, 4, ttl=60)
    assert not await cache.reserve("c", "one-more", {"cpu": 1}, 1, ttl=60)


async def test_reservations_reduce_fit_and_expire(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 8000, "pods": 20}))
    assert await cache.reserve("c", "long", {"cpu": 1000}, 3, ttl=60)
    assert await cache.reserve("c", "short", {"cpu": 1000}, 4, ttl=0.3)

    snap = await cache.snapshot()
    assert snap.clusters["c"].reserved == {"cpu": 7000, "pods": 7}
    assert snap.clusters["c"].fit_replicas({"cpu": 1000}) == 1
    assert not await cache.reserve("c", "third", {"cpu": 1000}, 2, ttl=60)
    held = await cache.reservations("c")
    assert [r.id for r in held] == ["short", "long"]
    assert held[1].expires_at == pytest.approx(snap.taken_at + 60, abs=1)

    async def short_expired() -> bool:
        return (await cache.snapshot()).clusters["c"].reserved == {"cpu": 3000, "pods": 3}

    await eventually(short_expired)
    assert await cache.reserve("c", "third", {"cpu": 1000}, 2, ttl=60)
    assert [r.id for r in await cache.reservations("c")] == ["long", "third"]


async def test_release(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 2000, "pods": 10}))
    assert await cache.reserve("c", "r1", {"cpu": 2000}, 1, ttl=60)
    assert not await cache.reserve("c", "r2", {"cpu": 2000}, 1, ttl=60)
    await cache.release("c", "r1")
    await cache.release("c", "never-held")
    assert (await cache.snapshot()).clusters["c"].reserved == {}
    assert await cache.reserve("c", "r2", {"cpu": 2000}, 1, ttl=60)


async def test_re_reserving_an_id_replaces_it(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 4000, "pods": 10}))
    for _ in range(3):
        assert await cache.reserve("c", "same", {"cpu": 1000}, 3, ttl=60)
    assert (await cache.snapshot()).clusters["c"].reserved == {"cpu": 3000, "pods": 3}
    # Growing to 4 fits only because the old 3 are not counted against it.
    assert await cache.reserve("c", "same", {"cpu": 1000}, 4, ttl=60)
    assert (await cache.snapshot()).clusters["c"].reserved == {"cpu": 4000, "pods": 4}


async def test_a_refused_reservation_changes_nothing(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 4000, "pods": 10}))
    assert await cache.reserve("c", "r", {"cpu": 1000}, 2, ttl=60)
    assert not await cache.reserve("c", "r", {"cpu": 1000}, 5, ttl=60)
    [held] = await cache.reservations("c")
    assert (held.requests, held.replicas) == ({"cpu": 1000}, 2)


async def test_unknown_and_removed_clusters_fit_nothing(cache: CapacityCache) -> None:
    assert not await cache.reserve("nowhere", "r", {"cpu": 1}, 1, ttl=60)
    await cache.put(record("c", {"cpu": 4000, "pods": 10}))
    assert await cache.reserve("c", "r", {"cpu": 1000}, 1, ttl=60)
    await cache.remove("c")
    assert (await cache.snapshot()).clusters == {}
    assert await cache.reservations("c") == []
    await cache.put(record("c", {"cpu": 4000, "pods": 10}))
    assert (await cache.snapshot()).clusters["c"].reserved == {}


async def test_zero_replicas_and_pod_slots(cache: CapacityCache) -> None:
    await cache.put(record("c", {"cpu": 4000, "pods": 2}))
    assert await cache.reserve("c", "none", {"cpu": 1_000_000}, 0, ttl=60)
    assert await cache.reserve("c", "tiny", {}, 2, ttl=60)
    assert not await cache.reserve("c", "more", {"cpu": 1}, 1, ttl=60)


@pytest.mark.parametrize(
    ("per_replica", "replicas", "ttl"),
    [
        ({"cpu": -1}, 1, 60.0),
        ({"cpu": 1}, -1, 60.0),
        ({"cpu": 1}, 1, 0.0),
        ({"cpu": 1}, 1, float("inf")),
    ],
    ids=["negative-request", "negative-replicas", "zero-ttl", "infinite-ttl"],
)
async def test_invalid_reservations_are_rejected(
    cache: CapacityCache, per_replica: dict[str, int], replicas: int, ttl: float
) -> None:
    with pytest.raises(ValueError, match=r"negative|positive"):
        await cache.reserve("c", "r", per_replica, replicas, ttl)


async def test_concurrent_reservers_never_exceed_capacity(
    redis_server: RedisServer, unique: str
) -> None:
    """Two scheduler replicas, each on its own connection, race for one cluster."""
    prefix = f"test:{unique}:race:"
    async with (
        RedisCapacityCache.from_url(redis_server.url, prefix=prefix) as first,
        RedisCapacityCache.from_url(redis_server.url, prefix=prefix) as second,
    ):
        for seed in range(8):
            rng = random.Random(seed)
            name = f"c{seed}"
            nodes = [
                {"cpu": rng.randrange(1000, 8000), "memory": rng.randrange(4, 32), "pods": 8}
                for _ in range(rng.randrange(1, 4))
            ]
            await first.put(record(name, *nodes))

            async def hammer(
                cache: RedisCapacityCache, who: str, rng: random.Random, name: str = name
            ) -> int:
                granted = 0
                for i in range(40):
                    shape = {"cpu": rng.randrange(100, 2000), "memory": rng.randrange(0, 4)}
                    granted += await cache.reserve(
                        name, f"{who}-{i}", shape, rng.randrange(1, 4), ttl=60
                    )
                return granted

            granted = await asyncio.gather(
                hammer(first, "a", random.Random(seed * 2)),
                hammer(second, "b", random.Random(seed * 2 + 1)),
            )
            current = (await second.snapshot([name])).clusters[name]
            held = await first.reservations(name)
            assert len(held) == sum(granted) > 0
            assert current.reserved == capacity.add(*(r.total for r in held))
            for resource, amount in current.reserved.items():
                assert amount <= current.available[resource], (seed, resource)
            # The race was real: the cluster filled up and turned reservers away.
            assert sum(granted) < 80


async def test_matches_the_fake_on_random_operation_sequences(
    redis_server: RedisServer, unique: str
) -> None:
    rng = random.Random(20261129)
    fake = FakeCapacityCache()
    async with RedisCapacityCache.from_url(redis_server.url, prefix=f"test:{unique}:diff:") as real:
        for step in range(300):
            cluster = rng.choice(["a", "b", "c"])
            op = rng.random()
            if op < 0.1:
                nodes = [
                    {"cpu": rng.randrange(0, 6000), "gpu": rng.randrange(0, 3), "pods": 6}
                    for _ in range(rng.randrange(0, 4))
                ]
                for cache in (fake, real):
                    await cache.put(record(cluster, *nodes))
            elif op < 0.13:
                for cache in (fake, real):
                    await cache.remove(cluster)
            elif op < 0.25:
                rid = f"r{rng.randrange(10)}"
                for cache in (fake, real):
                    await cache.release(cluster, rid)
            else:
                args = (
                    cluster,
                    f"r{rng.randrange(10)}",
                    {"cpu": rng.randrange(0, 3000), "gpu": rng.choice([0, 0, 1])},
                    rng.randrange(0, 4),
                )
                expected = await fake.reserve(*args, ttl=600)
                assert await real.reserve(*args, ttl=600) == expected, step
            real_snap, fake_snap = await real.snapshot(), await fake.snapshot()
            assert real_snap.clusters == fake_snap.clusters, step


async def test_redis_down_is_unavailable_and_recovery_needs_no_restart(
    fresh_redis: RedisServer,
) -> None:
    async with RedisCapacityCache.from_url(fresh_redis.url, timeout=1.0) as cache:
        await cache.put(record("c", {"cpu": 4000, "pods": 10}))
        assert await cache.reserve("c", "r", {"cpu": 1000}, 1, ttl=60)

        fresh_redis.kill()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: cache.snapshot(),
            lambda: cache.reserve("c", "r2", {"cpu": 1}, 1, ttl=60),
            lambda: cache.put(record("c", {"cpu": 1, "pods": 1})),
            lambda: cache.release("c", "r"),
            lambda: cache.remove("c"),
        ]
        for call in calls:
            with pytest.raises(Unavailable) as caught:
                await call()
            assert caught.value.__cause__ is not None

        # A restarted Redis is empty (no persistence) and has forgotten the scripts:
        # the same cache object reconnects and reloads them on its own.
        fresh_redis.start()
        await cache.put(record("c", {"cpu": 4000, "pods": 10}))
        assert await cache.reserve("c", "r", {"cpu": 1000}, 4, ttl=60)
        assert (await cache.snapshot()).clusters["c"].reserved == {"cpu": 4000, "pods": 4}


async def test_works_with_a_caller_client_that_decodes_responses(
    redis_server: RedisServer, unique: str
) -> None:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    cache = RedisCapacityCache(client, prefix=f"test:{unique}:decoded:")
    try:
        await cache.put(record("c", {"cpu": 4000, "pods": 10}))
        assert await cache.reserve("c", "r", {"cpu": 1000}, 2, ttl=60)
        assert (await cache.snapshot()).clusters["c"].reserved == {"cpu": 2000, "pods": 2}
        assert [r.id for r in await cache.reservations("c")] == ["r"]
    finally:
        await cache.aclose()


def test_fake_can_play_a_dead_redis() -> None:
    fake = FakeCapacityCache()
    fake.unavailable = True
    with pytest.raises(Unavailable):
        asyncio.run(fake.snapshot())


async def test_fake_expiry_follows_its_clock() -> None:
    now = [1000.0]
    fake = FakeCapacityCache(clock=lambda: now[0])
    await fake.put(record("c", {"cpu": 1000, "pods": 1}))
    assert await fake.reserve("c", "r", {"cpu": 1000}, 1, ttl=10)
    assert not await fake.reserve("c", "s", {"cpu": 1000}, 1, ttl=10)
    now[0] += 10
    assert await fake.reserve("c", "s", {"cpu": 1000}, 1, ttl=10)
    assert (await fake.snapshot()).taken_at == 1010.0


async def test_concurrent_claims_share_round_trips_and_keep_their_answers(
    redis_server: RedisServer, unique: str
) -> None:
    """Claims of concurrent callers go out pipelined, each still atomic on its own:
    room for ten replicas, thirty one-replica claims at once, exactly ten granted."""
    async with RedisCapacityCache.from_url(
        redis_server.url, prefix=f"test:{unique}:pipelined:"
    ) as cache:
        await cache.put(record("c", {"cpu": 10_000, "pods": 100}))
        await cache.reserve("c", "warm-up", {"cpu": 1}, 1, ttl=60)
        await cache.release("c", "warm-up")
        before = cache.claim_round_trips
        granted = await asyncio.gather(
            *(cache.reserve("c", f"r{i}", {"cpu": 1000}, 1, ttl=60) for i in range(30))
        )
        assert sum(granted) == 10
        assert granted[:10] == [True] * 10  # in the order they were made
        assert cache.claim_round_trips - before < 30 / 2
        assert (await cache.snapshot(["c"])).clusters["c"].reserved == {"cpu": 10_000, "pods": 10}


async def test_a_claim_given_up_before_it_was_sent_never_applies(
    redis_server: RedisServer, unique: str
) -> None:
    async with RedisCapacityCache.from_url(
        redis_server.url, prefix=f"test:{unique}:given-up:"
    ) as cache:
        await cache.put(record("c", {"cpu": 10_000, "pods": 100}))
        first = asyncio.ensure_future(cache.reserve("c", "sent", {"cpu": 1000}, 1, ttl=60))
        await asyncio.sleep(0)  # the first pipeline is on its way
        second = asyncio.ensure_future(cache.reserve("c", "dropped", {"cpu": 1000}, 1, ttl=60))
        await asyncio.sleep(0)
        second.cancel()
        assert await first
        with pytest.raises(asyncio.CancelledError):
            await second
        assert [r.id for r in await cache.reservations("c")] == ["sent"]


async def test_a_snapshot_carries_a_record_only_to_a_reader_without_it(
    redis_server: RedisServer, unique: str
) -> None:
    prefix = f"test:{unique}:stamps:"
    async with (
        RedisCapacityCache.from_url(redis_server.url, prefix=prefix) as cache,
        RedisCapacityCache.from_url(redis_server.url, prefix=prefix) as other,
    ):
        await cache.put(record("a", {"cpu": 4000, "pods": 10}))
        await cache.put(record("b", {"cpu": 2000, "pods": 10}))
        first = await cache.snapshot()
        assert cache.records_read == 2
        assert await cache.reserve("a", "r", {"cpu": 1000}, 1, ttl=60)
        second = await cache.snapshot()
        assert cache.records_read == 2  # same records: only the totals came back
        assert second.clusters["a"].reserved == {"cpu": 1000, "pods": 1}
        assert second.clusters["b"] == first.clusters["b"]
        await other.put(record("a", {"cpu": 8000, "pods": 10}, observed_at=200.0))
        third = await cache.snapshot(["a"])
        assert cache.records_read == 3  # rewritten by another writer: read again
        assert third.clusters["a"].available == {"cpu": 8000, "pods": 10}
        assert third.clusters["a"].reserved == {"cpu": 1000, "pods": 1}
        await other.remove("b")
        assert set((await cache.snapshot()).clusters) == {"a"}
        assert (await other.snapshot()).clusters == (await cache.snapshot()).clusters
