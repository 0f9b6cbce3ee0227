"""Instructions the scheduler service process executes per decision, end to end.

Not a test: it prints one JSON document. Run with
``.venv/bin/python bench/scheduler_instructions.py [--clusters 10] [--objects 200:1200]``;
needs valgrind.

Timed figures on a shared 2-core machine drift by tens of per cent within minutes;
an instruction count does not. This runs `bench/scheduler.py`'s service run (real
NATS and Redis, one ``python -m flotilla.scheduler`` process, the service mix) twice,
with few and with more objects, the scheduler under ``valgrind --tool=cachegrind``,
and reports ``(Ir(more) - Ir(few)) / (more - few)``: start-up and shutdown cancel
out. Under valgrind the scheduler is some fifty times slower, so it always has a
full backlog (its batches are as large as they get); the figure is the CPU cost of
the code per decision, for comparing two versions, not a prediction of the rate.
User-space instructions only: the kernel's share of socket writes is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
from typing import Any

import scheduler as service_bench  # type: ignore[import-not-found]  # bench/scheduler.py

from flotilla.common.infra import NatsServer, RedisServer

STARTUP_WAIT = 900.0
"""Seconds the replica may take to start under valgrind."""


def _total(path: str) -> int:
    with open(path) as counts:
        for line in counts:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no summary line")


async def measure(clusters: int, few: int, more: int) -> dict[str, Any]:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("this benchmark needs valgrind")
    outputs = tempfile.mkdtemp(prefix="flotilla-cachegrind-")
    counted = []
    with NatsServer() as nats_server, RedisServer() as redis_server:
        for run, objects in enumerate((few, more), start=1):
            output = os.path.join(outputs, f"run{run}.cachegrind")
            result = await service_bench._service_run(
                nats_server.url,
                redis_server.url,
                objects,
                clusters,
                1,
                run,
                timeout=3600.0,
                wrapper=[
                    valgrind,
                    "--tool=cachegrind",
                    "--cache-sim=no",
                    f"--cachegrind-out-file={output}",
                ],
                startup_timeout=STARTUP_WAIT,
            )
            if not result["complete"]:
                raise RuntimeError(f"run of {objects} objects did not finish: {result}")
            counted.append({**result, "instructions": _total(output)})
    return {
        "clusters": clusters,
        "objects": [few, more],
        "instructions_per_decision": round(
            (counted[1]["instructions"] - counted[0]["instructions"]) / (more - few)
        ),
        "placed_share": min(c["placed_share"] for c in counted),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, action="append", help="fleet size(s)")
    parser.add_argument("--objects", default="200:1200", metavar="FEW:MORE")
    args = parser.parse_args()
    few, more = (int(n) for n in args.objects.split(":"))
    if not 0 < few < more:
        parser.error("--objects wants FEW:MORE with 0 < FEW < MORE")
    results = [asyncio.run(measure(size, few, more)) for size in args.clusters or [10, 100]]
    document = {
        "benchmark": "scheduler service: user-space instructions per decision (cachegrind)",
        "results": results,
    }
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
