"""Throughput of the event bus wrapper vs plain nats-py, on a real nats-server.

Starts its own nats-server (JetStream, file storage) on a free port, then for each
side publishes N events (pipelined) and consumes them all (pull, batch fetch,
explicit ack), and prints one JSON object:

    .venv/bin/python bench/bus.py [--events 20000] [--keys 200]

"publish" is events/s until every publish is acknowledged; "consume" is events/s
from the first fetch until the last ack; "end_to_end" covers both. The
``*_cpu_us`` figures are this process's CPU time per event in each phase (the
NATS server's is not counted): steadier than rates on a shared machine. The wrapper does
more per message (envelope validation, trace spans, per-key ordering, leases), so
the ratio is the price of those guarantees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import nats
from nats.js import api

from flotilla.common import bus as busmod
from flotilla.common import events, middleware, telemetry
from flotilla.common.dispatch import Received
from flotilla.common.infra import NatsServer
from flotilla.common.router import Router
from flotilla.common.topology import Topology


def make_events(count: int, keys: int) -> list[events.Envelope]:
    batch = []
    for i in range(count):
        ref = events.ObjectRef(api_version="v1", kind="ConfigMap", name=f"k{i % keys}")
        payload = events.ResourceObserved(ref=ref, object={"data": {"seq": str(i)}})
        batch.append(events.envelope(payload, key=ref.key, producer="bench", revision=i))
    return batch


async def bench_wrapper(url: str, batch: list[events.Envelope]) -> dict[str, float]:
    topology = Topology(prefix="benchwrap", partitions=8, lease_ttl=3.0)
    bus = await busmod.Bus.connect(url, topology=topology, producer="bench")
    done = asyncio.Event()
    handled = 0

    router = Router("bench")

    @router.on(events.ResourceObserved)
    async def handler(event: Received[events.ResourceObserved]) -> None:
        nonlocal handled
        handled += 1
        if handled == len(batch):
            done.set()

    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(batch), 1000):
        await bus.publish_batch(batch[start : start + 1000])
    published, published_cpu = time.perf_counter(), time.process_time()
    consumer = busmod.Consumer(
        bus,
        router.spec,
        router.dispatch(middleware.standard("bench")),  # the chain every service runs
        instance="bench",
        concurrency=64,
        batch=256,
    )
    task = asyncio.create_task(consumer.run())
    consume_started, consume_cpu = time.perf_counter(), time.process_time()
    await asyncio.wait_for(done.wait(), 300)
    finished, finished_cpu = time.perf_counter(), time.process_time()
    await consumer.stop()
    await task
    await bus.close()
    return _figures(
        len(batch),
        (started, published, consume_started, finished),
        (cpu, published_cpu, consume_cpu, finished_cpu),
    )


def _figures(
    count: int, wall: tuple[float, float, float, float], cpu: tuple[float, float, float, float]
) -> dict[str, float]:
    started, published, consume_started, finished = wall
    return {
        "publish_per_s": count / (published - started),
        "consume_per_s": count / (finished - consume_started),
        "end_to_end_per_s": count / (finished - started),
        "publish_cpu_us": (cpu[1] - cpu[0]) / count * 1e6,
        "consume_cpu_us": (cpu[3] - cpu[2]) / count * 1e6,
    }


async def bench_plain(url: str, batch: list[events.Envelope]) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name="PLAIN", subjects=["plain.>"]))
    payloads = [(f"plain.{e.type}", events.encode(e), e.id) for e in batch]
    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(payloads), 1000):
        futures = [
            await js.publish_async(subject, data, headers={"Nats-Msg-Id": msg_id})
            for subject, data, msg_id in payloads[start : start + 1000]
        ]
        await asyncio.gather(*futures)
    published, published_cpu = time.perf_counter(), time.process_time()
    sub = await js.pull_subscribe("plain.>", durable="plain")
    received = 0
    consume_started, consume_cpu = time.perf_counter(), time.process_time()
    while received < len(batch):
        for msg in await sub.fetch(256, timeout=5):
            await msg.ack()
            received += 1
    finished, finished_cpu = time.perf_counter(), time.process_time()
    await nc.close()
    return _figures(
        len(batch),
        (started, published, consume_started, finished),
        (cpu, published_cpu, consume_cpu, finished_cpu),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--keys", type=int, default=200)
    args = parser.parse_args()
    batch = make_events(args.events, args.keys)
    telemetry.setup("bench")  # tracing as every service has it (no exporter: context only)
    with NatsServer() as server:
        plain = await bench_plain(server.url, batch)
        wrapper = await bench_wrapper(server.url, batch)
    result = {
        "events": args.events,
        "keys": args.keys,
        "plain_nats_py": {k: round(v) for k, v in plain.items()},
        "flotilla_bus": {k: round(v) for k, v in wrapper.items()},
        "wrapper_vs_plain_end_to_end": round(
            wrapper["end_to_end_per_s"] / plain["end_to_end_per_s"], 3
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
