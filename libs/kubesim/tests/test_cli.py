"""`flotilla-kubesim` as separate processes: hub + three members, READY lines, clean exit."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config

from flotilla.kubesim import __main__ as cli

pytestmark = pytest.mark.integration

COMMAND = str(Path(sys.executable).with_name("flotilla-kubesim"))


async def launch(
    name: str, kubeconfig: Path, *extra: str
) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        COMMAND,
        "--name",
        name,
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--token",
        f"token-{name}",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    assert line.startswith(b"READY https://127.0.0.1:"), line
    # The contract: the kubeconfig exists before READY is printed.
    assert await asyncio.to_thread(kubeconfig.exists)
    return process, line.decode().split()[1]


async def test_hub_and_three_members_as_processes(tmp_path: Path) -> None:
    specs = {
        "hub": ("--hub",),
        "us-east": ("--nodes", "2", "--node-labels", "topology.kubernetes.io/zone=us-east-1a"),
        "eu-west": ("--nodes", "1", "--node-cpu", "4", "--node-gpus", "2"),
        "ap-south": ("--nodes", "3", "--pod-ready-seconds", "0.1"),
    }
    launched = await asyncio.gather(
        *(launch(name, tmp_path / f"{name}.yaml", *extra) for name, extra in specs.items())
    )
    processes = dict(zip(specs, launched, strict=True))
    try:
        for name, (_, url) in processes.items():
            kubeconfig = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
            assert kubeconfig["current-context"] == name
            assert kubeconfig["clusters"][0]["cluster"]["server"] == url
            assert kubeconfig["users"][0]["user"]["token"] == f"token-{name}"
            api = await config.new_client_from_config(config_file=str(tmp_path / f"{name}.yaml"))
            try:
                nodes = (await k8s.CoreV1Api(api).list_node()).items
                expected = {"hub": 0, "us-east": 2, "eu-west": 1, "ap-south": 3}[name]
                assert len(nodes) == expected
                if name == "us-east":
                    assert nodes[0].metadata.labels["topology.kubernetes.io/zone"] == "us-east-1a"
                if name == "eu-west":
                    assert nodes[0].status.allocatable["nvidia.com/gpu"] == "2"
                    assert nodes[0].status.allocatable["cpu"] == "4"
            finally:
                await api.close()
    finally:
        for name, (process, _) in processes.items():
            process.send_signal(signal.SIGINT if name == "hub" else signal.SIGTERM)
        codes = await asyncio.gather(
            *(asyncio.wait_for(p.wait(), 15) for p, _ in processes.values())
        )
    assert codes == [0, 0, 0, 0]


def test_arguments_follow_the_contract() -> None:
    args = cli.parse_args(
        [
            "--name",
            "x",
            "--port",
            "0",
            "--kubeconfig",
            "kubeconfig.yaml",
            "--node-labels",
            "a=b,c=d",
            "--node-memory",
            "16Gi",
            "--watch-window",
            "10",
        ]
    )
    assert args.node_labels == {"a": "b", "c": "d"}
    kubesim = cli.build(args)
    assert kubesim.store.watch_window == 10
    assert not kubesim.hub
    with pytest.raises(SystemExit):
        cli.parse_args(["--name", "x", "--port", "0", "--kubeconfig", "k", "--node-labels", "bad"])


async def test_port_in_use_exits_nonzero_without_ready(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            COMMAND,
            "--name",
            "clash",
            "--port",
            str(port),
            "--kubeconfig",
            str(tmp_path / "clash.yaml"),
            "--hub",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    assert b"READY" not in stdout
    assert b"failed to start" in stderr
    assert not await asyncio.to_thread((tmp_path / "clash.yaml").exists)
