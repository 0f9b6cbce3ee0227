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
from typing import Any, NamedTuple

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
    pod_shape,
    validate_reservation,
)
from flotilla.common.errors import Unavailable

# Redis layout, all under one prefix (default ``flotilla:capacity:``):
#   <prefix>clusters               set of cluster names (what snapshot() with no names reads)
#   <prefix>cluster:<name>         the record as compact JSON, `reserved` left out
#   <prefix>reservations:<name>    hash  id -> {"requests": {...}, "replicas": n}
#   <prefix>expiry:<name>          zset  id -> expires_at (Redis server time, epoch seconds)
# Amounts stay integers end to end: Lua only decodes and compares them (doubles are
# exact below 2**53, i.e. 8 PiB of memory), it never re-encodes them.

_LUA_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_s = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
"""

_RESERVE = (
    _LUA_NOW
    + """
-- KEYS: record, reservations hash, expiry zset. ARGV: id, body JSON, ttl seconds.
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_s)
for _, rid in ipairs(expired) do redis.call('HDEL', KEYS[2], rid) end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_s) end

local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local record = cjson.decode(raw)
local body = cjson.decode(ARGV[2])
local function with_pod(shape)
  if shape.pods == nil then shape.pods = 1 end
  return shape
end
local shape = with_pod(body.requests)

local headroom = {}
for r, amount in pairs(record.available) do headroom[r] = amount end
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  if held[i] ~= ARGV[1] then
    local other = cjson.decode(held[i + 1])
    for r, amount in pairs(with_pod(other.requests)) do
      headroom[r] = (headroom[r] or 0) - amount * other.replicas
    end
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
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], string.format('%.6f', now + tonumber(ARGV[3])), ARGV[1])
return 1
"""
)

_SNAPSHOT = (
    _LUA_NOW
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
-- Per cluster: name, record JSON, and its live reservations as three JSON arrays
-- (ids, bodies, expiries), built by concatenation so amounts are never re-encoded
-- and the client parses a few strings instead of thousands of nested replies.
local out = {t[1], t[2]}
for _, name in ipairs(names) do
  local raw = redis.call('GET', prefix .. 'cluster:' .. name)
  if raw then
    local live = redis.call(
      'ZRANGEBYSCORE', prefix .. 'expiry:' .. name, '(' .. now_s, '+inf', 'WITHSCORES')
    local ids, bodies, expiries = {}, {}, {}
    for i = 1, #live, 2 do
      local body = redis.call('HGET', prefix .. 'reservations:' .. name, live[i])
      if body then
        ids[#ids + 1] = cjson.encode(live[i])
        bodies[#bodies + 1] = body
        expiries[#expiries + 1] = live[i + 1]
      end
    end
    out[#out + 1] = {
      name, raw,
      '[' .. table.concat(ids, ',') .. ']',
      '[' .. table.concat(bodies, ',') .. ']',
      '[' .. table.concat(expiries, ',') .. ']',
    }
  end
end
return out
"""
)

DEFAULT_PREFIX = "flotilla:capacity:"


class _Held(NamedTuple):
    """One cluster's live reservations as the snapshot script returns them, by expiry."""

    ids: list[str]
    bodies: list[dict[str, Any]]
    expiries: list[float]


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
        self._snapshot = client.register_script(_SNAPSHOT)

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
                )
                pipe.srem(f"{self._prefix}clusters", cluster)
                await pipe.execute()

    async def _read(
        self, clusters: Iterable[str] | None
    ) -> tuple[float, list[tuple[ClusterCapacity, _Held]]]:
        names = [] if clusters is None else list(clusters)
        if clusters is not None and not names:
            with _unavailable("snapshot"):
                seconds, micros = await self._client.time()
            return seconds + micros / 1e6, []
        with _unavailable("snapshot"):
            reply = await self._snapshot(
                keys=[f"{self._prefix}clusters"], args=[self._prefix, *names]
            )
        taken_at = int(reply[0]) + int(reply[1]) / 1e6
        return taken_at, [
            (
                ClusterCapacity.model_validate_json(raw),
                _Held(json.loads(ids), json.loads(bodies), json.loads(expiries)),
            )
            for _name, raw, ids, bodies, expiries in reply[2:]
        ]

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        taken_at, read = await self._read(clusters)
        records = {}
        for record, held in read:
            reserved: Requests = {}
            for body in held.bodies:
                replicas = body["replicas"]
                for resource, amount in pod_shape(body["requests"]).items():
                    reserved[resource] = reserved.get(resource, 0) + amount * replicas
            records[record.cluster] = record.model_copy(update={"reserved": reserved})
        return Snapshot(clusters=records, taken_at=taken_at)

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
                ],
                args=[reservation_id, body, repr(float(ttl))],
            )
        return bool(done)

    async def release(self, cluster: str, reservation_id: str) -> None:
        with _unavailable(f"release on {cluster}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hdel(self._key("reservations", cluster), reservation_id)
                pipe.zrem(self._key("expiry", cluster), reservation_id)
                await pipe.execute()

    async def reservations(self, cluster: str) -> list[Reservation]:
        _, read = await self._read([cluster])
        return [
            Reservation(
                id=rid,
                cluster=cluster,
                requests=body["requests"],
                replicas=body["replicas"],
                expires_at=expires_at,
            )
            for _, held in read
            for rid, body, expires_at in zip(held.ids, held.bodies, held.expiries, strict=True)
        ]
