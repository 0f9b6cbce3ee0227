"""One behaviour suite for the typed compare-and-set store, run against both backends:
JetStream KV on a real nats-server, and the in-memory bucket handler tests use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from flotilla.common import store
from flotilla.common.acks import Acks
from flotilla.common.bus import Bus
from flotilla.common.errors import Unavailable
from flotilla.common.infra import NatsServer
from flotilla.common.testing import eventually
from flotilla.common.topology import BucketSpec, Topology


class Thing(BaseModel):
    name: str
    size: int = 0


@pytest.fixture(params=["memory", pytest.param("jetstream", marks=pytest.mark.integration)])
async def things(request: pytest.FixtureRequest, unique: str) -> AsyncIterator[store.Store[Thing]]:
    if request.param == "memory":
        yield store.Store(store.MemoryBucket(), Thing)
        return
    server: NatsServer = request.getfixturevalue("nats_server")
    bus = await Bus.connect(server.url, topology=Topology(prefix=f"st{unique}"), producer="test")
    try:
        yield await bus.store(BucketSpec(name=f"st{unique}-things", history=3), Thing)
    finally:
        await bus.close()


@pytest.fixture
async def following(things: store.Store[Thing]) -> AsyncIterator[store.Follower[Thing]]:
    follower = store.Follower(things)
    task = asyncio.create_task(follower.run())
    try:
        yield follower
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


KEY = "apps/v1/Deployment/default/web"


async def test_create_then_get_returns_the_value_and_its_revision(
    things: store.Store[Thing],
) -> None:
    assert await things.get(KEY) is None
    revision = await things.create(KEY, Thing(name="web", size=1))
    assert revision > 0
    assert await things.get(KEY) == store.Entry(Thing(name="web", size=1), revision)


async def test_create_of_an_existing_key_conflicts(things: store.Store[Thing]) -> None:
    await things.create(KEY, Thing(name="a"))
    with pytest.raises(store.Conflict):
        await things.create(KEY, Thing(name="b"))
    entry = await things.get(KEY)
    assert entry is not None and entry.value.name == "a"


async def test_update_is_compare_and_set(things: store.Store[Thing]) -> None:
    first = await things.create(KEY, Thing(name="a"))
    second = await things.update(KEY, Thing(name="b"), first)
    assert second > first
    with pytest.raises(store.Conflict):
        await things.update(KEY, Thing(name="stale writer"), first)
    assert await things.get(KEY) == store.Entry(Thing(name="b"), second)
    with pytest.raises(store.Conflict):
        await things.update("absent", Thing(name="x"), second)


async def test_two_writers_of_one_revision_one_wins(things: store.Store[Thing]) -> None:
    revision = await things.create(KEY, Thing(name="a"))
    results = await asyncio.gather(
        things.update(KEY, Thing(name="left"), revision),
        things.update(KEY, Thing(name="right"), revision),
        return_exceptions=True,
    )
    assert sum(isinstance(r, store.Conflict) for r in results) == 1
    assert sum(isinstance(r, int) for r in results) == 1


async def test_delete_is_compare_and_set_and_leaves_a_tombstone(
    things: store.Store[Thing],
) -> None:
    first = await things.create(KEY, Thing(name="a"))
    second = await things.update(KEY, Thing(name="b"), first)
    with pytest.raises(store.Conflict):
        await things.delete(KEY, first)
    tombstone = await things.delete(KEY, second)
    assert tombstone > second
    assert await things.get(KEY) is None
    with pytest.raises(store.Conflict):
        await things.update(KEY, Thing(name="resurrected"), second)
    # A deleted key can be created again.
    again = await things.create(KEY, Thing(name="c"))
    assert again > tombstone


async def test_write_creates_at_revision_zero_and_updates_otherwise(
    things: store.Store[Thing],
) -> None:
    revision = await things.write(KEY, Thing(name="a"), 0)
    with pytest.raises(store.Conflict):
        await things.write(KEY, Thing(name="b"), 0)
    assert await things.write(KEY, Thing(name="b"), revision) > revision
    with pytest.raises(ValueError, match="revision"):
        await things.update(KEY, Thing(name="c"), 0)


@pytest.mark.parametrize("key", ["a b", "x=y", ".lead", "trail.", "a..b", "ünï/cødé", "*>"])
async def test_any_string_is_a_key(things: store.Store[Thing], key: str) -> None:
    await things.put(key, Thing(name=key))
    entry = await things.get(key)
    assert entry is not None and entry.value.name == key
    assert store.decode_key(store.encode_key(key)) == key
    assert (await things.load()).keys() == {key}


async def test_an_empty_key_is_refused(things: store.Store[Thing]) -> None:
    with pytest.raises(ValueError, match="empty"):
        await things.put("", Thing(name="x"))


async def test_load_reads_live_records_only(things: store.Store[Thing]) -> None:
    await things.put("a", Thing(name="a"))
    b = await things.put("b", Thing(name="b"))
    await things.put("c", Thing(name="c"))
    await things.delete("b", b)
    loaded = await things.load()
    assert {k: e.value.name for k, e in loaded.items()} == {"a": "a", "c": "c"}


async def test_the_watch_sends_the_contents_in_revision_order_then_changes(
    things: store.Store[Thing],
) -> None:
    one = await things.put("one", Thing(name="1"))
    two = await things.put("two", Thing(name="2"))
    await things.put("one", Thing(name="1b"))
    gone = await things.delete("two", two)
    seen: list[tuple[str, str | None] | None] = []
    changes = things.changes()
    try:
        for _ in range(3):
            change = await anext(changes)
            seen.append(None if change is None else (change[0], _name(change[1])))
        later = await things.put("three", Thing(name="3"))
        change = await anext(changes)
        assert change is not None and change[2] == later
        seen.append((change[0], _name(change[1])))
    finally:
        await changes.aclose()
    assert seen == [("one", "1b"), ("two", None), None, ("three", "3")]
    assert one < two < gone < later


def _name(entry: store.Entry[Thing] | None) -> str | None:
    return None if entry is None else entry.value.name


async def test_a_follower_catches_up_forgets_deleted_keys_and_syncs(
    things: store.Store[Thing], following: store.Follower[Thing]
) -> None:
    await following.caught_up(timeout=10)
    assert len(following) == 0
    revision = await things.create("a", Thing(name="a"))
    await things.create("b", Thing(name="b"))
    synced = await following.sync(timeout=10)
    assert synced >= revision
    assert set(following.entries) == {"a", "b"}
    await things.delete("a", revision)
    await following.sync(timeout=10)
    assert set(following.entries) == {"b"}
    assert following.get("a") is None


async def test_a_follower_started_late_reads_what_is_there(
    things: store.Store[Thing],
) -> None:
    await things.put("a", Thing(name="a"))
    b = await things.put("b", Thing(name="b"))
    await things.delete("b", b)
    changes: list[tuple[str, str | None, int]] = []
    follower = store.Follower(
        things, on_change=lambda k, v, r: changes.append((k, v.name if v else None, r))
    )
    task = asyncio.create_task(follower.run())
    try:
        await follower.caught_up(timeout=10)
        assert set(follower.entries) == {"a"}
        assert follower.revision == await things.last_revision()
        await follower.sync(timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [(k, v) for k, v, _ in changes] == [("a", "a"), ("b", None)]


async def test_a_watch_hands_back_the_stores_own_writes_unparsed(
    things: store.Store[Thing],
) -> None:
    """A value this store wrote comes back from its watch as the very object written
    (not parsed again); another writer's value is parsed."""
    follower = store.Follower(things)
    task = asyncio.create_task(follower.run())
    other = store.Store(things.bucket, Thing)
    try:
        await follower.caught_up(timeout=10)
        mine = Thing(name="mine")
        await things.put("a", mine)
        await other.put("b", Thing(name="theirs"))
        await follower.sync(timeout=10)
        entry_a, entry_b = follower.get("a"), follower.get("b")
        assert entry_a is not None and entry_a.value is mine
        assert entry_b is not None and entry_b.value == Thing(name="theirs")
        assert not things._written, "nothing is kept once seen"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await things.put("c", Thing(name="unwatched"))
    assert not things._written, "nothing is kept while nobody watches"


async def test_a_memo_hands_back_unchanged_records_unparsed(
    things: store.Store[Thing],
) -> None:
    """With a memo, a record read or written last comes back as the same object while
    its bytes are unchanged; another writer's change is parsed; the oldest key leaves."""
    memo = store.Store(things.bucket, Thing, memo=1)
    mine = Thing(name="mine")
    revision = await memo.create("a", mine)
    first = await memo.get("a")
    assert first == store.Entry(mine, revision) and first.value is mine
    again = await memo.get("a")
    assert again is not None and again.value is mine
    changed = await things.update("a", Thing(name="theirs"), revision)
    read = await memo.get("a")
    assert read == store.Entry(Thing(name="theirs"), changed)
    reread = await memo.get("a")
    assert reread is not None and reread.value is read.value
    await memo.create("b", Thing(name="b"))  # the memo holds one key: "a" leaves
    parsed = await memo.get("a")
    assert parsed is not None and parsed.value == read.value and parsed.value is not read.value
    await memo.delete("a", parsed.revision)
    assert await memo.get("a") is None


async def test_without_a_memo_every_get_parses(things: store.Store[Thing]) -> None:
    await things.create("a", Thing(name="a"))
    first, second = await things.get("a"), await things.get("a")
    assert first is not None and second is not None
    assert first.value == second.value and first.value is not second.value


async def test_waiting_for_a_revision_not_written_yet_times_out(
    things: store.Store[Thing], following: store.Follower[Thing]
) -> None:
    await following.caught_up(timeout=10)
    with pytest.raises(Unavailable):
        await following.wait_for(await things.last_revision() + 1, timeout=0.3)


async def test_old_tombstones_are_purged_and_new_values_survive(
    things: store.Store[Thing], following: store.Follower[Thing]
) -> None:
    revisions = [await things.put(f"k{i}", Thing(name=str(i))) for i in range(5)]
    for i, revision in enumerate(revisions[:4]):
        await things.delete(f"k{i}", revision)
    # k0 is written again after its tombstone: the purge must not take the new value.
    await things.create("k0", Thing(name="again"))
    assert await things.purge_tombstones(older_than=3600) == 0
    await following.sync(timeout=10)
    assert await things.purge_tombstones(older_than=0) == 3  # k1..k3 (k0 is live)
    assert (await things.get("k0")) is not None
    assert set((await things.load()).keys()) == {"k0", "k4"}
    assert await things.size() == 2 + _history_of_k0(things)
    # A follower that started before the purge still syncs (and drops nothing live).
    await things.put("k5", Thing(name="5"))
    await following.sync(timeout=10)
    assert set(following.entries) == {"k0", "k4", "k5"}


def _history_of_k0(things: store.Store[Thing]) -> int:
    """JetStream keeps a key's older revisions (history 3): k0's first value and
    tombstone stay until k0 is deleted again and its tombstone purged."""
    return 0 if isinstance(things.bucket, store.MemoryBucket) else 2


async def test_the_newest_message_is_never_purged_so_a_new_follower_syncs(
    things: store.Store[Thing],
) -> None:
    revision = await things.put("a", Thing(name="a"))
    await things.delete("a", revision)
    assert await things.purge_tombstones(older_than=0) == 0
    follower = store.Follower(things)
    task = asyncio.create_task(follower.run())
    try:
        await follower.sync(timeout=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(follower) == 0
    await things.put("b", Thing(name="b"))
    assert await things.purge_tombstones(older_than=0) == 1
    assert (await things.load()).keys() == {"b"}


async def test_an_unreadable_value_is_a_clear_error_and_the_follower_skips_it(
    things: store.Store[Thing], following: store.Follower[Thing]
) -> None:
    await things.bucket.put("bad", b'{"size": "not a number"}')
    with pytest.raises(store.Unreadable, match="Thing 'bad'"):
        await things.get("bad")
    await things.put("good", Thing(name="good"))
    await eventually(lambda: "good" in following.entries)
    assert "bad" not in following.entries


@pytest.mark.parametrize(
    "key",
    [
        "apps/v1/Deployment/default/web",
        "v1/Pod/_/x.y",
        "example.com/v1beta1/Thing/ns/.odd..name.",
        "v1/ConfigMap/ns/with space=and*star",
    ],
)
def test_record_keys_round_trip_and_are_valid_kv_keys(key: str) -> None:
    encoded = store.encode_key(key)
    assert store.decode_key(encoded) == key
    assert not encoded.startswith(".") and not encoded.endswith(".") and ".." not in encoded
    assert all(c.isalnum() or c in "-/_=." for c in encoded)


class _EarlyMarkerWatch:
    """What nats-py's KV watch hands over when its consumer-info answer overtakes
    the messages the server already sent: the caught-up marker first."""

    def __init__(self, entries: list[Any]) -> None:
        self.items: list[Any] = [None, *entries]
        self.stopped = False

    def __aiter__(self) -> _EarlyMarkerWatch:
        return self

    async def __anext__(self) -> Any:
        if self.items:
            return self.items.pop(0)
        await asyncio.sleep(3600)  # then nothing more is written
        raise StopAsyncIteration

    async def stop(self) -> None:
        self.stopped = True


class _Info:
    def __init__(self, messages: int) -> None:
        self.state = SimpleNamespace(messages=messages, last_seq=messages)


def _kv_entry(key: str, revision: int, pending: int) -> Any:
    return SimpleNamespace(
        key=key,
        value=b'{"name": "x"}',
        revision=revision,
        delta=pending,
        created=None,
        operation=None,
    )


async def test_a_watch_is_caught_up_only_after_what_the_bucket_held() -> None:
    entries = [_kv_entry("a", 1, 1), _kv_entry("b", 2, 0)]
    watch = _EarlyMarkerWatch(entries)
    kv = SimpleNamespace(watchall=lambda **_: _resolved(watch))
    js = SimpleNamespace(stream_info=lambda _: _resolved(_Info(len(entries))))
    things = store.Store(store.JetStreamBucket(js, kv, "things", acks=Acks(js)), Thing)  # type: ignore[arg-type]
    loaded = await things.load(timeout=5)
    assert sorted(loaded) == ["a", "b"]
    assert watch.stopped


async def test_an_empty_bucket_is_caught_up_at_once() -> None:
    watch = _EarlyMarkerWatch([])
    kv = SimpleNamespace(watchall=lambda **_: _resolved(watch))
    js = SimpleNamespace(stream_info=lambda _: _resolved(_Info(0)))
    things = store.Store(store.JetStreamBucket(js, kv, "things", acks=Acks(js)), Thing)  # type: ignore[arg-type]
    assert await things.load(timeout=5) == {}


async def _resolved(value: Any) -> Any:
    return value
