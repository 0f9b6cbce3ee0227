"""The capacity cache on Redis: the real adapter behind `capacity.CapacityCache`.

See `flotilla.common.capacity` for the models and the fit rule this shares with the
fake. The Redis side is two small Lua scripts rather than a library: nothing
maintained offers an atomic "check several resource amounts against a record minus
live, expiring claims, then claim" on Redis.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator

from pydantic import SecretStr
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from flotilla.common.capacity import (
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
#   <prefix>reservations:<name>    hash  id -> {"requests": {...}, "replicas": n}
#   <prefix>expiry:<name>          zset  id -> expires_at (Redis server time, epoch seconds)
#   <prefix>reserved:<name>        hash  resource -> total units of the live reservations
# The totals are kept by the scripts on every reserve, release and expiry, so a
# snapshot and a reserve cost O(resources) per cluster, not O(live reservations).
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
local function count_in(totals_key, raw_body, sign)
  local body = cjson.decode(raw_body)
  for r, amount in pairs(with_pod(body.requests)) do
    local delta = amount * body.replicas
    if delta ~= 0 then
      redis.call('HINCRBY', totals_key, r, string.format('%d', sign * delta))
    end
  end
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

_RESERVE = (
    _LUA_COMMON
    + """
-- KEYS: record, reservations hash, expiry zset, totals hash. ARGV: id, body JSON, ttl.
purge(KEYS[2], KEYS[3], KEYS[4])
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local record = cjson.decode(raw)
local body = cjson.decode(ARGV[2])
local shape = with_pod(body.requests)

local headroom = {}
for r, amount in pairs(record.available) do headroom[r] = amount end
local totals = redis.call('HGETALL', KEYS[4])
for i = 1, #totals, 2 do
  headroom[totals[i]] = (headroom[totals[i]] or 0) - tonumber(totals[i + 1])
end
local previous = redis.call('HGET', KEYS[2], ARGV[1])
if previous then  -- re-reserving an id replaces it: its own claim is not in the way
  local old = cjson.decode(previous)
  for r, amount in pairs(with_pod(old.requests)) do
    headroom[r] = (headroom[r] or 0) + amount * old.replicas
  end
end

-- how many whole shapes fit into free; nil when the shape requests nothing
local function count(free)
  local best = nil
  for r, amount in pairs(shape) do
    if amount > 0 then
      local have = free[r] or 0
      if have < 0 then have = 0 end
      local n = math.floor(have / amount)
      if best == nil or n < best then best = n end
    end
  end
  return best
end

if body.replicas > 0 then
  local fit = count(headroom)
  if fit ~= nil and #record.nodes > 0 then
    local on_nodes = 0
    for _, node in ipairs(record.nodes) do on_nodes = on_nodes + count(node.free) end
    if on_nodes < fit then fit = on_nodes end
  end
  if fit ~= nil and fit < body.replicas then return 0 end
end
if previous then count_in(KEYS[4], previous, -1) end
count_in(KEYS[4], ARGV[2], 1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], string.format('%.6f', now + tonumber(ARGV[3])), ARGV[1])
return 1
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
-- KEYS: the cluster index set. ARGV: prefix, then cluster names (none = every cluster).
-- The per-cluster keys are derived here, which is why the cache needs a standalone
-- (or Sentinel) Redis rather than Redis Cluster: one snapshot must read them all atomically.
local prefix = ARGV[1]
local names = {}
if #ARGV > 1 then
  for i = 2, #ARGV do names[#names + 1] = ARGV[i] end
else
  names = redis.call('SMEMBERS', KEYS[1])
end
-- Per cluster: name, record JSON, and the live totals as a flat list.
local out = {t[1], t[2]}
for _, name in ipairs(names) do
  local raw = redis.call('GET', prefix .. 'cluster:' .. name)
  if raw then
    local totals_key = prefix .. 'reserved:' .. name
    purge(prefix .. 'reservations:' .. name, prefix .. 'expiry:' .. name, totals_key)
    out[#out + 1] = {name, raw, redis.call('HGETALL', totals_key)}
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

DEFAULT_PREFIX = "flotilla:capacity:"


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
        self._reserve = client.register_script(_RESERVE)
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
        with _unavailable(f"put {record.cluster}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self._key("cluster", record.cluster), body)
                pipe.sadd(f"{self._prefix}clusters", record.cluster)
                await pipe.execute()

    async def remove(self, cluster: str) -> None:
        with _unavailable(f"remove {cluster}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(
                    self._key("cluster", cluster),
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
        with _unavailable("snapshot"):
            reply = await self._snapshot(
                keys=[f"{self._prefix}clusters"], args=[self._prefix, *names]
            )
        records = {}
        for _name, raw, flat in reply[2:]:
            record = ClusterCapacity.model_validate_json(raw)
            reserved: Requests = {}
            for resource, amount in zip(flat[::2], flat[1::2], strict=True):
                if int(amount):
                    reserved[_text(resource)] = int(amount)
            records[record.cluster] = record.model_copy(update={"reserved": reserved})
        return Snapshot(clusters=records, taken_at=int(reply[0]) + int(reply[1]) / 1e6)

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        validate_reservation(per_replica, replicas, ttl)
        body = json.dumps(
            {"requests": dict(per_replica), "replicas": replicas}, separators=(",", ":")
        )
        with _unavailable(f"reserve on {cluster}"):
            done = await self._reserve(
                keys=[
                    self._key("cluster", cluster),
                    self._key("reservations", cluster),
                    self._key("expiry", cluster),
                    self._key("reserved", cluster),
                ],
                args=[reservation_id, body, repr(float(ttl))],
            )
        return bool(done)

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
