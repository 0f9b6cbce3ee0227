"""deploy/k8s: the kustomize base renders, every manifest is valid Kubernetes, the
workloads are hardened, every service's RBAC grants exactly the verbs it uses,
and the base applies to a (simulated) cluster with server-side validation."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
PULL = BASE / "overlays" / "pull-syncer"
SERVICES = ("watcher", "depdetector", "scheduler", "transformer", "syncer", "aggregator", "drain")

EVENTS = ("", "events")
ANY = ("*", "*")
ANY_STATUS = ("*", "*/status")
CLUSTERS = ("flotilla.io", "clusters")
CLUSTER_STATUS = ("flotilla.io", "clusters/status")
TRANSFORMATIONS = ("flotilla.io", "transformations")
CLUSTER_TRANSFORMATIONS = ("flotilla.io", "clustertransformations")
RECORD = {"create", "get", "patch"}
"""`flotilla.common.kube.EventRecorder`: read the Event, patch its count, or create it."""

VERBS: dict[str, dict[tuple[str, str], set[str]]] = {
    # Lists and watches every type a policy can select (TypeWatch), and the
    # Flotilla kinds; reports invalid policies as Events.
    "watcher": {ANY: {"get", "list", "watch"}, EVENTS: RECORD},
    # Reads objects and ResourceInterpreters; merge-patches flotilla.io/dependencies.
    "depdetector": {ANY: {"get", "list", "patch"}, EVENTS: RECORD},
    # Decides from events only; on the hub it writes Unschedulable Events.
    "scheduler": {EVENTS: RECORD},
    # Reads the object it renders and the (cluster) transformations.
    "transformer": {
        ANY: {"get"},
        TRANSFORMATIONS: {"get", "list", "watch"},
        CLUSTER_TRANSFORMATIONS: {"get", "list", "watch"},
        EVENTS: RECORD,
    },
    # Reads clusters and applies its own status fields (server-side apply: patch).
    "syncer": {
        CLUSTERS: {"get", "list", "watch"},
        CLUSTER_STATUS: {"get", "patch"},
        EVENTS: RECORD,
    },
    # Patches the placement/cluster-status annotations and writes aggregated status.
    "aggregator": {
        ANY: {"get", "patch"},
        ANY_STATUS: {"get", "patch", "update"},
        EVENTS: RECORD,
    },
    # Applies its drain conditions to clusters and the failover history to objects.
    "drain": {
        CLUSTERS: {"get", "list", "watch"},
        CLUSTER_STATUS: {"get", "patch"},
        ANY: {"get", "patch"},
        EVENTS: RECORD,
    },
}
SECRETS_IN_SYSTEM = {"get", "list", "watch"}
"""Only the syncer reads member kubeconfigs, and only in flotilla-system."""


def kubectl() -> Path:
    """The kubectl the kubesim kubectl suite fetches (v1.34), else one on PATH."""
    harness = ROOT / "libs" / "kubesim" / "tests" / "kubectl" / "harness.py"
    spec = importlib.util.spec_from_file_location("kubectl_harness", harness)
    if spec is not None and spec.loader is not None:
        module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
        if spec.name not in sys.modules:
            sys.modules[spec.name] = module  # its dataclasses look themselves up there
            spec.loader.exec_module(module)
        fetched: Path = module.fetch_kubectl()
        return fetched
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl on this machine and none fetched (issue 12)")
    return Path(found)


def render(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(BASE)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_the_base_renders_everything(base: list[dict[str, Any]]) -> None:
    assert set(by_kind(base, "Deployment")) == {*SERVICES, "redis"}
    assert len(by_kind(base, "CustomResourceDefinition")) == len(list(BASE.glob("crds/*.yaml")))
    assert set(by_kind(base, "Namespace")) == {"flotilla-system"}
    assert set(by_kind(base, "ServiceAccount")) == {f"flotilla-{s}" for s in SERVICES}
    namespaced = [d for d in base if d["kind"] in ("Deployment", "StatefulSet", "Service")]
    assert all(d["metadata"]["namespace"] == "flotilla-system" for d in namespaced)


def test_every_manifest_validates_against_the_kubernetes_schemas(
    base: list[dict[str, Any]],
) -> None:
    version = kubernetes_validate.latest_version()
    for doc in [*base, *render(PULL)]:
        kubernetes_validate.validate(doc, version, strict=True)
    broken = by_kind(base, "Deployment")["watcher"]
    broken = {**broken, "spec": {**broken["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from doc["spec"]["template"]["spec"]["containers"]


def test_workloads_are_probed_limited_and_unprivileged(base: list[dict[str, Any]]) -> None:
    workloads = [d for d in base if d["kind"] in ("Deployment", "StatefulSet")]
    workloads += [d for d in render(PULL) if d["kind"] == "Deployment"]
    for doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
        for container in containers(doc):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert container["readinessProbe"] and container["livenessProbe"]
    for name in SERVICES:
        (container,) = containers(by_kind(base, "Deployment")[name])
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["command"] == [f"flotilla-{name}"]


def test_a_disruption_budget_guards_every_workload_with_more_than_one_replica(
    base: list[dict[str, Any]],
) -> None:
    budgets = {
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for d in by_kind(base, "PodDisruptionBudget").values()
    }
    several = {
        d["metadata"]["name"]
        for d in base
        if d["kind"] in ("Deployment", "StatefulSet") and d["spec"]["replicas"] > 1
    }
    assert several and budgets == several


def test_nats_is_a_three_node_jetstream_cluster_with_8_mib_messages(
    base: list[dict[str, Any]],
) -> None:
    nats = by_kind(base, "StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["volumeClaimTemplates"]
    conf = by_kind(base, "ConfigMap")["nats"]["data"]["nats.conf"]
    assert "max_payload: 8MB" in conf and "jetstream" in conf
    routes = {f"nats://nats-{i}.nats-cluster:6222" for i in range(3)}
    assert all(route in conf for route in routes)


def test_rbac_grants_each_service_exactly_the_verbs_it_uses(base: list[dict[str, Any]]) -> None:
    roles = by_kind(base, "ClusterRole")
    bindings = by_kind(base, "ClusterRoleBinding")
    for service, expected in VERBS.items():
        account = f"flotilla-{service}"
        granted: dict[tuple[str, str], set[str]] = defaultdict(set)
        for rule in roles[account]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted[(group, resource)] |= set(rule["verbs"])
        assert dict(granted) == expected, service
        subjects = bindings[account]["subjects"]
        assert subjects == [
            {"kind": "ServiceAccount", "name": account, "namespace": "flotilla-system"}
        ]
        deployment = by_kind(base, "Deployment")[service]
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    (role,) = by_kind(base, "Role").values()
    assert role["metadata"]["namespace"] == "flotilla-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": sorted(SECRETS_IN_SYSTEM)}
    ]
    (binding,) = by_kind(base, "RoleBinding").values()
    assert binding["subjects"][0]["name"] == "flotilla-syncer"


def test_the_pull_overlay_runs_only_a_syncer_in_the_member() -> None:
    docs = render(PULL)
    assert set(by_kind(docs, "Deployment")) == {"syncer"}
    (container,) = containers(by_kind(docs, "Deployment")["syncer"])
    assert container["command"] == ["flotilla-syncer"]


@pytest.mark.integration
def test_the_base_applies_to_a_cluster_with_server_side_validation(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "member.yaml"
    sim = subprocess.Popen(
        [sys.executable, "-m", "flotilla.kubesim", "--name", "target", "--port", "0",
         "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert sim.stdout is not None
        assert sim.stdout.readline().startswith("READY"), "kubesim did not start"
        assert "server: https://" in kubeconfig.read_text(), "kubesim serves TLS by default"
        done = subprocess.run(
            [str(kubectl()), "--kubeconfig", str(kubeconfig), "apply", "-k", str(BASE),
             "--server-side", "--validate=strict"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "deployment.apps/scheduler serverside-applied" in done.stdout
    finally:
        sim.terminate()
        sim.wait(timeout=10)
        if sim.stdout is not None:
            sim.stdout.close()
