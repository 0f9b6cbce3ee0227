"""A platform engineer's day with kubectl v1.34 against a simulated member cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from .harness import Kubectl

pytestmark = [pytest.mark.kubectl, pytest.mark.integration]


def deployment(name: str, image: str = "nginx:1.0", replicas: int = 2, **extra: object) -> str:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": {"team": "a"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image, **extra}]},
            },
        },
    }
    return yaml.safe_dump(body)


def header(output: str) -> list[str]:
    return output.splitlines()[0].split()


def test_cluster_info_version_and_api_resources(member: Kubectl) -> None:
    assert f"is running at {member.url}" in member.out("cluster-info")
    version = json.loads(member.out("version", "-o", "json"))
    assert version["serverVersion"]["minor"] == "34"
    assert version["serverVersion"]["gitVersion"].startswith("v1.34.")
    resources = member.out("api-resources")
    assert "deployments" in resources and "apps/v1" in resources
    everything = member.out("api-resources", "--categories=all", "-o", "name")
    assert {"pods", "deployments.apps", "jobs.batch"} <= set(everything.split())


def test_apply_client_side_is_unchanged_on_reapply_and_server_side_conflicts(
    member: Kubectl,
) -> None:
    manifest = deployment("applied")
    assert "created" in member.out("apply", "-f", "-", stdin=manifest)
    assert "unchanged" in member.out("apply", "-f", "-", stdin=manifest)
    # Server-side apply by another manager that wants another image: a conflict...
    other = deployment("applied", image="nginx:9")
    refused = member.run(
        "apply", "--server-side", "--field-manager=other", "-f", "-", stdin=other, check=False
    )
    assert refused.returncode != 0 and "conflict" in refused.stderr.lower()
    # ...until it forces; then the image is its.
    member.out(
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        "-",
        stdin=other,
    )
    image = member.out(
        "get", "deploy", "applied", "-o", "jsonpath={.spec.template.spec.containers[0].image}"
    )
    assert image == "nginx:9"
    assert "serverside-applied" in member.out(
        "apply", "--server-side", "--field-manager=other", "-f", "-", stdin=other
    )


def test_get_prints_the_server_side_tables(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("tables", replicas=2))
    member.out("rollout", "status", "deploy/tables", "--timeout=60s")
    assert header(member.out("get", "pods")) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    pods = member.out("get", "pods", "-l", "app=tables")
    assert pods.count("Running") == 2 and "1/1" in pods
    assert header(member.out("get", "deploy", "tables")) == [
        "NAME",
        "READY",
        "UP-TO-DATE",
        "AVAILABLE",
        "AGE",
    ]
    assert "2/2" in member.out("get", "deploy", "tables")
    nodes = member.out("get", "nodes", "-o", "wide")
    assert header(nodes)[:6] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP"]
    assert "CONTAINER-RUNTIME" in nodes.splitlines()[0]
    assert "IMAGES" in member.out("get", "rs", "-o", "wide").splitlines()[0]
    member.out("expose", "deploy", "tables", "--port=80", "--target-port=8080")
    services = member.out("get", "svc", "tables", "-o", "wide")
    assert header(services) == [
        "NAME",
        "TYPE",
        "CLUSTER-IP",
        "EXTERNAL-IP",
        "PORT(S)",
        "AGE",
        "SELECTOR",
    ]
    assert "80/TCP" in services and "app=tables" in services
    columns = member.out(
        "get",
        "pods",
        "-l",
        "app=tables",
        "-o",
        "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName",
    )
    assert header(columns) == ["NAME", "NODE"] and "member-node-" in columns
    names = member.out(
        "get", "pods", "-l", "app=tables", "-o", "jsonpath={.items[*].metadata.name}"
    )
    assert len(names.split()) == 2
    assert "No resources found" in member.run("get", "pods", "-l", "app=nothing-has-this").stderr
    assert "deployment.apps/tables" in member.out("get", "all")


def test_get_watch_streams_changes(member: Kubectl) -> None:
    member.out("create", "-f", "-", stdin=deployment("watched", replicas=1))
    watch = member.popen("get", "deploy", "watched", "-w", "--output-watch-events")
    try:
        member.out("scale", "deploy/watched", "--replicas=3")
        assert watch.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = watch.stdout.readline()
            lines.append(line)
            if line.startswith("MODIFIED") and "/3" in line:
                break
        assert any(line.startswith("ADDED") for line in lines), lines
        assert lines[-1].startswith("MODIFIED") and "/3" in lines[-1], lines
    finally:
        watch.kill()
        watch.communicate()


def test_describe_pod_deployment_and_node(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("described", replicas=1))
    member.out("rollout", "status", "deploy/described", "--timeout=60s")
    described = member.out("describe", "deploy", "described")
    assert "RollingUpdate" in described and "25% max unavailable" in described
    pod = member.out("describe", "pod", "-l", "app=described")
    assert "Status:" in pod and "Running" in pod and "Service Account:  default" in pod
    node = member.out("describe", "node", "member-node-0")
    assert "Capacity:" in node and "Allocatable:" in node


def test_rollout_restart_undo_scale_and_set_image(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("rolled"))
    member.out("rollout", "status", "deploy/rolled", "--timeout=60s")
    member.out("set", "image", "deploy/rolled", "app=nginx:2.0")
    member.out("rollout", "status", "deploy/rolled", "--timeout=60s")
    jsonpath = "jsonpath={.spec.template.spec.containers[0].image}"
    assert member.out("get", "deploy", "rolled", "-o", jsonpath) == "nginx:2.0"
    member.out("rollout", "undo", "deploy/rolled")
    member.out("rollout", "status", "deploy/rolled", "--timeout=60s")
    assert member.out("get", "deploy", "rolled", "-o", jsonpath) == "nginx:1.0"
    member.out("rollout", "restart", "deploy/rolled")
    member.out("rollout", "status", "deploy/rolled", "--timeout=60s")
    restarted = member.out(
        "get",
        "deploy",
        "rolled",
        "-o",
        "jsonpath={.spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt}",
    )
    assert restarted
    member.out("scale", "deploy/rolled", "--replicas=4")
    member.out("wait", "--for=jsonpath={.status.readyReplicas}=4", "deploy/rolled", "--timeout=60s")


def test_patch_three_ways_and_replace(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("patched", replicas=1))
    member.out(
        "patch",
        "deploy",
        "patched",
        "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"nginx:s"}]}}}}',
    )
    member.out(
        "patch", "deploy", "patched", "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}'
    )
    member.out(
        "patch",
        "deploy",
        "patched",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/replicas","value":2}]',
    )
    live = json.loads(member.out("get", "deploy", "patched", "-o", "json"))
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:s"
    assert live["metadata"]["labels"] == {"team": "a", "m": "1"}
    assert live["spec"]["replicas"] == 2
    # The controller keeps writing status, so replace unconditionally (no resourceVersion)...
    live["spec"]["replicas"] = 3
    del live["metadata"]["resourceVersion"]
    for _ in range(5):
        # kubectl may still race a status write (409, as against a real API server):
        # a user runs it again.
        replaced = member.run("replace", "-f", "-", stdin=json.dumps(live), check=False)
        if "the object has been modified" not in replaced.stderr:
            break
    assert replaced.returncode == 0 and "replaced" in replaced.stdout, replaced.stderr
    assert member.out("get", "deploy", "patched", "-o", "jsonpath={.spec.replicas}") == "3"
    # ...while a stale resourceVersion is a conflict.
    live["metadata"]["resourceVersion"] = "1"
    stale = member.run("replace", "-f", "-", stdin=json.dumps(live), check=False)
    assert stale.returncode != 0 and "the object has been modified" in stale.stderr


def test_diff_and_server_dry_run_change_nothing(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("dry"))
    before = json.loads(member.out("get", "deploy", "dry", "-o", "json"))
    changed = deployment("dry", image="nginx:next")
    diff = member.run("diff", "-f", "-", stdin=changed, check=False)
    assert diff.returncode == 1, diff.stderr
    changed_lines = [line.split() for line in diff.stdout.splitlines()]
    assert ["-", "-", "image:", "nginx:1.0"] in changed_lines, diff.stdout
    assert ["+", "-", "image:", "nginx:next"] in changed_lines, diff.stdout
    dry = json.loads(
        member.out("apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=changed)
    )
    assert dry["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:next"
    after = json.loads(member.out("get", "deploy", "dry", "-o", "json"))
    # Status writes of the controller move resourceVersion; the spec stays as it was.
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    member.out("delete", "deploy", "dry", "--dry-run=server")
    assert member.out("get", "deploy", "dry", "-o", "name") == "deployment.apps/dry\n"
    assert member.run("diff", "-f", "-", stdin=deployment("dry")).returncode == 0


def test_field_validation_and_defaults(member: Kubectl) -> None:
    unknown = deployment("strict", bogus="x")
    refused = member.run("apply", "-f", "-", stdin=unknown, check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.template.spec.containers[0].bogus"' in refused.stderr
    warned = member.run("apply", "--validate=warn", "-f", "-", stdin=unknown)
    assert 'Warning: unknown field "spec.template.spec.containers[0].bogus"' in warned.stderr
    live = json.loads(member.out("get", "deploy", "strict", "-o", "json"))
    container = live["spec"]["template"]["spec"]["containers"][0]
    assert "bogus" not in container
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert live["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": "25%"}
    assert live["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirst"


def test_explain(member: Kubectl) -> None:
    explained = member.out("explain", "deployment.spec")
    assert "KIND:       Deployment" in explained
    assert "replicas\t<integer>" in explained and "Number of desired pods" in explained
    assert "containers\t<[]Container>" in member.out("explain", "pods.spec")


def test_auth_token_and_logs(member: Kubectl) -> None:
    assert member.out("auth", "can-i", "delete", "nodes").strip() == "yes"
    assert "kubesim-admin" in member.out("auth", "whoami")
    token = member.out("create", "token", "default", "--duration=1h").strip()
    assert token.count(".") == 2
    member.out("apply", "-f", "-", stdin=deployment("logged", replicas=1))
    member.out("rollout", "status", "deploy/logged", "--timeout=60s")
    logs = member.out("logs", "deploy/logged")
    assert "container app started" in logs


def test_wait_delete_and_cordon(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("waited", replicas=1))
    member.out("wait", "--for=condition=Available", "deploy/waited", "--timeout=60s")
    pod = member.out("get", "pods", "-l", "app=waited", "-o", "name").strip()
    member.out("delete", "deploy", "waited", "--wait=true", "--timeout=60s")
    member.out("wait", "--for=delete", pod, "--timeout=60s")
    assert member.out("get", "deploy", "-o", "name").count("waited") == 0
    member.out("cordon", "member-node-2")
    assert "Ready,SchedulingDisabled" in member.out("get", "node", "member-node-2")
    member.out("uncordon", "member-node-2")
    assert "SchedulingDisabled" not in member.out("get", "node", "member-node-2")


def test_kustomize(member: Kubectl, tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text(deployment("kustomized", replicas=1))
    (tmp_path / "kustomization.yaml").write_text(
        "namePrefix: team-\ncommonLabels: {owner: kustomize}\nresources: [deploy.yaml]\n"
    )
    assert "name: team-kustomized" in member.out("kustomize", str(tmp_path))
    member.out("apply", "-k", str(tmp_path))
    assert member.out("get", "deploy", "-l", "owner=kustomize", "-o", "name") == (
        "deployment.apps/team-kustomized\n"
    )


def test_create_commands_that_send_protobuf(member: Kubectl) -> None:
    """kubectl's typed `create` commands send protobuf bodies."""
    assert "namespace/team-pb created" in member.out("create", "namespace", "team-pb")
    ns = ("-n", "team-pb")
    created = [
        member.out(*ns, "create", "configmap", "settings", "--from-literal=mode=fast"),
        member.out(*ns, "create", "secret", "generic", "creds", "--from-literal=password=s3cret"),
        member.out(*ns, "create", "serviceaccount", "robot"),
        member.out(*ns, "create", "deployment", "web", "--image=nginx:1.27", "--replicas=2"),
        member.out(*ns, "create", "job", "once", "--image=busybox:1.36", "--", "echo", "hi"),
    ]
    assert all(line.strip().endswith("created") for line in created), created
    password = member.out(*ns, "get", "secret", "creds", "-o", "jsonpath={.data.password}")
    assert password == "czNjcmV0"
    assert member.out(*ns, "get", "configmap", "settings", "-o", "jsonpath={.data.mode}") == "fast"
    member.out(*ns, "wait", "--for=condition=Complete", "job/once", "--timeout=60s")
    member.out(*ns, "rollout", "status", "deploy/web", "--timeout=60s")
    deleted = member.out(*ns, "delete", "configmap", "settings")
    assert 'configmap "settings" deleted' in deleted


def test_describe_shows_the_events_the_cluster_recorded(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("evented", replicas=1))
    member.out("rollout", "status", "deploy/evented", "--timeout=60s")

    def recorded() -> tuple[str, str]:
        return (
            member.out("describe", "pod", "-l", "app=evented"),
            member.out("describe", "deploy", "evented"),
        )

    deadline = time.monotonic() + 30
    pod, deploy = recorded()
    while ("Scheduled" not in pod or "ScalingReplicaSet" not in deploy) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
        pod, deploy = recorded()
    assert "Scheduled" in pod and "Successfully assigned default/evented-" in pod, pod
    assert "Scaled up replica set evented-" in deploy, deploy
    created = member.out(
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=ReplicaSet,reason=SuccessfulCreate",
    )
    assert "Created pod: evented-" in created


def test_drain_evicts_within_a_disruption_budget(member: Kubectl) -> None:
    member.out("apply", "-f", "-", stdin=deployment("guarded", replicas=3))
    member.out("rollout", "status", "deploy/guarded", "--timeout=60s")
    member.out("create", "pdb", "guarded", "--selector=app=guarded", "--min-available=2")
    node = member.out(
        "get", "pods", "-l", "app=guarded", "-o", "jsonpath={.items[0].spec.nodeName}"
    ).strip()
    try:
        drained = member.run(
            "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s"
        )
        assert drained.returncode == 0, drained.stderr
        assert f"node/{node} drained" in drained.stdout, drained.stdout
        assert "evicted" in drained.stdout
        on_node = member.out(
            "get", "pods", "-l", "app=guarded", "--field-selector", f"spec.nodeName={node}"
        )
        assert "guarded-" not in on_node
    finally:
        member.out("uncordon", node)
