"""The capacity cache on Redis: the real adapter behind `capacity.CapacityCache`.

See `flotilla.common.capacity` for the models and the fit rule this shares with the
fake. The Redis side is two small Lua scripts rather than a library: nothing
maintained offers an atomic "check several resource amounts against a record minus
live, expiring claims, then claim" on Redis.

Claims are the hot path (one per scheduling decision), so `RedisCapacityCache.claim`
pipelines them: the claims of concurrent callers that arrive while a pipeline is
in flight go out together in the next one (one write, one round trip), each still
its own atomic script call, in the order they were made. redis-py pipelines but
does not coalesce calls of independent callers, hence the small queue here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pydantic import SecretStr
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from flotilla.common import config
from flotilla.common.capacity import (
    Claim,
    ClusterCapacity,
    Requests,
    Reservation,
    Snapshot,
    validate_reservation,
)
from flotilla.common.errors import Unavailable

# Redis layout, all under one prefix (default ``flotilla:capacity:``):
#   <prefix>clusters               set of cluster names (what snapshot() with no names reads)
#   <prefix>cluster:<name>         the record as compact JSON, `reserved` left out
#   <prefix>available:<name>       its `available` alone (what a claim reads of the record)
#   <prefix>stamp:<name>           a digest of the record's JSON: a snapshot sends the
#                                  record only to a reader that does not hold it yet
#   <prefix>nodefit:<name>         hash  shape -> replicas of it the nodes hold (a memo
#                                  of the claim script, cleared when the record changes)
#   <prefix>reservations:<name>    hash  id -> {"requests": {...}, "replicas": n}
#   <prefix>expiry:<name>          zset  id -> expires_at (Redis server time, epoch seconds)
#   <prefix>reserved:<name>        hash  resource -> total units of the live reservations
# The totals are kept by the scripts on every reserve, release and expiry, so a
# snapshot and a claim cost O(resources) per cluster, not O(live reservations), and
# a claim decodes neither the record nor its node list once the shape was seen.
# Amounts stay integers end to end (doubles are exact below 2**53, i.e. 8 PiB).

_LUA_COMMON = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_s = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))

local function with_pod(shape)
  if shape.pods == nil then shape.pods = 1 end
  return shape
end

-- add (sign 1) or take away (sign -1) one reservation body's totals
local function count_body(totals_key, body, sign)
  for r, amount in pairs(with_pod(body.requests)) do
    local delta = amount * body.replicas
    if delta ~= 0 then
      redis.call('HINCRBY', totals_key, r, string.format('%d', sign * delta))
    end
  end
end

local function count_in(totals_key, raw_body, sign)
  count_body(totals_key, cjson.decode(raw_body), sign)
end

-- drop expired reservations of one cluster and their totals
local function purge(res_key, exp_key, totals_key)
  local expired = redis.call('ZRANGEBYSCORE', exp_key, '-inf', now_s)
  for _, rid in ipairs(expired) do
    local raw = redis.call('HGET', res_key, rid)
    if raw then count_in(totals_key, raw, -1) end
    redis.call('HDEL', res_key, rid)
  end
  if #expired > 0 then redis.call('ZREMRANGEBYSCORE', exp_key, '-inf', now_s) end
end
"""

_CLAIM = (
    _LUA_COMMON
    + """
-- One decision's claims, all or nothing. ARGV: prefix, ttl, check ('1': refuse what
-- does not fit; '0': put back as given, for undoing), then the claims as one JSON
-- array: [shapes, claims, releases], where shapes lists each distinct reservation
-- once as [body JSON, shape signature], claims is flat (cluster, id, shape index
-- from 0) triples and releases flat (cluster, id) pairs. (One argument instead of
-- four per claim: a copy object claims on every cluster, and the client packed
-- hundreds of arguments, the server decoded one body per claim.)
-- Returns the clusters that refused (nothing changed then); empty: all applied.
local prefix = ARGV[1]
local ttl = tonumber(ARGV[2])
local check = ARGV[3] == '1'
local call = cjson.decode(ARGV[4])
local shapes = {}
for s, given in ipairs(call[1]) do
  local body = cjson.decode(given[1])
  with_pod(body.requests)
  shapes[s - 1] = {raw = given[1], body = body, sig = given[2]}
end
local claims = {}
local flat = call[2]
for j = 1, #flat, 3 do
  claims[#claims + 1] = {cluster = flat[j], id = flat[j + 1], shape = shapes[flat[j + 2]]}
end
local releases = {}
flat = call[3]
for j = 1, #flat, 2 do
  releases[#releases + 1] = {flat[j], flat[j + 1]}
end

local UNBOUNDED = 2147483647
-- how many whole shapes fit into free
local function count(shape, free)
  local best = UNBOUNDED
  for r, amount in pairs(shape) do
    if amount > 0 then
      local have = free[r] or 0
      if have < 0 then have = 0 end
      local k = math.floor(have / amount)
      if k < best then best = k end
    end
  end
  return best
end

-- per cluster: its keys and its headroom, read once per call
local clusters = {}
local function cluster(name)
  local c = clusters[name]
  if c then return c end
  c = {res = prefix .. 'reservations:' .. name, exp = prefix .. 'expiry:' .. name,
       tot = prefix .. 'reserved:' .. name, fits = prefix .. 'nodefit:' .. name}
  purge(c.res, c.exp, c.tot)
  local raw = redis.call('GET', prefix .. 'available:' .. name)
  if not raw then
    -- a record written before the available key existed: read it whole once
    local record = redis.call('GET', prefix .. 'cluster:' .. name)
    if record then raw = cjson.encode(cjson.decode(record).available) end
  end
  if raw then
    c.headroom = cjson.decode(raw)
    local totals = redis.call('HGETALL', c.tot)
    for j = 1, #totals, 2 do
      c.headroom[totals[j]] = (c.headroom[totals[j]] or 0) - tonumber(totals[j + 1])
    end
  end
  clusters[name] = c
  return c
end

-- replicas of a shape the nodes hold, ignoring reservations: fixed until the record
-- is replaced (put clears the memo), so computed once per record and shape
local function on_nodes(c, name, shape, sig)
  local cached = redis.call('HGET', c.fits, sig)
  if cached then return tonumber(cached) end
  local fit = UNBOUNDED
  local record = redis.call('GET', prefix .. 'cluster:' .. name)
  if record then
    local nodes = cjson.decode(record).nodes
    if #nodes > 0 then
      fit = 0
      for _, node in ipairs(nodes) do fit = fit + count(shape, node.free) end
    end
  end
  redis.call('HSET', c.fits, sig, fit)
  return fit
end

local refused = {}
for _, claim in ipairs(claims) do
  local c = cluster(claim.cluster)
  claim.previous = redis.call('HGET', c.res, claim.id)
  local body = claim.shape.body
  local shape = body.requests
  if check and c.headroom == nil then
    refused[claim.cluster] = true
  elseif c.headroom ~= nil then
    if claim.previous then  -- re-claiming an id replaces it: its own claim is not in the way
      local old = cjson.decode(claim.previous)
      for r, amount in pairs(with_pod(old.requests)) do
        c.headroom[r] = (c.headroom[r] or 0) + amount * old.replicas
      end
    end
    if check and body.replicas > 0 then
      local fit = count(shape, c.headroom)
      local nodes = on_nodes(c, claim.cluster, shape, claim.shape.sig)
      if nodes < fit then fit = nodes end
      if fit < body.replicas then refused[claim.cluster] = true end
    end
    for r, amount in pairs(shape) do
      c.headroom[r] = (c.headroom[r] or 0) - amount * body.replicas
    end
  end
end
local out = {}
for name, _ in pairs(refused) do out[#out + 1] = name end
if #out > 0 then return out end

for _, claim in ipairs(claims) do
  local c = clusters[claim.cluster]
  if claim.previous then count_in(c.tot, claim.previous, -1) end
  count_body(c.tot, claim.shape.body, 1)
  redis.call('HSET', c.res, claim.id, claim.shape.raw)
  redis.call('ZADD', c.exp, string.format('%.6f', now + ttl), claim.id)
end
for _, release in ipairs(releases) do
  local res, exp = prefix .. 'reservations:' .. release[1], prefix .. 'expiry:' .. release[1]
  local raw = redis.call('HGET', res, release[2])
  if raw then count_in(prefix .. 'reserved:' .. release[1], raw, -1) end
  redis.call('HDEL', res, release[2])
  redis.call('ZREM', exp, release[2])
end
return out
"""
)

_RELEASE = (
    _LUA_COMMON
    + """
-- KEYS: reservations hash, expiry zset, totals hash. ARGV: id.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then count_in(KEYS[3], raw, -1) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""
)

_SNAPSHOT = (
    _LUA_COMMON
    + """
-- KEYS: the cluster index set. ARGV: prefix, the number of known stamps, that many
-- (name, stamp) pairs the reader already holds the record of, then cluster names
-- (none = every cluster).
-- The per-cluster keys are derived here, which is why the cache needs a standalone
-- (or Sentinel) Redis rather than Redis Cluster: one snapshot must read them all atomically.
local prefix = ARGV[1]
local known = {}
local i = 3
for _ = 1, tonumber(ARGV[2]) do
  known[ARGV[i]] = ARGV[i + 1]
  i = i + 2
end
local names = {}
if #ARGV >= i then
  for j = i, #ARGV do names[#names + 1] = ARGV[j] end
else
  names = redis.call('SMEMBERS', KEYS[1])
end
-- Per cluster: name, live totals as a flat list, stamp (false: none), and the record
-- JSON (false when the reader holds the record of that stamp).
local out = {t[1], t[2]}
for _, name in ipairs(names) do
  local record_key = prefix .. 'cluster:' .. name
  if redis.call('EXISTS', record_key) == 1 then
    local totals_key = prefix .. 'reserved:' .. name
    purge(prefix .. 'reservations:' .. name, prefix .. 'expiry:' .. name, totals_key)
    local stamp = redis.call('GET', prefix .. 'stamp:' .. name)
    local raw = false
    if not stamp or known[name] ~= stamp then raw = redis.call('GET', record_key) end
    out[#out + 1] = {name, redis.call('HGETALL', totals_key), stamp, raw}
  end
end
return out
"""
)

_LIST = (
    _LUA_COMMON
    + """
-- KEYS: reservations hash, expiry zset, totals hash. Live reservations by expiry.
purge(KEYS[1], KEYS[2], KEYS[3])
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now_s, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local body = redis.call('HGET', KEYS[1], live[i])
  if body then out[#out + 1] = {live[i], body, live[i + 1]} end
end
return out
"""
)

DEFAULT_PREFIX = config.DEFAULT_CAPACITY_PREFIX


@contextlib.contextmanager
def _unavailable(operation: str) -> Iterator[None]:
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, TimeoutError) as exc:
        raise Unavailable(f"capacity cache: {operation} failed: {exc}") from exc


class RedisCapacityCache:
    """The `CapacityCache` on Redis: one script call per snapshot and per reservation.

    Redis failures surface as `Unavailable` (a `TemporaryError`), so the bus retries
    the event later. A retried `reserve` is harmless: the same id replaces itself.
    """

    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._queued: list[tuple[list[str | int], asyncio.Future[list[bytes | str]]]] = []
        """Claims waiting for the pipeline in flight to return (see `claim`)."""
        self._sender: asyncio.Task[None] | None = None
        self.claim_round_trips = 0
        """Pipelines of claims sent (for tests and benchmarks)."""
        self._parsed: dict[str, tuple[str, ClusterCapacity]] = {}
        """Cluster → the stamp and the record last read (what a snapshot need not send)."""
        self.records_read = 0
        """Record bodies snapshots have carried (for tests and benchmarks)."""
        self._release = client.register_script(_RELEASE)
        self._snapshot = client.register_script(_SNAPSHOT)
        self._list = client.register_script(_LIST)

    @classmethod
    def from_url(
        cls, url: str | SecretStr, *, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0
    ) -> RedisCapacityCache:
        """A cache with its own connection pool; close it with `aclose` (or ``async with``).

        Retries are few and short: a dead Redis should become `Unavailable` (and a
        nak with backoff on the bus) within a second, not after redis-py's default
        ten attempts.
        """
        raw_url = url.get_secret_value() if isinstance(url, SecretStr) else url
        client = Redis.from_url(
            raw_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            decode_responses=False,
        )
        return cls(client, prefix=prefix)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> RedisCapacityCache:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _key(self, kind: str, cluster: str) -> str:
        return f"{self._prefix}{kind}:{cluster}"

    async def put(self, record: ClusterCapacity) -> None:
        body = record.model_dump_json(exclude={"reserved"})
        stamp = hashlib.blake2b(body.encode(), digest_size=12).hexdigest()
        with _unavailable(f"put {record.cluster}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self._key("cluster", record.cluster), body)
                pipe.set(self._key("stamp", record.cluster), stamp)
                pipe.set(
                    self._key("available", record.cluster),
                    json.dumps(record.available, separators=(",", ":")),
                )
                pipe.delete(self._key("nodefit", record.cluster))
                pipe.sadd(f"{self._prefix}clusters", record.cluster)
                await pipe.execute()

    async def remove(self, cluster: str) -> None:
        self._parsed.pop(cluster, None)
        with _unavailable(f"remove {cluster}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(
                    self._key("cluster", cluster),
                    self._key("available", cluster),
                    self._key("stamp", cluster),
                    self._key("nodefit", cluster),
                    self._key("reservations", cluster),
                    self._key("expiry", cluster),
                    self._key("reserved", cluster),
                )
                pipe.srem(f"{self._prefix}clusters", cluster)
                await pipe.execute()

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        names = [] if clusters is None else list(clusters)
        if clusters is not None and not names:
            with _unavailable("snapshot"):
                seconds, micros = await self._client.time()
            return Snapshot(clusters={}, taken_at=seconds + micros / 1e6)
        reply = await self._read_snapshot(names, known=True)
        missing = [
            _text(entry[0])
            for entry in reply[2:]
            if entry[3] is None and _text(entry[0]) not in self._parsed
        ]
        if missing:  # forgotten meanwhile (a concurrent `remove`): read those in full
            reply = reply[:2] + [e for e in reply[2:] if _text(e[0]) not in missing]
            reply += (await self._read_snapshot(missing, known=False))[2:]
        records = {}
        for raw_name, flat, raw_stamp, raw in reply[2:]:
            name = _text(raw_name)
            if raw is None:
                record = self._parsed[name][1]
            else:
                self.records_read += 1
                record = ClusterCapacity.model_validate_json(raw)
                if raw_stamp is None:
                    self._parsed.pop(name, None)
                else:
                    self._parsed[name] = (_text(raw_stamp), record)
            reserved: Requests = {}
            for resource, amount in zip(flat[::2], flat[1::2], strict=True):
                if int(amount):
                    reserved[_text(resource)] = int(amount)
            records[record.cluster] = record.model_copy(update={"reserved": reserved})
        return Snapshot(clusters=records, taken_at=int(reply[0]) + int(reply[1]) / 1e6)

    async def _read_snapshot(self, names: list[str], *, known: bool) -> list[Any]:
        """One snapshot script call; with `known`, records this cache holds under the
        same stamp come back as None (a record is rewritten only when its cluster
        reports; between reports the same bytes would come back and be parsed again)."""
        held = [(n, stamp) for n, (stamp, _) in self._parsed.items()] if known else []
        args: list[str | int] = [self._prefix, len(held)]
        for name, stamp in held:
            args.extend([name, stamp])
        with _unavailable("snapshot"):
            reply: list[Any] = await self._snapshot(
                keys=[f"{self._prefix}clusters"], args=[*args, *names]
            )
        return reply

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        return not await self.claim([Claim(cluster, reservation_id, per_replica, replicas)], ttl)

    async def claim(
        self,
        claims: Sequence[Claim],
        ttl: float,
        *,
        releases: Sequence[tuple[str, str]] = (),
        check: bool = True,
    ) -> set[str]:
        # Checked and encoded once per shape: a copy object claims the same requests
        # (one shared mapping) on every cluster of the fleet. The claims go as one
        # JSON argument (see `_CLAIM`), each shape listed once.
        index: dict[tuple[int, int], int] = {}
        shapes: list[tuple[str, str]] = []
        flat: list[str | int] = []
        for one in claims:
            slot = (id(one.per_replica), one.replicas)
            at = index.get(slot)
            if at is None:
                validate_reservation(one.per_replica, one.replicas, ttl)
                requests = json.dumps(dict(one.per_replica), separators=(",", ":"), sort_keys=True)
                at = index[slot] = len(shapes)
                shapes.append((f'{{"requests":{requests},"replicas":{one.replicas}}}', requests))
            flat += (one.cluster, one.reservation_id, at)
        payload = json.dumps(
            [shapes, flat, [part for release in releases for part in release]],
            separators=(",", ":"),
        )
        args: list[str | int] = [self._prefix, repr(float(ttl)), "1" if check else "0", payload]
        future: asyncio.Future[list[bytes | str]] = asyncio.get_running_loop().create_future()
        self._queued.append((args, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_claims())
        try:
            refused = await future
        except (RedisConnectionError, RedisTimeoutError, TimeoutError):
            # Named only on failure: a copy object's claim names every cluster.
            where = ", ".join(sorted({one.cluster for one in claims} | {c for c, _ in releases}))
            with _unavailable(f"claim on {where}"):
                raise
        return {_text(name) for name in refused}

    async def _send_claims(self) -> None:
        """Send the queued claims, one pipeline at a time, until none are left."""
        batch: list[tuple[list[str | int], asyncio.Future[list[bytes | str]]]] = []
        try:
            while self._queued:
                # A caller that gave up before its claim was sent never claims.
                batch = [(args, f) for args, f in self._queued if not f.done()]
                self._queued = []
                if not batch:
                    continue
                try:
                    replies = await self._pipelined([args for args, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), reply in zip(batch, replies, strict=True):
                    if future.done():
                        continue
                    if isinstance(reply, BaseException):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
                batch = []
        except BaseException as exc:
            # Cancelled (the client closing): nobody may wait for ever.
            for _, future in batch + self._queued:
                if not future.done():
                    future.set_exception(RedisConnectionError(f"claim not sent: {exc!r}"))
            self._queued = []
            raise
        finally:
            self._sender = None

    async def _pipelined(self, calls: list[list[str | int]]) -> list[Any]:
        """One claim script call per args in one pipeline; each reply or its error. A
        Redis that forgot the script (restarted) gets it again, and the calls it
        refused for that are sent once more (they did not run)."""
        key = f"{self._prefix}clusters"
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            self.claim_round_trips += 1
            async with self._client.pipeline(transaction=False) as pipe:
                for i in todo:
                    pipe.evalsha(self._claim.sha, 1, key, *calls[i])
                answers = await pipe.execute(raise_on_error=False)
            for i, answer in zip(todo, answers, strict=True):
                replies[i] = answer
            todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
            if not todo or attempt:
                break
            await self._client.script_load(_CLAIM)
        return replies

    def _held_keys(self, cluster: str) -> list[str]:
        return [
            self._key("reservations", cluster),
            self._key("expiry", cluster),
            self._key("reserved", cluster),
        ]

    async def release(self, cluster: str, reservation_id: str) -> None:
        with _unavailable(f"release on {cluster}"):
            await self._release(keys=self._held_keys(cluster), args=[reservation_id])

    async def reservations(self, cluster: str) -> list[Reservation]:
        with _unavailable(f"reservations on {cluster}"):
            live = await self._list(keys=self._held_keys(cluster))
        found = []
        for rid, raw, expires_at in live:
            body = json.loads(raw)
            found.append(
                Reservation(
                    id=_text(rid),
                    cluster=cluster,
                    requests=body["requests"],
                    replicas=body["replicas"],
                    expires_at=float(expires_at),
                )
            )
        return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
