"""The cluster capacity cache: what is free on every member cluster, and who has claimed it.

The syncer writes one `ClusterCapacity` record per member cluster (from its node and
pod watches); the scheduler takes one `Snapshot` of all of them per decision and,
before publishing a placement, `reserve`s the capacity it is about to use so that
two scheduler replicas deciding at the same moment cannot both spend the same free
CPU. Reservations expire on their own (the syncer's next record will include the
pods once they are bound), so a scheduler that dies mid-decision leaks nothing.

The module has two halves:

* **Pure models** (`NodeCapacity`, `Reservation`, `ClusterCapacity`, `Snapshot`,
  `fit_replicas`) — no I/O; the scheduler core imports only these.
* **Adapters** behind the `CapacityCache` protocol: `RedisCapacityCache` (the real
  one, on ``redis.asyncio``) and `FakeCapacityCache` (in memory, same semantics,
  for unit tests of other services).

Units: every amount is an integer — CPU in millicores, everything else in base
units (see `flotilla.common.quantity.to_units`). ``"pods"`` counts pods: every
replica uses one pod slot unless its shape says otherwise, so a node or cluster
must report ``pods`` to host anything (as every kubelet does).

Fit rule (shared by `ClusterCapacity.fit_replicas`, the Redis reserve script and
the fake): replicas fit node by node — ``sum over nodes of min_r floor(free[r] /
per_replica[r])``, so fragmentation is respected — then that count is capped by
the cluster level ``(available - reserved) / per_replica`` so live reservations
count. Reservations are not attributed to nodes (the scheduler does not pick
nodes; the member's kube-scheduler does), so only the cluster-level cap sees them.
A record without a node breakdown is judged at the cluster level alone.

The Redis side is two small Lua scripts rather than a library: nothing maintained
offers an atomic "check several resource amounts against a record minus live,
expiring claims, then claim" on Redis. Its costs and limits: `reserve` is linear
in the cluster's nodes and live reservations (it re-reads both; fine for the tens
of in-flight decisions a cluster sees); `snapshot` derives key names inside the
script, so it needs a standalone or Sentinel Redis, not Redis Cluster; amounts must
stay below 2**53 (Lua numbers are doubles).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from flotilla.common.errors import Unavailable
from flotilla.common.events import Requests

PODS = "pods"
"""The pod-slot resource; every replica uses one unless its shape says otherwise."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeCapacity(_Model):
    """One member node: what it offers and what is still free on it."""

    name: str
    allocatable: Requests
    free: Requests = Field(description="allocatable minus requests of the pods bound here")


class Reservation(_Model):
    """Capacity a scheduler claimed on a cluster until `expires_at` (epoch seconds)."""

    id: str
    cluster: str
    requests: Requests = Field(description="per replica")
    replicas: int = Field(ge=0)
    expires_at: float

    @property
    def total(self) -> Requests:
        """What the whole reservation holds, pod slots included."""
        return scale(pod_shape(self.requests), self.replicas)


class ClusterCapacity(_Model):
    """The capacity record of one member cluster at `observed_at` (epoch seconds).

    `reserved` is the sum of the live reservations (pod slots included) when the
    record comes out of a snapshot; whatever a writer puts there is ignored, since
    reservations live beside the record, not in it.
    """

    cluster: str
    allocatable: Requests
    available: Requests
    nodes: list[NodeCapacity] = Field(default_factory=list)
    reserved: Requests = Field(default_factory=dict)
    observed_at: float

    @property
    def headroom(self) -> Requests:
        """Cluster-level room left once live reservations are taken off `available`."""
        return {r: amount - self.reserved.get(r, 0) for r, amount in self.available.items()}

    def fit_replicas(self, per_replica: Requests) -> int:
        """How many more pods of this shape fit here (see the module docstring)."""
        return fit_replicas(
            per_replica,
            headroom=self.headroom,
            node_free=[node.free for node in self.nodes],
        )


class Snapshot(_Model):
    """Every cluster's capacity as read in one round trip at `taken_at`."""

    clusters: dict[str, ClusterCapacity]
    taken_at: float

    def get(self, cluster: str) -> ClusterCapacity | None:
        return self.clusters.get(cluster)


def pod_shape(per_replica: Mapping[str, int]) -> Requests:
    """The shape one replica really uses: its requests plus one pod slot."""
    for resource, amount in per_replica.items():
        if amount < 0:
            raise ValueError(f"negative request {resource}={amount}")
    shape = dict(per_replica)
    shape.setdefault(PODS, 1)
    return shape


def scale(requests: Mapping[str, int], factor: int) -> Requests:
    return {resource: amount * factor for resource, amount in requests.items()}


def add(*many: Mapping[str, int]) -> Requests:
    total: Requests = {}
    for requests in many:
        for resource, amount in requests.items():
            total[resource] = total.get(resource, 0) + amount
    return total


UNBOUNDED = 2**31 - 1
"""The fit of a shape that requests nothing, not even a pod slot (an explicit pods=0)."""


def _count(free: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """How many whole `shape`s fit into `free`; resources missing from `free` are 0."""
    counts = [max(free.get(r, 0), 0) // amount for r, amount in shape.items() if amount > 0]
    return min(counts, default=UNBOUNDED)


def fit_replicas(
    per_replica: Mapping[str, int],
    *,
    headroom: Mapping[str, int],
    node_free: Iterable[Mapping[str, int]] = (),
) -> int:
    """The fit rule on plain mappings; `ClusterCapacity.fit_replicas` and the fake use it."""
    shape = pod_shape(per_replica)
    cluster_level = _count(headroom, shape)
    nodes = list(node_free)
    if not nodes:
        return cluster_level
    return min(sum(_count(free, shape) for free in nodes), cluster_level)


# --------------------------------------------------------------------------- adapters


class CapacityCache(Protocol):
    """Where capacity records and reservations live; the scheduler and syncer see only this."""

    async def put(self, record: ClusterCapacity) -> None:
        """Store a cluster's record (its `reserved` is ignored); reservations are kept."""

    async def remove(self, cluster: str) -> None:
        """Forget a cluster: its record and every reservation on it."""

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        """Every (or the named) cluster's record with its live reservations summed in."""

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        """Atomically claim room for `replicas` pods of `per_replica` for `ttl` seconds.

        False (and nothing changed) when they do not fit or the cluster is unknown.
        Reserving an id that is already held replaces it, so retries are harmless.
        """

    async def release(self, cluster: str, reservation_id: str) -> None:
        """Drop one reservation; releasing an unknown id is not an error."""

    async def reservations(self, cluster: str) -> list[Reservation]:
        """The live reservations on one cluster, oldest expiry first."""


class FakeCapacityCache:
    """In-memory `CapacityCache` with the Redis one's semantics, for other services' tests.

    `clock` stands in for Redis `TIME` so a test can expire reservations by moving it;
    set `unavailable = True` to make every call raise `Unavailable`, as a dead Redis does.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.unavailable = False
        self._records: dict[str, ClusterCapacity] = {}
        self._reservations: dict[str, dict[str, Reservation]] = {}

    def _check(self) -> None:
        if self.unavailable:
            raise Unavailable("capacity cache unavailable (FakeCapacityCache.unavailable)")

    def _live(self, cluster: str, now: float) -> dict[str, Reservation]:
        held = self._reservations.setdefault(cluster, {})
        for rid in [rid for rid, r in held.items() if r.expires_at <= now]:
            del held[rid]
        return held

    async def put(self, record: ClusterCapacity) -> None:
        self._check()
        self._records[record.cluster] = record.model_copy(update={"reserved": {}})

    async def remove(self, cluster: str) -> None:
        self._check()
        self._records.pop(cluster, None)
        self._reservations.pop(cluster, None)

    async def snapshot(self, clusters: Iterable[str] | None = None) -> Snapshot:
        self._check()
        now = self.clock()
        names = list(self._records) if clusters is None else list(clusters)
        out: dict[str, ClusterCapacity] = {}
        for name in names:
            record = self._records.get(name)
            if record is not None:
                held = self._live(name, now).values()
                reserved = add(*(r.total for r in held))
                out[name] = record.model_copy(update={"reserved": reserved})
        return Snapshot(clusters=out, taken_at=now)

    async def reserve(
        self,
        cluster: str,
        reservation_id: str,
        per_replica: Requests,
        replicas: int,
        ttl: float,
    ) -> bool:
        self._check()
        _validate_reservation(per_replica, replicas, ttl)
        now = self.clock()
        record = self._records.get(cluster)
        if record is None:
            return False
        held = self._live(cluster, now)
        others = add(*(r.total for rid, r in held.items() if rid != reservation_id))
        headroom = {r: amount - others.get(r, 0) for r, amount in record.available.items()}
        fit = fit_replicas(per_replica, headroom=headroom, node_free=[n.free for n in record.nodes])
        if replicas > 0 and fit < replicas:
            return False
        held[reservation_id] = Reservation(
            id=reservation_id,
            cluster=cluster,
            requests=dict(per_replica),
            replicas=replicas,
            expires_at=now + ttl,
        )
        return True

    async def release(self, cluster: str, reservation_id: str) -> None:
        self._check()
        self._reservations.get(cluster, {}).pop(reservation_id, None)

    async def reservations(self, cluster: str) -> list[Reservation]:
        self._check()
        return sorted(self._live(cluster, self.clock()).values(), key=lambda r: r.expires_at)


def _validate_reservation(per_replica: Mapping[str, int], replicas: int, ttl: float) -> None:
    pod_shape(per_replica)
    if replicas < 0:
        raise ValueError(f"replicas must not be negative, got {replicas}")
    if not (ttl > 0 and math.isfinite(ttl)):
        raise ValueError(f"ttl must be positive and finite, got {ttl}")


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
        _validate_reservation(per_replica, replicas, ttl)
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


__all__ = [
    "DEFAULT_PREFIX",
    "PODS",
    "UNBOUNDED",
    "CapacityCache",
    "ClusterCapacity",
    "FakeCapacityCache",
    "NodeCapacity",
    "RedisCapacityCache",
    "Requests",
    "Reservation",
    "Snapshot",
    "add",
    "fit_replicas",
    "pod_shape",
    "scale",
]
