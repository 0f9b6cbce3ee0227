"""Typed durable records in a JetStream KV bucket, written by compare-and-set, and a
follower that keeps a replica's in-memory copy of a bucket current.

Several replicas of a service may write one record, and any of them may die
between reading and writing; correctness comes from compare-and-set, never from
timing. So a `Store` holds pydantic models by key, each with the bucket's
*revision* (the stream sequence of its last write), and every write names the
revision it read:

- `Store.get`: the model and its revision, or None;
- `Store.create`: only if the key holds nothing (a deleted key counts as nothing);
- `Store.update`: only if the key is still at the revision read;
- `Store.delete`: a *tombstone* (the key reads as absent), also by revision;
- `Store.put`: last writer wins, for data with one writer (watch positions).

A compare-and-set that lost raises `Conflict`: re-read, decide again. A bucket that
does not answer raises `flotilla.common.errors.Unavailable`.

**Followers.** A replica that must know every record (the scheduler decides
against every cluster, not only those of its partitions) runs a `Follower`: a
watch of the whole bucket into a map, which drops deleted keys at once. It says
when it has *caught up* (taken in what the bucket held when it started), and
`Follower.sync` waits until it has taken in everything written before the call:
"have I seen every cluster written so far?" is the bucket's last sequence, read
now, against the newest revision the follower has applied.

**Forgetting.** A tombstone stays in the bucket until `Store.purge_tombstones`
removes it once it is older than a retention period (a key deleted and at once
re-created by a stale writer would otherwise come back to life, so tombstones are
kept for a while, then dropped, so that the bucket does not grow with every
object ever deleted). The purge of one key removes only messages up to its
tombstone, so a key re-created meanwhile keeps its new value. The bucket's
newest message is never purged (only the revisions of its key before it),
because `Follower.sync` waits for the bucket's last sequence, which a purge does
not lower.

**Keys.** Any string is a key: characters NATS KV keys do not allow are written
``=XX`` (hex) in the bucket (`encode_key`), which keeps the common
``apps/v1/Deployment/default/web`` readable as it is.

Two backends behind one protocol (`Bucket`) behave the same, down to revisions,
conflicts, watch order and tombstones: `JetStreamBucket` (production) and
`MemoryBucket` (handler unit tests), checked by one behaviour suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE
from pydantic import BaseModel, ValidationError

from flotilla.common.acks import Acks
from flotilla.common.errors import PermanentError, TemporaryError, Unavailable

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

CONFLICT_DELAY = 0.1
PARALLEL_REQUESTS = 64
"""Requests in flight at once for bulk work (purging many tombstones)."""
SCAN_WAIT = 10.0
"""Seconds a scan of a bucket waits for its next entry."""
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream error codes of a failed expected-last-subject-sequence check."""


class Conflict(TemporaryError):
    """Another writer changed the key since it was read (compare-and-set lost).

    A temporary error: if it escapes a handler, the message is retried and the
    retry reads again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay=CONFLICT_DELAY)


class Unreadable(PermanentError):
    """A stored value that does not parse as the store's model."""


# --- keys ---------------------------------------------------------------------------

_KEY_SAFE = re.compile(r"[-/_a-zA-Z0-9.]")
_KEY_PLAIN = re.compile(r"[-/_a-zA-Z0-9](?:[-/_a-zA-Z0-9]|\.(?!\.))*(?<!\.)")
"""A key `encode_key` leaves as it is: only safe characters, no empty token."""


def encode_key(key: str) -> str:
    """A string as a KV key: unsafe characters (and ``=``) become ``=XX``."""
    if _KEY_PLAIN.fullmatch(key):
        return key  # most keys (every object key): one match, not one per character
    if not key:
        raise ValueError("a store key must not be empty")
    out = []
    for char in key:
        if _KEY_SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"={byte:02X}" for byte in char.encode())
    text = "".join(out)
    # KV keys may not start or end with a dot, nor hold empty tokens.
    text = text.replace("..", ".=2E")
    if text.startswith("."):
        text = "=2E" + text[1:]
    if text.endswith("."):
        text = text[:-1] + "=2E"
    return text


def decode_key(text: str) -> str:
    """The inverse of `encode_key`."""
    if "=" not in text:
        return text  # nothing was escaped (every object key)
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "=":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(text[i].encode())
            i += 1
    return out.decode()


# --- the backend protocol -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Raw:
    """One message of a bucket as a backend returns it."""

    key: str
    """The key as stored (`encode_key` form)."""
    data: bytes | None
    """None: a tombstone (the key was deleted)."""
    revision: int
    written: float
    """Server time of the write (POSIX seconds)."""


class Bucket(Protocol):
    """Bytes by key with revisions: what a `Store` needs of a KV bucket."""

    async def get(self, key: str) -> Raw | None:
        """The live value under `key`, or None (absent or deleted)."""
        ...

    async def create(self, key: str, data: bytes) -> int: ...

    async def update(self, key: str, data: bytes, revision: int) -> int: ...

    async def put(self, key: str, data: bytes) -> int: ...

    async def delete(self, key: str, revision: int | None) -> int: ...

    async def last_revision(self) -> int:
        """The sequence of the bucket's newest message (0: never written)."""
        ...

    async def purge_tombstones(self, older_than: float) -> int:
        """Remove tombstones older than `older_than` seconds; how many went."""
        ...

    async def size(self) -> int:
        """Messages the bucket holds (values, their history, tombstones)."""
        ...

    def watch(self) -> AsyncGenerator[Raw | None, None]:
        """The newest message of every key (tombstones too) in revision order, then
        None, then every later write as it happens."""
        ...


# --- the typed store ---------------------------------------------------------------


class Entry(NamedTuple, Generic[M]):
    """A record and its revision (what the next compare-and-set must name)."""

    value: M
    revision: int


Change = tuple[str, Entry[M] | None, int]
"""(key, the entry or None when deleted, revision): one change a follower applies."""


V = TypeVar("V")


class Recent(Generic[V]):
    """At most `size` values by key, the least recently put forgotten first (a
    memo's bound: what is forgotten is read again when next needed)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[str, V] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> V | None:
        return self._items.get(key)

    def put(self, key: str, value: V) -> None:
        self._items.pop(key, None)
        self._items[key] = value
        while len(self._items) > self.size:
            del self._items[next(iter(self._items))]

    def pop(self, key: str, default: V | None = None) -> V | None:
        return self._items.pop(key, default)


class Store(Generic[M]):
    """Records of one pydantic model in one bucket (see the module docstring)."""

    def __init__(self, bucket: Bucket, model: type[M], *, memo: int = 0) -> None:
        self.bucket = bucket
        self.model = model
        self._watching = 0
        self._written: dict[str, tuple[bytes, M]] = {}
        """Key → the bytes and value this store last wrote there, while a watch runs
        to see them come back (taken out when they do)."""
        self.memo = memo
        self._memo: Recent[tuple[bytes, M]] = Recent(memo)
        """Key → the bytes and value last read or written there, for the `memo` keys
        used last: a `get` that reads the same bytes again hands back that value instead
        of parsing them. For a store whose callers never change a value they got, with
        large records read and rewritten over and over (the transformer's dependents of
        one namespace: thousands of references, parsed once per placement otherwise)."""

    def _dump(self, value: M) -> bytes:
        return value.model_dump_json(by_alias=True).encode()

    def _own(self, key: str, value: M) -> bytes:
        data = self._dump(value)
        if self._watching:
            self._written[key] = (data, value)
        return data

    def _remember(self, key: str, data: bytes, value: M) -> None:
        if self.memo:
            self._memo.put(key, (data, value))

    def _parse(self, key: str, data: bytes) -> M:
        try:
            return self.model.model_validate_json(data)
        except ValidationError as error:
            raise Unreadable(f"{self.model.__name__} {key!r} is unreadable: {error}") from error

    async def get(self, key: str) -> Entry[M] | None:
        raw = await self.bucket.get(encode_key(key))
        if raw is None or raw.data is None:
            self._memo.pop(key, None)
            return None
        known = self._memo.get(key)
        if known is not None and known[0] == raw.data:
            value = known[1]
        else:
            value = self._parse(key, raw.data)
        self._remember(key, raw.data, value)
        return Entry(value, raw.revision)

    async def create(self, key: str, value: M) -> int:
        """Write `value` if `key` holds nothing; its revision, or `Conflict`."""
        data = self._own(key, value)
        revision = await self.bucket.create(encode_key(key), data)
        self._remember(key, data, value)
        return revision

    async def update(self, key: str, value: M, last: int) -> int:
        """Write `value` if `key` is still at revision `last`; the new revision, or `Conflict`."""
        if last <= 0:
            raise ValueError("update needs the revision read; use create for a new key")
        data = self._own(key, value)
        revision = await self.bucket.update(encode_key(key), data, last)
        self._remember(key, data, value)
        return revision

    async def write(self, key: str, value: M, last: int) -> int:
        """`create` when `last` is 0 (nothing was read), else `update`."""
        if last == 0:
            return await self.create(key, value)
        return await self.update(key, value, last)

    async def put(self, key: str, value: M) -> int:
        """Write `value` whatever the key holds (only for data with a single writer)."""
        return await self.bucket.put(encode_key(key), self._own(key, value))

    async def delete(self, key: str, last: int | None = None) -> int:
        """Tombstone `key` if it is still at revision `last` (None: whatever it holds)."""
        revision = await self.bucket.delete(encode_key(key), last)
        self._memo.pop(key, None)
        return revision

    async def last_revision(self) -> int:
        return await self.bucket.last_revision()

    async def purge_tombstones(self, older_than: float) -> int:
        return await self.bucket.purge_tombstones(older_than)

    async def size(self) -> int:
        """Messages the bucket holds (what forgetting deleted keys keeps bounded)."""
        return await self.bucket.size()

    async def changes(self) -> AsyncGenerator[Change[M] | None, None]:
        """What the bucket holds (deleted keys as None entries), None once caught up,
        then every change. An unreadable value is logged and reads as deleted.

        A value this store wrote itself comes back as the object written, not
        parsed again from its bytes."""
        self._watching += 1
        try:
            async with contextlib.aclosing(self.bucket.watch()) as raws:
                async for raw in raws:
                    if raw is None:
                        yield None
                        continue
                    key = decode_key(raw.key)
                    yield key, self._entry(key, raw), raw.revision
        finally:
            self._watching -= 1
            if not self._watching:
                self._written.clear()

    def _entry(self, key: str, raw: Raw) -> Entry[M] | None:
        if raw.data is None:
            return None
        own = self._written.get(key)
        if own is not None and own[0] == raw.data:
            del self._written[key]
            return Entry(own[1], raw.revision)
        try:
            return Entry(self._parse(key, raw.data), raw.revision)
        except Unreadable as error:
            log.warning("%s", error)
            return None

    async def load(self, timeout: float = 10.0) -> dict[str, Entry[M]]:
        """Every live record now, read once."""
        found: dict[str, Entry[M]] = {}
        try:
            async with asyncio.timeout(timeout), contextlib.aclosing(self.changes()) as changes:
                async for change in changes:
                    if change is None:
                        return found
                    key, entry, _ = change
                    if entry is None:
                        found.pop(key, None)
                    else:
                        found[key] = entry
        except TimeoutError:
            raise Unavailable(f"reading the {self.model.__name__} records timed out") from None
        raise Unavailable(f"the {self.model.__name__} watch ended early")


# --- the follower ------------------------------------------------------------------

OnChange = Callable[[str, M | None, int], object]


class Follower(Generic[M]):
    """One replica's copy of a bucket, kept current by a watch (`run`).

    `on_change(key, value or None, revision)` is told every change, in order, to
    keep views derived from the records (indexes) in step.
    """

    def __init__(self, store: Store[M], on_change: OnChange[M] | None = None) -> None:
        self.store = store
        self.entries: dict[str, Entry[M]] = {}
        self.revision = 0
        """The newest revision taken in (a tombstone's too)."""
        self._on_change = on_change
        self._caught_up = asyncio.Event()
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> Entry[M] | None:
        return self.entries.get(key)

    @property
    def is_caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def run(self) -> None:
        """Until cancelled (run it under `Runtime.spawn`; a restart re-reads the
        bucket and forgets what was deleted meanwhile)."""
        seen: set[str] | None = set()
        async with contextlib.aclosing(self.store.changes()) as changes:
            async for change in changes:
                if change is None:
                    if seen is not None:
                        for key in self.entries.keys() - seen:
                            self._apply(key, None, self.revision)
                        seen = None
                    self._caught_up.set()
                else:
                    key, entry, revision = change
                    if seen is not None:
                        seen.add(key)
                    self.revision = max(self.revision, revision)
                    self._apply(key, entry, revision)
                async with self._changed:
                    self._changed.notify_all()

    def _apply(self, key: str, entry: Entry[M] | None, revision: int) -> None:
        if entry is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = entry
        if self._on_change is not None:
            self._on_change(key, entry.value if entry else None, revision)

    async def caught_up(self, timeout: float | None = None) -> None:
        """Until the bucket as it was at the start has been read."""
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
        except TimeoutError:
            raise Unavailable(f"the {self.store.model.__name__} records are not loaded") from None

    async def wait_for(self, revision: int, timeout: float | None = None) -> None:
        """Until every change up to `revision` has been taken in."""
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
                async with self._changed:
                    await self._changed.wait_for(lambda: self.revision >= revision)
        except TimeoutError:
            raise Unavailable(
                f"the {self.store.model.__name__} view is behind revision {revision}"
            ) from None

    async def sync(self, timeout: float | None = None) -> int:
        """Until everything written before this call has been taken in; the revision."""
        deadline = None if timeout is None else time.monotonic() + timeout
        newest = await self.store.last_revision()
        await self.wait_for(newest, None if deadline is None else deadline - time.monotonic())
        return self.revision


# --- in memory ---------------------------------------------------------------------


class MemoryBucket:
    """A bucket in this process, for unit tests of code written against `Store`."""

    def __init__(self) -> None:
        self._latest: dict[str, Raw] = {}
        self._sequence = 0
        self._held = 0
        self._watchers: list[asyncio.Queue[Raw]] = []

    def _write(self, key: str, data: bytes | None) -> int:
        self._sequence += 1
        raw = Raw(key, data, self._sequence, time.time())
        if key not in self._latest:
            self._held += 1
        self._latest[key] = raw
        for queue in self._watchers:
            queue.put_nowait(raw)
        return raw.revision

    def _current(self, key: str) -> int:
        raw = self._latest.get(key)
        return raw.revision if raw is not None else 0

    async def get(self, key: str) -> Raw | None:
        raw = self._latest.get(key)
        return raw if raw is not None and raw.data is not None else None

    async def create(self, key: str, data: bytes) -> int:
        if await self.get(key) is not None:
            raise Conflict(f"create {key}: exists")
        return self._write(key, data)

    async def update(self, key: str, data: bytes, revision: int) -> int:
        if self._current(key) != revision:
            raise Conflict(f"update {key}: not at revision {revision}")
        return self._write(key, data)

    async def put(self, key: str, data: bytes) -> int:
        return self._write(key, data)

    async def delete(self, key: str, revision: int | None) -> int:
        if revision is not None and self._current(key) != revision:
            raise Conflict(f"delete {key}: not at revision {revision}")
        return self._write(key, None)

    async def last_revision(self) -> int:
        return self._sequence

    async def purge_tombstones(self, older_than: float) -> int:
        cutoff = time.time() - older_than
        gone = [
            key
            for key, raw in self._latest.items()
            if raw.data is None and raw.written <= cutoff and raw.revision != self._sequence
        ]
        for key in gone:
            del self._latest[key]
            self._held -= 1
        return len(gone)

    async def size(self) -> int:
        return self._held

    async def watch(self) -> AsyncGenerator[Raw | None, None]:
        queue: asyncio.Queue[Raw] = asyncio.Queue()
        snapshot = sorted(self._latest.values(), key=lambda raw: raw.revision)
        self._watchers.append(queue)
        try:
            for raw in snapshot:
                yield raw
            yield None
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(queue)


# --- JetStream ---------------------------------------------------------------------


@contextlib.contextmanager
def _nats_errors(operation: str) -> Iterator[None]:
    try:
        yield
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise Conflict(f"{operation}: {exc.description or 'revision moved'}") from exc
    except nats.js.errors.APIError as exc:
        if exc.err_code in WRONG_LAST_SEQUENCE:
            raise Conflict(f"{operation}: {exc.description}") from exc
        raise Unavailable(f"{operation}: {exc}") from exc
    except (nats.errors.Error, OSError) as exc:
        raise Unavailable(f"{operation}: {exc}") from exc


def _seconds(moment: object) -> float:
    """A KV entry's write time (nats-py types it loosely; a plain get has none)."""
    return moment.timestamp() if isinstance(moment, datetime) else time.time()


class JetStreamBucket:
    """A NATS KV bucket (created beforehand, by `flotilla.common.bus.Bus.ensure`).

    Reads go through nats-py's KV. Creates and updates are the KV's own
    compare-and-set (a publish to the key's subject naming the revision read, in
    ``Nats-Expected-Last-Subject-Sequence``), sent through the bus's `Acks`: the
    record write of every decision then costs no request/reply round of its own.
    A create that finds a tombstone re-creates over it, as nats-py's ``create``
    does. Deletes publish the KV delete marker themselves, because
    nats-py's ``delete`` does not return the tombstone's revision, and purges go
    through the stream API so that they can be bounded by a sequence (nats-py's
    ``purge_deletes`` would also remove a value written after the tombstone it
    found).
    """

    def __init__(
        self,
        js: JetStreamContext,
        kv: nats.js.kv.KeyValue,
        name: str,
        *,
        acks: Acks,
    ) -> None:
        self.js = js
        self.kv = kv
        self.name = name
        self.acks = acks
        self.stream = f"KV_{name}"
        self._prefix = f"$KV.{name}."

    async def get(self, key: str) -> Raw | None:
        with _nats_errors(f"read {key}"):
            try:
                entry = await self.kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        return Raw(key, entry.value or b"", int(entry.revision or 0), _seconds(entry.created))

    async def create(self, key: str, data: bytes) -> int:
        with _nats_errors(f"create {key}"):
            try:
                return await self._write(key, data, 0)
            except nats.js.errors.APIError as exc:
                if exc.err_code not in WRONG_LAST_SEQUENCE:
                    raise
                # A tombstone (re-create over it) or a value (the create lost)?
                try:
                    last = await self.js.get_last_msg(self.stream, self._prefix + key)
                except nats.js.errors.NotFoundError:  # purged meanwhile: nothing there
                    return await self._write(key, data, 0)
                if (last.headers or {}).get(KV_OP) not in (KV_DEL, KV_PURGE):
                    raise
                return await self._write(key, data, int(last.seq or 0))

    async def update(self, key: str, data: bytes, revision: int) -> int:
        with _nats_errors(f"update {key}"):
            return await self._write(key, data, revision)

    async def _write(self, key: str, data: bytes, last: int) -> int:
        headers = {EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)}
        return int((await self.acks.publish(self._prefix + key, data, headers)).seq)

    async def put(self, key: str, data: bytes) -> int:
        with _nats_errors(f"put {key}"):
            return int(await self.kv.put(key, data))

    async def delete(self, key: str, revision: int | None) -> int:
        headers = {KV_OP: KV_DEL}
        if revision is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(revision)
        with _nats_errors(f"delete {key}"):
            ack = await self.js.publish(self._prefix + key, b"", headers=headers)
        return int(ack.seq)

    async def last_revision(self) -> int:
        with _nats_errors(f"status of {self.name}"):
            info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def size(self) -> int:
        with _nats_errors(f"status of {self.name}"):
            info = await self.js.stream_info(self.stream)
        return int(info.state.messages)

    async def purge_tombstones(self, older_than: float) -> int:
        cutoff = time.time() - older_than
        newest = await self.last_revision()
        old: list[Raw] = []
        async with contextlib.aclosing(self._scan(headers_only=True)) as scan:
            async for raw in scan:
                if raw.data is None and raw.written <= cutoff:
                    old.append(raw)

        async def purge(raw: Raw) -> None:
            # Up to the tombstone, or (the newest message) to just before it.
            until = raw.revision if raw.revision == newest else raw.revision + 1
            await self.js.purge_stream(self.stream, subject=self._prefix + raw.key, seq=until)

        with _nats_errors(f"purging tombstones of {self.name}"):
            for start in range(0, len(old), PARALLEL_REQUESTS):
                await asyncio.gather(*map(purge, old[start : start + PARALLEL_REQUESTS]))
        return sum(raw.revision != newest for raw in old)

    async def _scan(self, *, headers_only: bool) -> AsyncGenerator[Raw, None]:
        """What the bucket holds now (newest message per key), then the end."""
        async with contextlib.aclosing(self._watch(meta_only=headers_only)) as raws:
            while True:
                try:
                    async with asyncio.timeout(SCAN_WAIT):
                        raw = await anext(raws)
                except TimeoutError:
                    raise Unavailable(f"reading {self.name} timed out") from None
                if raw is None:
                    return
                yield raw

    def watch(self) -> AsyncGenerator[Raw | None, None]:
        return self._watch(meta_only=False)

    async def _watch(self, *, meta_only: bool) -> AsyncGenerator[Raw | None, None]:
        """nats-py's watch with a caught-up marker that can be trusted.

        nats-py marks "caught up" (None) when its consumer reports nothing pending
        and this client has handled no message yet — which is also the case when the
        server has already sent every message and the consumer-info answer overtook
        them: the reader then saw an empty bucket (a restarted watcher lost its
        records, and with them the deletions made while it was down). Here the
        marker follows the entry the server sent with nothing pending after it;
        nats-py's own marker counts only for a bucket that held no message when the
        watch began."""
        empty = await self.size() == 0
        with _nats_errors(f"watch {self.name}"):
            watcher: Any = await self.kv.watchall(meta_only=meta_only)
        caught_up = False
        try:
            async for entry in watcher:
                if entry is None:
                    if empty and not caught_up:
                        caught_up = True
                        yield None
                    continue
                yield _raw(entry)
                if not caught_up and not entry.delta:
                    caught_up = True
                    yield None
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()


def _raw(entry: nats.js.kv.KeyValue.Entry) -> Raw:
    deleted = entry.operation in (KV_DEL, KV_PURGE)
    return Raw(
        key=entry.key,
        data=None if deleted else (entry.value or b""),
        revision=int(entry.revision or 0),
        written=_seconds(entry.created),
    )
