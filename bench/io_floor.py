"""What one scheduling decision's I/O alone costs a Python process on this machine.

Not a test: it prints one JSON document. Run with ``.venv/bin/python bench/io_floor.py``
(``--objects 4000``, ``--runs 3``).

The scheduler service (`bench/scheduler.py --service`) does, per decision, besides
deciding: take a ``ResourceAnalyzed`` from a pull consumer, send its claim to Redis
(pipelined per batch), write the placement record to a KV bucket by compare-and-set,
publish ``PlacementDecided`` and acknowledge the event. This benchmark does exactly
that I/O with plain nats-py and redis-py and decides nothing: fetch 64 at a time,
then per message, concurrently: ``json.loads``, one pipelined Redis ``EVALSHA``
of a trivial script, ``KeyValue.create`` of a record the size the service writes,
``js.publish`` of an event the size the service publishes, ``msg.ack()``; and,
alternating with that, the same with both writes sent by ``publish_async`` (no
request/reply round per write: what pipelining the writes could save). The
payloads are the service mix's own (``make_service_object``, encoded as the bus
does).

``cpu_us_per_decision`` is this process's CPU time over the consuming phase, per
message: the floor under the service's CPU per decision, since no Python service
doing this I/O with these clients can spend less. ``decisions_per_s`` is the rate
it reaches; nats-server and Redis share the machine's cores with it, as in the
service runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import nats
import uvloop
from nats.js import api
from redis.asyncio import Redis
from scheduler import make_service_object  # type: ignore[import-not-found]  # bench/scheduler.py

from flotilla.common.events import encode, envelope
from flotilla.common.infra import NatsServer, RedisServer

BATCH = 64
RECORD_EXTRA = 1500
"""Bytes a placement record holds beyond its ``ResourceAnalyzed`` (the decided
event, its rejections grouped by reason): about what the service writes at 100
clusters."""


async def one_run(
    nats_url: str, redis_url: str, objects: int, run: int, *, pipelined: bool = False
) -> dict[str, Any]:
    rng = random.Random(11)
    bodies = [
        encode(envelope(a, key=a.ref.key, producer="bench", revision=1))
        for a in (make_service_object(i, rng) for i in range(objects))
    ]
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    name = f"floor{run}{'a' if pipelined else 'r'}"
    stream = name.upper()
    await js.add_stream(api.StreamConfig(name=stream, subjects=[f"{name}.>"]))
    kv = await js.create_key_value(api.KeyValueConfig(bucket=f"{name}-records"))
    redis = Redis.from_url(redis_url)
    script = redis.register_script("return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)")
    await redis.script_load(script.script)
    futures = [await js.publish_async(f"{name}.in.{i % 16}", body) for i, body in enumerate(bodies)]
    await asyncio.gather(*futures)
    sub = await js.pull_subscribe(f"{name}.in.>", durable="floor", stream=stream)
    extra = b"x" * RECORD_EXTRA
    handled = 0

    async def decide(msg: Any, claim: asyncio.Future[Any]) -> None:
        nonlocal handled
        event = json.loads(msg.data)
        key = event["key"].replace("/", ".")
        await claim
        if pipelined:
            # The same two writes without a request/reply each: one shared reply
            # subscription and a future per write (nats-py's publish_async).
            record = await js.publish_async(
                f"$KV.{name}-records.{key}",
                msg.data + extra,
                headers={"Nats-Expected-Last-Subject-Sequence": "0"},
            )
            await record
            await (await js.publish_async(f"{name}.out.{handled % 16}", msg.data))
        else:
            await kv.create(key, msg.data + extra)
            await js.publish(f"{name}.out.{handled % 16}", msg.data)
        await msg.ack()
        handled += 1

    started, cpu = time.perf_counter(), time.process_time()
    while handled < objects:
        msgs = await sub.fetch(BATCH, timeout=5)
        async with redis.pipeline(transaction=False) as pipe:
            for msg in msgs:
                pipe.evalsha(script.sha, 1, f"{name}", msg.metadata.sequence.stream)
            claims = asyncio.ensure_future(pipe.execute())
            await asyncio.gather(*(decide(msg, claims) for msg in msgs))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    await redis.aclose()
    await nc.close()
    return {
        "writes": "publish_async" if pipelined else "request/reply",
        "objects": objects,
        "decisions_per_s": round(objects / wall),
        "cpu_us_per_decision": round(cpu / objects * 1e6, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with NatsServer() as server, RedisServer() as cache:
        runs = [
            await one_run(server.url, cache.url, args.objects, run, pipelined=pipelined)
            for run in range(args.runs)
            for pipelined in (False, True)
        ]
    print(
        json.dumps(
            {
                "benchmark": (
                    "one decision's I/O with plain nats-py and redis-py, nothing decided "
                    "(fetch, claim, KV compare-and-set, publish, ack)"
                ),
                "runs": runs,
                "median": {
                    writes: {
                        "cpu_us_per_decision": statistics.median(
                            r["cpu_us_per_decision"] for r in runs if r["writes"] == writes
                        ),
                        "decisions_per_s": statistics.median(
                            r["decisions_per_s"] for r in runs if r["writes"] == writes
                        ),
                    }
                    for writes in ("request/reply", "publish_async")
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    uvloop.run(main())
