"""`flotilla-kubesim`: run one simulated cluster (or hub API server) as a process.

The contract other tools script against: the kubeconfig is written before the single
`READY <url>` line appears on stdout, and SIGTERM/SIGINT stop the server cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop

from flotilla.kubesim.server import KubeSim

log = logging.getLogger("flotilla.kubesim")


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected k=v,... but got {part!r}")
        labels[key.strip()] = value.strip()
    return labels


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla-kubesim",
        description="An in-process Kubernetes API server and KWOK-style cluster simulator.",
    )
    parser.add_argument("--name", required=True, help="cluster, context and user name")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument(
        "--hub", action="store_true", help="API server only: no nodes, no controllers"
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--node-cpu", default="8")
    parser.add_argument("--node-memory", default="32Gi")
    parser.add_argument("--node-pods", type=int, default=110)
    parser.add_argument("--node-gpus", type=int, default=0)
    parser.add_argument("--node-labels", type=_labels, default={}, help="k=v,... for every node")
    parser.add_argument("--pod-ready-seconds", type=float, default=1.0)
    parser.add_argument("--job-seconds", type=float, default=2.0)
    parser.add_argument("--token", default=None, help="bearer token (random when omitted)")
    parser.add_argument("--watch-window", type=int, default=1000, help="events kept per type")
    parser.add_argument(
        "--event-ttl",
        type=float,
        default=3600.0,
        help="seconds an Event lives after its last write",
    )
    parser.add_argument("--no-events", action="store_true", help="the simulator records no Events")
    parser.add_argument(
        "--insecure-http",
        action="store_true",
        help="serve plain http (debugging only: kubectl sends no token over http)",
    )
    parser.add_argument(
        "--tls-dir",
        default=None,
        help="keep the CA here and reuse it on restart (default: a new CA per start)",
    )
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> KubeSim:
    options = None
    if not args.hub:
        from flotilla.kubesim.sim import SimOptions

        options = SimOptions(
            nodes=args.nodes,
            node_cpu=args.node_cpu,
            node_memory=args.node_memory,
            node_pods=args.node_pods,
            node_gpus=args.node_gpus,
            node_labels=args.node_labels,
            pod_ready_seconds=args.pod_ready_seconds,
            job_seconds=args.job_seconds,
            record_events=not args.no_events,
        )
    return KubeSim(
        args.name,
        port=args.port,
        token=args.token,
        hub=args.hub,
        sim=options,
        watch_window=args.watch_window,
        host=args.host,
        event_ttl=args.event_ttl,
        tls=not args.insecure_http,
        tls_dir=args.tls_dir,
    )


async def run(args: argparse.Namespace) -> None:
    kubesim = build(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await kubesim.start()
    try:
        kubesim.write_kubeconfig(args.kubeconfig)
        sys.stdout.write(f"READY {kubesim.url}\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await kubesim.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        # uvloop: its TLS transport is compiled; asyncio's pure-Python one was a tenth
        # of a busy hub's CPU (the simulator shares the machine with what it serves).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(args))
    except OSError as exc:
        log.error("kubesim %s failed to start: %s", args.name, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
