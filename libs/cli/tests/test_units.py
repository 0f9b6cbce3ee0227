"""The command's parts that need no running environment: reading manifests and
times, replaying decisions through the scheduler core, the demo's prober, the
environment's process records."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flotilla.cli import commands, demo, environment, hub, reference, replay, stream
from flotilla.cli.errors import CliError
from flotilla.common import api, capacity, events
from flotilla.common.dispatch import ReplayedEvent
from flotilla.scheduler import core
from flotilla.scheduler.model import Fleet, SchedulingInput

NOW = datetime(2026, 1, 1, tzinfo=UTC)


# --- manifests and times ---------------------------------------------------------------


def test_invalid_yaml_is_reported_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "app.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: [x\n")
    with pytest.raises(CliError, match=r"app\.yaml:6: invalid YAML"):
        hub.manifests(bad)


def test_manifests_of_a_directory_in_order_and_bad_objects_named(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n")
    (tmp_path / "a.yml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n"
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"
    )
    (tmp_path / "notes.txt").write_text("not a manifest")
    found = hub.manifests(tmp_path)
    assert [m.body["metadata"]["name"] for m in found] == ["a", "s", "b"]
    assert found[1].source.endswith("a.yml#2")
    (tmp_path / "c.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(CliError, match=r"c\.yaml: not a Kubernetes object"):
        hub.manifests(tmp_path)
    with pytest.raises(CliError, match="no such file"):
        hub.manifests(tmp_path / "missing")


def test_times_are_durations_ago_or_iso() -> None:
    assert stream.parse_time("10m", now=NOW) == NOW - timedelta(minutes=10)
    assert stream.parse_time("1.5h", now=NOW) == NOW - timedelta(minutes=90)
    assert stream.parse_time("2026-01-01T00:00:00") == NOW
    with pytest.raises(CliError, match="cannot read time"):
        stream.parse_time("soon")


def test_keys_match_namespace_and_name_and_work_keys() -> None:
    ref = events.ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="a")
    observed = events.ResourceObserved(ref=ref, object={})
    envelope = events.envelope(observed, key=ref.key, producer="t")
    work = events.envelope(observed, key=events.work_key(ref, "us-east"), producer="t")
    assert stream.matches_key(envelope, "a/web") and stream.matches_key(work, "a/web")
    assert not stream.matches_key(envelope, "b/web")
    assert not stream.matches_key(envelope, "a/web2")
    assert stream.trace_id("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01") == "ab" * 16


# --- replay ----------------------------------------------------------------------------

LABELS = {name: dict(labels) for name, labels in environment.MEMBERS.items()}


def cluster_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name, "labels": LABELS[name]},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def policy(name: str, east: int, west: int) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "PlacementPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
            "strategy": "split",
            "clusterSelector": {"matchLabels": {"provider": "aws"}},
            "splitBy": "weights",
            "weights": [
                {"clusterSelector": {"matchLabels": {"region": "us-east"}}, "weight": east},
                {"clusterSelector": {"matchLabels": {"region": "us-west"}}, "weight": west},
            ],
        },
    }


def analyzed(name: str, spec: dict[str, Any], replicas: int = 3) -> events.ResourceAnalyzed:
    ref = events.ObjectRef(api_version="apps/v1", kind="Deployment", name=name, namespace="default")
    return events.ResourceAnalyzed(
        ref=ref,
        object={"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}},
        strategy=api.Strategy.SPLIT,
        replicas=replicas,
        requests={"cpu": 100},
        policy=events.PolicyRef(kind="PlacementPolicy", name=name, namespace="default"),
        policy_spec=api.parse_as(api.PlacementPolicy, spec).spec,
    )


def base_capacity() -> capacity.Snapshot:
    return capacity.Snapshot(
        clusters={n: environment.member_capacity(n, gpu="gpu" in LABELS[n]) for n in LABELS},
        taken_at=0.0,
    )


def recorded_stream() -> list[ReplayedEvent]:
    """What the scheduler would have recorded: clusters, two objects, their decisions
    (made here by the same core against the same capacity)."""
    out: list[events.Envelope] = []
    clusters = [api.parse_as(api.Cluster, cluster_object(n)) for n in LABELS]
    for name in LABELS:
        observed = events.ClusterObserved(cluster=name, object=cluster_object(name))
        out.append(events.envelope(observed, key=name, producer="watcher"))
    held = replay._State()
    for name, weights in (("web", (2, 1)), ("api", (1, 1))):
        item = analyzed(name, policy(name, *weights))
        out.append(events.envelope(item, key=item.ref.key, producer="depdetector"))
        decision = core.schedule(
            SchedulingInput(
                analyzed=item,
                policy=item.policy_spec,
                fleet=Fleet(clusters, held.snapshot(base_capacity())),
                now=NOW,
            )
        ).to_event()
        held.analyzed[item.ref.key] = item
        held.decided[item.ref.key] = decision
        out.append(
            events.envelope(decision, key=item.ref.key, producer="scheduler", produced_at=NOW)
        )
    return [ReplayedEvent(i + 1, NOW, "s", e) for i, e in enumerate(out)]


async def feed(items: Iterable[ReplayedEvent]) -> AsyncIterator[ReplayedEvent]:
    for item in items:
        yield item


async def test_replay_of_the_recorded_decisions_finds_no_difference() -> None:
    outcomes = await replay.scheduler(feed(recorded_stream()), stream.Window(), base_capacity())
    assert [o.key.rsplit("/", 1)[1] for o in outcomes] == ["web", "api"]
    assert all(o.same for o in outcomes), [o.differences() for o in outcomes]
    placed = {p.cluster: p.replicas for p in outcomes[0].recorded.clusters}
    assert placed == {"us-east": 2, "us-west": 1}


async def test_a_changed_policy_weight_differs_in_exactly_its_decision() -> None:
    overrides = replay.policy_overrides([policy("web", 1, 2)])
    outcomes = await replay.scheduler(
        feed(recorded_stream()), stream.Window(), base_capacity(), overrides=overrides
    )
    web, api_ = outcomes
    assert not web.same and api_.same
    assert "- placement: us-east=2, us-west=1" in web.differences()
    assert "+ placement: us-east=1, us-west=2" in web.differences()


async def test_replay_window_and_key_select_decisions() -> None:
    recorded = recorded_stream()
    last = recorded[-1].sequence
    only_last = await replay.scheduler(
        feed(recorded), stream.Window(from_seq=last), base_capacity()
    )
    assert [o.sequence for o in only_last] == [last] and only_last[0].same
    by_key = await replay.scheduler(
        feed(recorded), stream.Window(), base_capacity(), key="default/web"
    )
    assert [o.key for o in by_key] == ["apps/v1/Deployment/default/web"]
    without_input = [e for e in recorded if e.envelope.type != "ResourceAnalyzed"]
    lost = await replay.scheduler(feed(without_input), stream.Window(), base_capacity())
    assert not lost[0].same and "not in the stream" in lost[0].differences()[0]


def test_policy_overrides_need_a_policy() -> None:
    with pytest.raises(ValueError, match="no PlacementPolicy"):
        replay.policy_overrides([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}])


# --- the demo's prober ---------------------------------------------------------------


def deployment(ready: int, placement: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {
                "flotilla.io/placement": api.compact_json({"clusters": placement}),
                "flotilla.io/cluster-status": api.compact_json(
                    {p["cluster"]: {"readyReplicas": ready} for p in placement}
                ),
            }
        },
        "status": {"readyReplicas": ready},
    }


def test_the_prober_counts_minimum_availability_once_the_app_was_up() -> None:
    watch = demo.Watch()
    east = [{"cluster": "us-east", "replicas": demo.REPLICAS, "state": "Active"}]
    watch.sample(deployment(0, east))
    watch.sample(deployment(2, east))
    assert watch.minimum is None, "starting up is not an outage"
    watch.sample(deployment(demo.REPLICAS, east))
    watch.sample(deployment(demo.REPLICAS // 2, east))
    watch.sample(deployment(demo.REPLICAS, east))
    assert watch.minimum == 0.5 and watch.samples == 5
    assert watch.ready_per_cluster == {"us-east": demo.REPLICAS}
    watch.clusters = [cluster_object("us-east")]
    assert watch.table().row_count == 1


def test_the_demo_names_the_missing_services(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        environment, "installed_services", lambda: ["watcher", "depdetector", "scheduler"]
    )
    code = commands.run_cli(["--state-dir", str(tmp_path), "demo"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        "error: the demo needs every service; not installed: "
        "transformer, syncer, aggregator, drain\n"
    )
    assert not (tmp_path / "env.json").exists(), "nothing was started"


# --- the environment's records -------------------------------------------------------


def test_a_recorded_process_is_alive_only_with_its_start_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        record = environment.Process(pid=child.pid, started=environment.started_at(child.pid))
        assert environment.alive(record)
        reused = record.model_copy(update={"started": "1"})
        assert not environment.alive(reused), "another process with the same pid is not ours"
        assert environment.stop(record)
        child.wait(timeout=10)
        assert not environment.alive(record)
        assert not environment.stop(record)
    finally:
        child.kill()
        child.wait()


def test_the_kubeconfig_has_a_context_per_cluster(tmp_path: Path) -> None:
    sources = []
    for name in ("hub", "us-east"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "clusters": [{"name": name, "cluster": {"server": f"https://{name}"}}],
                    "users": [{"name": name, "user": {"token": "t"}}],
                    "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                    "current-context": name,
                }
            )
        )
        sources.append(path)
    environment.write_kubeconfig(tmp_path / "kubeconfig", sources)
    merged = yaml.safe_load((tmp_path / "kubeconfig").read_text())
    assert [c["name"] for c in merged["contexts"]] == ["hub", "us-east"]
    assert merged["current-context"] == "hub"
    assert (tmp_path / "kubeconfig").stat().st_mode & 0o777 == 0o600


def test_more_members_get_their_own_regions() -> None:
    members = environment.member_labels(5)
    assert list(members)[:3] == ["us-east", "us-west", "eu-central"]
    assert len({labels["region"] for labels in members.values()}) == 5
    with pytest.raises(CliError, match="--clusters"):
        environment.up(Path("/nonexistent"), 0)


def test_an_installation_not_started_by_up_is_described_by_its_variables() -> None:
    assert environment.from_variables({}) is None
    env = environment.from_variables(
        {"FLOTILLA_HUB_KUBECONFIG": "/kube/hub.yaml", "FLOTILLA_NATS_URL": "nats://nats:4222"}
    )
    assert env is not None and env.hub.kubeconfig == "/kube/hub.yaml"
    assert env.nats_url == "nats://nats:4222" and env.processes()[-1][0] == "hub"


def test_a_kubeconfig_is_rewritten_to_reach_its_server_by_name(tmp_path: Path) -> None:
    source = tmp_path / "hub.yaml"
    source.write_text(
        yaml.safe_dump(
            {"clusters": [{"name": "hub", "cluster": {"server": "http://0.0.0.0:6443"}}]}
        )
    )
    target = environment.reachable_as(source, "hub", tmp_path / "out.yaml")
    assert yaml.safe_load(target.read_text())["clusters"][0]["cluster"]["server"] == (
        "http://hub:6443"
    )
    source.write_text(
        yaml.safe_dump({"clusters": [{"name": "m", "cluster": {"server": "https://0.0.0.0:6443"}}]})
    )
    cluster = yaml.safe_load(environment.reachable_as(source, "m", target).read_text())
    assert cluster["clusters"][0]["cluster"] == {
        "server": "https://m:6443",
        "tls-server-name": "localhost",
    }


def test_the_reference_pages_are_generated_from_the_code_and_current() -> None:
    assert reference.main(["--check"]) == 0, "run `python -m flotilla.cli.reference`"
    page = reference.api_reference()
    for crd in environment.CRD_DIR.glob("*.yaml"):
        kind = yaml.safe_load(crd.read_text())["spec"]["names"]["kind"]
        assert f"## {kind} (flotilla.io/" in page
    for annotation in reference.ANNOTATIONS:
        assert f"`{annotation}`" in page
    assert "`spec.unschedulable` | boolean" in page
    settings = reference.configuration_reference()
    assert "`FLOTILLA_RESERVATION_TTL`" in settings and "`FLOTILLA_NATS_URL`" in settings
    # A common setting a service gives another default is listed under that service too.
    scheduler = settings.split("## scheduler", 1)[1].split("\n## ", 1)[0]
    assert "| `FLOTILLA_MAX_CONCURRENCY` | `256` |" in scheduler
    assert "| `FLOTILLA_MAX_CONCURRENCY` | `64` |" in settings.split("## scheduler", 1)[0]
    assert "FLOTILLA_HANDLER_DEADLINE" not in scheduler  # the same default: listed once
