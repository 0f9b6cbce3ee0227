"""The ``flotilla`` command as a person uses it: every command a subprocess, one
embedded environment (``flotilla up``) for the whole module, its output checked.

The environment is real: nats-server, Redis, kubesim hub and members, and every
installed service as its own process. Parts that need services built elsewhere
(the drain coordinator for ``drain --wait``) run when those services are installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from flotilla.cli import commands, environment, stream
from flotilla.common.testing import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
WEB = "apps/v1/Deployment/default/web"
TRAINER = "apps/v1/Deployment/default/trainer"


def flotilla(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "flotilla.cli", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"flotilla {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def inprocess(state: Path, *args: str) -> Ran:
    """The same command without a new interpreter (for checks that poll or repeat:
    one cold start of the command costs seconds on a shared machine)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = commands.run_cli(["--state-dir", str(state), *args])
    return Ran(code, out.getvalue(), err.getvalue())


async def polled(state: Path, *args: str) -> Ran:
    return await asyncio.to_thread(inprocess, state, *args)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("flotilla-env")
    flotilla(directory, "up")
    try:
        yield directory
    finally:
        if environment.env_path(directory).exists():
            flotilla(directory, "down", check=False)


def test_up_records_the_environment_and_a_second_up_reports_it(state: Path) -> None:
    env = json.loads((state / "env.json").read_text())
    assert set(env) >= {"nats_url", "redis_url", "hub", "clusters", "services"}
    assert set(env["clusters"]) == {"us-east", "us-west", "eu-central"}
    assert env["clusters"]["eu-central"]["labels"]["gpu"] == "v100"
    assert set(env["services"]) == set(environment.installed_services())
    ports = {s["health"] for s in env["services"].values()}
    assert len(ports) == len(env["services"]), "every service on its own health port"
    kubeconfig = yaml.safe_load(Path(env["kubeconfig"]).read_text())
    contexts = {c["name"] for c in kubeconfig["contexts"]}
    assert contexts == {"hub", "us-east", "us-west", "eu-central"}

    again = flotilla(state, "up")
    assert "already running" in again.stdout
    assert f"export KUBECONFIG={env['kubeconfig']}" in again.stdout
    assert json.loads((state / "env.json").read_text()) == env, "nothing started twice"

    status = flotilla(state, "status").stdout
    for name in env["services"]:
        assert any(line.split()[:1] == [name] and "ready" in line for line in status.splitlines())


async def test_apply_get_and_describe(state: Path) -> None:
    applied = flotilla(state, "apply", "-f", str(EXAMPLES)).stdout
    assert "placementpolicy.flotilla.io/web created" in applied
    assert "deployment.apps/web created" in applied
    assert "deployment.apps/trainer created" in applied

    async def decided() -> str | None:
        out = (await polled(state, "get", "placements")).stdout
        return out if WEB in out and TRAINER in out else None

    await eventually(decided, timeout=60, what="web and trainer decided")
    listing = flotilla(state, "get", "placements").stdout
    # The policy divides 3 replicas 2:1 by weight between the two AWS clusters.
    assert "us-east=2, us-west=1" in next(line for line in listing.splitlines() if WEB in line)
    assert "nowhere" in next(line for line in listing.splitlines() if TRAINER in line)

    as_json = json.loads((await polled(state, "get", "placements", "-o", "json")).stdout)
    assert any(p["ref"]["name"] == "web" for p in as_json)
    clusters = yaml.safe_load((await polled(state, "get", "clusters", "-o", "yaml")).stdout)
    assert sorted(c["metadata"]["name"] for c in clusters) == ["eu-central", "us-east", "us-west"]
    policies = (await polled(state, "get", "policies", "-o", "wide")).stdout
    assert "PlacementPolicy" in policies and "Deployment/web" in policies

    described = flotilla(state, "describe", "deployment/web", "-n", "default").stdout
    assert "Key:              apps/v1/Deployment/default/web" in described
    assert "us-east          Active    replicas=2" in described
    assert "us-west          Active    replicas=1" in described
    # eu-central is rejected, and describe says why.
    assert "eu-central       cluster-selector" in described
    trace = described.split("Last trace:", 1)[1].split()[0]
    assert len(trace) == 32, described

    # The unschedulable one: describe names the reason for every cluster.
    out = (await polled(state, "describe", "deploy/trainer")).stdout
    assert "(no cluster)" in out
    rejected = out.split("Rejected clusters:", 1)[1]
    lines = {line.split()[0]: line for line in rejected.splitlines()[1:4]}
    assert "capacity" in lines["us-east"] and "nvidia.com/gpu" in lines["us-east"]
    assert "capacity" in lines["us-west"] and "nvidia.com/gpu" in lines["us-west"]
    assert "cluster-selector" in lines["eu-central"]
    assert "Unschedulable" in out, "the scheduler's Warning Event is shown"


def test_events_filter_by_object_and_type(state: Path) -> None:
    out = flotilla(state, "events", "--key", "default/web", "--since", "1h").stdout
    assert all("/default/web" in line for line in out.splitlines()), out
    assert "ResourceAnalyzed" in out and "trace=" in out
    only = inprocess(state, "events", "--type", "PlacementDecided").stdout.splitlines()
    assert only and all(" PlacementDecided " in line for line in only)
    assert any(WEB in line for line in only) and any(TRAINER in line for line in only)


async def test_events_follow_prints_what_happens_next(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = environment.load(state)
    follow = asyncio.create_task(
        commands._events(
            env, stream.Window(since=datetime.now(UTC)), None, ("ClusterObserved",), True
        )
    )
    try:
        # As a process: an in-process command would take this process's stdout over.
        await asyncio.to_thread(flotilla, state, "cordon", "eu-central")

        def cordoned() -> bool:
            return "cluster eu-central" in capsys.readouterr().out

        await eventually(cordoned, timeout=30, what="the cordon followed")
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        await asyncio.to_thread(flotilla, state, "uncordon", "eu-central")


def test_replay_decides_the_recorded_window_again_and_shows_a_policy_change(
    state: Path, tmp_path: Path
) -> None:
    same = inprocess(state, "replay", "--from-seq", "1", "--diff").stdout
    lines = same.splitlines()
    assert any(WEB in line and line.split()[-2:-1] == ["same"] for line in lines), same
    assert lines[-1].endswith(" 0 different"), same

    # What if the web policy weighted both regions alike? Only web's decision changes.
    changed = (EXAMPLES / "web.yaml").read_text().replace("weight: 2", "weight: 1")
    (tmp_path / "even.yaml").write_text(changed)
    diff = flotilla(
        state, "replay", "--since", "1h", "--diff", "--policy", str(tmp_path / "even.yaml")
    ).stdout
    different = [line for line in diff.splitlines() if "DIFFERENT" in line]
    assert len(different) == 1 and WEB in different[0], diff
    assert "- placement: us-east=2, us-west=1" in diff
    assert "+ placement: us-east=1, us-west=2" in diff
    assert any(TRAINER in line and " same" in line for line in diff.splitlines()), diff
    assert diff.splitlines()[-1].endswith(" 1 different")

    only_web = inprocess(state, "replay", "--since", "1h", "--key", "default/web").stdout
    assert TRAINER not in only_web and WEB in only_web


def test_registering_a_member_again_updates_it_in_place(state: Path) -> None:
    env = environment.load(state)
    member = f"us-west={env.clusters['us-west'].kubeconfig}"
    hub_kubeconfig = env.hub.kubeconfig
    done = inprocess(state, "register", "--hub", hub_kubeconfig, "--member", member)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("registered us-west on ")
    clusters = yaml.safe_load(inprocess(state, "get", "clusters", "-o", "yaml").stdout)
    west = next(c for c in clusters if c["metadata"]["name"] == "us-west")
    assert west["metadata"]["labels"]["region"] == "us-west"
    assert len(clusters) == 3


def test_cordon_and_uncordon_show_in_get_clusters(state: Path) -> None:
    assert "cluster/us-west cordoned" in flotilla(state, "cordon", "us-west").stdout
    row = next(
        line
        for line in inprocess(state, "get", "clusters").stdout.splitlines()
        if line.startswith("us-west")
    )
    assert "Cordoned" in row
    inprocess(state, "uncordon", "us-west")
    row = next(
        line
        for line in inprocess(state, "get", "clusters").stdout.splitlines()
        if line.startswith("us-west")
    )
    assert "Schedulable" in row


async def test_chaos_outage_takes_a_region_off_and_back(state: Path) -> None:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.client.exceptions import ApiException

    from flotilla.common import kube

    env = environment.load(state)

    async def answers() -> bool:
        api = await kube.client_from_kubeconfig(env.clusters["us-west"].kubeconfig)
        async with api:
            try:
                await k8s.CoreV1Api(api).list_namespace()
            except ApiException:
                return False
        return True

    out = flotilla(state, "chaos", "outage", "--region", "us-west").stdout
    assert out.strip() == "cluster/us-west in outage"
    assert not await answers()
    (await polled(state, "chaos", "outage", "us-west", "--off"))
    assert await eventually(answers, timeout=10, what="us-west back")


@pytest.mark.skipif(
    "drain" not in environment.installed_services(), reason="needs the drain coordinator"
)
def test_drain_wait_shows_progress_until_drained(state: Path) -> None:
    out = flotilla(state, "drain", "us-west", "--wait", "--timeout", "120").stdout
    assert "cluster/us-west draining" in out
    assert "cluster/us-west drained in" in out
    placed = flotilla(state, "get", "placements").stdout
    web = next(line for line in placed.splitlines() if WEB in line)
    assert "us-east=3" in web and "us-west" not in web, web
    flotilla(state, "uncordon", "us-west")


def test_kubectl_reads_the_started_hub(state: Path) -> None:
    env = environment.load(state)
    fetched = sorted((Path(__file__).parents[3] / ".cache" / "kubectl").glob("kubectl-*"))
    kubectl = str(fetched[-1]) if fetched else shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl: the kubesim suite fetches one into .cache/kubectl (issue 12)")
    done = subprocess.run(
        [kubectl, "get", "clusters"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": env.kubeconfig},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert {"us-east", "us-west", "eu-central"} <= set(done.stdout.split())


def test_mistakes_are_one_line_and_exit_1(state: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n data: [\n")
    cases = {
        ("apply", "-f", str(tmp_path / "missing.yaml")): "no such file or directory",
        ("apply", "-f", str(bad)): "bad.yaml:5: invalid YAML",
        ("cordon", "atlantis"): "unknown cluster 'atlantis'",
        ("drain", "atlantis"): "unknown cluster 'atlantis'",
        ("chaos", "outage", "--region", "mars"): "no cluster in region 'mars'",
        ("describe", "deployment/nothing"): "Deployment nothing not found",
        ("describe", "gadget/x"): "no resource type 'gadget'",
        ("replay", "--since", "yesterday-ish"): "cannot read time",
        ("events", "--type", "Nonsense"): "unknown event type 'Nonsense'",
    }
    for args, message in cases.items():
        done = inprocess(state, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
        assert message in done.stderr, (args, done.stderr)
    # And as a process: one line on stderr, no traceback.
    elsewhere = flotilla(tmp_path / "nothing-here", "get", "clusters", check=False)
    assert elsewhere.returncode == 1
    assert elsewhere.stderr.startswith("error: no Flotilla environment")
    assert elsewhere.stderr.count("\n") == 1


def test_zz_down_stops_exactly_what_up_started(state: Path) -> None:
    env = environment.load(state)
    processes = [p for _, p in env.processes()]
    assert all(environment.alive(p) for p in processes)
    out = flotilla(state, "down").stdout
    assert f"stopped {len(processes)} processes" in out
    assert not any(environment.alive(p) for p in processes)
    assert not (state / "env.json").exists()
    done = inprocess(state, "status")
    assert done.returncode == 1 and "flotilla up" in done.stderr
