"""The simulator over a bare `Store`: controllers, scheduler, kubelet and node operations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from flotilla.kubesim.sim import SimOptions, Simulator, http
from flotilla.kubesim.sim.nodes import LEASE_NAMESPACE
from flotilla.kubesim.store import Store, StoreEvent

from .simcluster import Cluster, bare_pod, condition, container, deployment, eventually, template


async def test_nodes_are_registered_ready_with_labels_and_leases(
    cluster_factory: Callable[..., Any],
) -> None:
    cluster = await cluster_factory(
        nodes=2,
        node_gpus=2,
        node_labels={"region": "eu", "zone": "eu-1a", "tier": "gold"},
        heartbeat_seconds=0.05,
    )
    nodes, _ = cluster.store.list(cluster.rt("Node"))
    assert [n["metadata"]["name"] for n in nodes] == ["test-node-0", "test-node-1"]
    node = nodes[0]
    assert (
        node["metadata"]["labels"]
        | {
            "kubernetes.io/hostname": "test-node-0",
            "kubernetes.io/os": "linux",
            "topology.kubernetes.io/region": "eu",
            "topology.kubernetes.io/zone": "eu-1a",
            "tier": "gold",
        }
        == node["metadata"]["labels"]
    )
    assert (
        node["status"]["allocatable"]
        | {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "2"}
        == node["status"]["allocatable"]
    )
    assert condition(node, "Ready")["status"] == "True"
    first = cluster.get("Lease", "test-node-0", LEASE_NAMESPACE)["spec"]["renewTime"]
    await eventually(
        lambda: cluster.get("Lease", "test-node-0", LEASE_NAMESPACE)["spec"]["renewTime"] != first
    )


async def test_deployment_runs_its_replicas_and_reports_status(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=3))

    status = await eventually(
        lambda: (s := cluster.status("Deployment", "web")).get("readyReplicas") == 3 and s
    )

    assert {
        k: status[k]
        for k in (
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
            "observedGeneration",
        )
    } == {
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 3,
        "availableReplicas": 3,
        "unavailableReplicas": 0,
        "observedGeneration": 1,
    }
    assert condition(cluster.get("Deployment", "web"), "Available")["status"] == "True"
    assert condition(cluster.get("Deployment", "web"), "Progressing")["reason"] == (
        "NewReplicaSetAvailable"
    )
    pods = cluster.pods("Running")
    assert len(pods) == 3
    replicaset_names = {p["metadata"]["ownerReferences"][0]["name"] for p in pods}
    assert len(replicaset_names) == 1
    replicaset = cluster.get("ReplicaSet", replicaset_names.pop())
    assert replicaset["metadata"]["ownerReferences"][0]["controller"] is True
    assert replicaset["status"]["readyReplicas"] == 3
    for pod in pods:
        assert (
            pod["metadata"]["labels"]["pod-template-hash"]
            == (replicaset["metadata"]["labels"]["pod-template-hash"])
        )
        assert pod["spec"]["nodeName"].startswith("test-node-")
        assert condition(pod, "Ready")["status"] == "True"
        assert condition(pod, "PodScheduled")["status"] == "True"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        assert pod["status"]["podIP"]
    # Spread: LeastAllocated puts one replica on each of the three nodes.
    assert len({p["spec"]["nodeName"] for p in pods}) == 3


async def test_scale_down_deletes_pods_and_updates_status(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=3))
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 3)

    cluster.update_spec("Deployment", "web", lambda d: d["spec"].update(replicas=1))

    await eventually(
        lambda: (
            cluster.status("Deployment", "web").get("replicas") == 1
            and cluster.status("Deployment", "web").get("observedGeneration") == 2
            and len(cluster.pods()) == 1
        )
    )
    assert cluster.status("Deployment", "web")["readyReplicas"] == 1


async def test_template_change_rolls_out_a_new_replicaset(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=4))
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 4)
    seen_total: list[int] = []
    unsubscribe = cluster.store.add_listener(
        cluster.rt("Pod"),
        lambda event: seen_total.append(
            len([p for p in cluster.sim.state.pods.values() if p.active])
        ),
    )

    def new_image(d: dict[str, Any]) -> None:
        d["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.28"

    cluster.update_spec("Deployment", "web", new_image)
    try:
        await eventually(
            lambda: (
                (s := cluster.status("Deployment", "web")).get("observedGeneration") == 2
                and s.get("updatedReplicas") == 4
                and s.get("availableReplicas") == 4
                and s.get("replicas") == 4
            )
        )
    finally:
        unsubscribe()
    images = {p["spec"]["containers"][0]["image"] for p in cluster.pods()}
    assert images == {"nginx:1.28"}
    assert max(seen_total) <= 5  # 25% maxSurge of 4 replicas is one extra pod
    assert (
        cluster.get("Deployment", "web")["metadata"]["annotations"][
            "deployment.kubernetes.io/revision"
        ]
        == "2"
    )


async def test_daemonset_skips_nodes_with_untolerated_noschedule_taints(cluster: Cluster) -> None:
    cluster.update_spec(
        "Node",
        "test-node-1",
        lambda n: n["spec"].update(
            taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]
        ),
    )
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")},
        }
    )

    status = await eventually(
        lambda: (s := cluster.status("DaemonSet", "agent")).get("numberReady") == 2 and s
    )
    assert status["desiredNumberScheduled"] == 2
    assert status["currentNumberScheduled"] == 2
    assert sorted(p["spec"]["nodeName"] for p in cluster.pods()) == ["test-node-0", "test-node-2"]

    cluster.update_spec(
        "DaemonSet",
        "agent",
        lambda d: d["spec"]["template"]["spec"].update(
            tolerations=[{"key": "dedicated", "operator": "Exists"}]
        ),
    )
    await eventually(lambda: cluster.status("DaemonSet", "agent").get("numberReady") == 3)


async def test_daemonset_follows_nodes_as_they_come_and_go(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")},
        }
    )
    await eventually(lambda: cluster.status("DaemonSet", "agent").get("numberReady") == 3)

    (added,) = http.apply(cluster.sim, {"action": "add"})["nodes"]
    await eventually(lambda: cluster.status("DaemonSet", "agent").get("numberReady") == 4)
    http.apply(cluster.sim, {"action": "remove", "names": [added, "test-node-0"]})

    await eventually(
        lambda: (
            cluster.status("DaemonSet", "agent").get("desiredNumberScheduled") == 2
            and len(cluster.pods()) == 2
        )
    )


async def test_job_completes_respecting_parallelism(cluster: Cluster) -> None:
    running_at_once: list[int] = []

    def count(event: StoreEvent) -> None:
        running_at_once.append(
            sum(1 for p in cluster.sim.state.pods.values() if p.phase == "Running")
        )

    unsubscribe = cluster.store.add_listener(cluster.rt("Pod"), count)
    cluster.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "batch", "namespace": "default"},
            "spec": {
                "completions": 3,
                "parallelism": 2,
                "template": template("batch", restartPolicy="Never"),
            },
        }
    )
    try:
        job = await eventually(
            lambda: (
                any(
                    c["type"] == "Complete" and c["status"] == "True"
                    for c in cluster.status("Job", "batch").get("conditions", [])
                )
                and cluster.get("Job", "batch")
            )
        )
    finally:
        unsubscribe()
    assert job["status"]["succeeded"] == 3
    assert job["status"]["active"] == 0
    assert job["status"]["completionTime"]
    assert max(running_at_once) == 2
    assert len(cluster.pods("Succeeded")) == 3
    assert all(p["metadata"]["labels"]["job-name"] == "batch" for p in cluster.pods())


async def test_statefulset_creates_ordinal_pods_in_order(cluster: Cluster) -> None:
    created: list[str] = []
    unsubscribe = cluster.store.add_listener(
        cluster.rt("Pod"),
        lambda e: created.append(e.object["metadata"]["name"]) if e.type == "ADDED" else None,
    )
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "replicas": 3,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": template("db"),
            },
        }
    )
    try:
        await eventually(lambda: cluster.status("StatefulSet", "db").get("readyReplicas") == 3)
    finally:
        unsubscribe()
    assert created == ["db-0", "db-1", "db-2"]
    assert cluster.get("Pod", "db-1")["spec"]["hostname"] == "db-1"

    cluster.update_spec("StatefulSet", "db", lambda s: s["spec"].update(replicas=1))
    await eventually(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["db-0"])


async def test_unschedulable_pod_waits_for_a_node_that_fits(cluster: Cluster) -> None:
    cluster.create(bare_pod("big", containers=[container(cpu="12")]))

    def scheduled_condition() -> dict[str, Any] | None:
        conditions = cluster.get("Pod", "big")["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    unscheduled = await eventually(scheduled_condition)
    assert unscheduled["status"] == "False"
    assert unscheduled["reason"] == "Unschedulable"
    assert unscheduled["message"] == "0/3 nodes are available: 3 Insufficient cpu."
    assert cluster.get("Pod", "big")["status"]["phase"] == "Pending"
    assert cluster.sim.stats()["unschedulablePods"] == 1

    (added,) = http.apply(cluster.sim, {"action": "add", "cpu": "16"})["nodes"]

    pod = await eventually(
        lambda: (p := cluster.get("Pod", "big"))["status"]["phase"] == "Running" and p
    )
    assert pod["spec"]["nodeName"] == added
    assert cluster.sim.stats()["unschedulablePods"] == 0


async def test_gpu_requests_are_counted_per_node(cluster: Cluster) -> None:
    (gpu_node,) = http.apply(cluster.sim, {"action": "add", "gpus": 2})["nodes"]
    for i in range(3):
        cluster.create(bare_pod(f"train-{i}", containers=[container(**{"nvidia.com/gpu": "1"})]))

    await eventually(lambda: len(cluster.pods("Running")) == 2)
    running = cluster.pods("Running")
    assert {p["spec"]["nodeName"] for p in running} == {gpu_node}
    (waiting,) = cluster.pods("Pending")
    assert "Insufficient nvidia.com/gpu" in condition(waiting, "PodScheduled")["message"]

    cluster.store.delete(cluster.rt("Pod"), "default", running[0]["metadata"]["name"])

    await eventually(
        lambda: cluster.get("Pod", waiting["metadata"]["name"])["status"]["phase"] == "Running"
    )


async def test_cordoned_and_zeroed_nodes_take_no_new_pods(cluster: Cluster) -> None:
    http.apply(cluster.sim, {"action": "cordon", "names": ["test-node-0"]})
    http.apply(cluster.sim, {"action": "zero-capacity", "names": ["test-node-1"]})
    cluster.create(deployment(replicas=4))

    await eventually(lambda: len(cluster.pods("Running")) == 4)
    assert {p["spec"]["nodeName"] for p in cluster.pods()} == {"test-node-2"}
    assert cluster.get("Node", "test-node-1", None)["status"]["allocatable"]["cpu"] == "0"

    http.apply(cluster.sim, {"action": "restore-capacity", "names": ["test-node-1"]})
    http.apply(cluster.sim, {"action": "uncordon", "names": ["test-node-0"]})
    assert cluster.get("Node", "test-node-1", None)["status"]["allocatable"]["cpu"] == "8"
    assert not cluster.get("Node", "test-node-0", None)["spec"].get("unschedulable")
    cluster.update_spec("Deployment", "web", lambda d: d["spec"].update(replicas=10))
    await eventually(lambda: len(cluster.pods("Running")) == 10)
    assert len({p["spec"]["nodeName"] for p in cluster.pods()}) == 3


async def test_removed_node_pods_are_replaced_elsewhere(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=3))
    await eventually(lambda: len(cluster.pods("Running")) == 3)

    http.apply(cluster.sim, {"action": "remove", "names": ["test-node-0"]})

    await eventually(
        lambda: (
            len(cluster.pods("Running")) == 3
            and all(p["spec"]["nodeName"] != "test-node-0" for p in cluster.pods())
        )
    )
    with pytest.raises(Exception, match="not found"):
        cluster.get("Lease", "test-node-0", LEASE_NAMESPACE)


async def test_noexecute_taint_evicts_untolerating_pods(cluster: Cluster) -> None:
    cluster.create(bare_pod("plain", nodeName="test-node-0"))
    cluster.create(
        bare_pod(
            "patient",
            nodeName="test-node-0",
            tolerations=[{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}],
        )
    )
    await eventually(lambda: len(cluster.pods("Running")) == 2)

    cluster.update_spec(
        "Node",
        "test-node-0",
        lambda n: n["spec"].update(taints=[{"key": "maintenance", "effect": "NoExecute"}]),
    )

    await eventually(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["patient"])


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        pytest.param([], 400, "body must be a JSON object", id="not-an-object"),
        pytest.param({"action": "explode"}, 400, '"action" must be one of', id="unknown-action"),
        pytest.param({"action": "cordon"}, 400, '"names"', id="names-required"),
        pytest.param(
            {"action": "remove", "names": ["nope"]},
            404,
            'nodes "nope" not found',
            id="unknown-node",
        ),
        pytest.param({"action": "add", "count": 0}, 400, '"count"', id="bad-count"),
        pytest.param({"action": "add", "cpu": "lots"}, 400, "invalid node shape", id="bad-cpu"),
    ],
)
async def test_node_operations_reject_bad_requests(
    cluster: Cluster, body: Any, code: int, message: str
) -> None:
    from flotilla.kubesim.errors import ApiError

    with pytest.raises(ApiError) as raised:
        http.apply(cluster.sim, body)
    assert raised.value.code == code
    assert message in raised.value.message


async def test_deleting_a_deployment_frees_node_capacity(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=6))
    await eventually(lambda: len(cluster.pods("Running")) == 6)
    assert sum(n.requested.get("cpu", 0) for n in cluster.sim.state.nodes.values()) == 600

    cluster.store.delete(cluster.rt("Deployment"), "default", "web")

    assert cluster.pods() == []
    assert cluster.sim.state.pods == {}
    assert all(not any(n.requested.values()) for n in cluster.sim.state.nodes.values())


async def test_pod_bound_to_a_future_node_starts_when_it_registers(cluster: Cluster) -> None:
    cluster.create(bare_pod("early", nodeName="late-node"))
    assert cluster.get("Pod", "early")["status"]["phase"] == "Pending"

    http.apply(cluster.sim, {"action": "add", "names": ["late-node"]})

    await eventually(lambda: cluster.get("Pod", "early")["status"]["phase"] == "Running")
    assert cluster.sim.state.nodes["late-node"].requested["pods"] == 1


async def test_simulator_picks_up_objects_created_before_it_started() -> None:
    store = Store()
    store.create(store.resource_type("apps/v1", "Deployment"), deployment(replicas=2))
    sim = Simulator(store, SimOptions(nodes=1, pod_ready_seconds=0.05), "late")
    await sim.start()
    try:
        cluster = Cluster(store, sim)
        await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 2)
    finally:
        await sim.stop()
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


def new_image(obj: dict[str, Any]) -> None:
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.28"


def images(cluster: Cluster) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in cluster.pods()}


async def test_recreate_deployment_replaces_all_pods_at_once(cluster: Cluster) -> None:
    recreate = deployment(replicas=3)
    recreate["spec"]["strategy"] = {"type": "Recreate"}
    cluster.create(recreate)
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 3)
    mixed: list[bool] = []
    unsubscribe = cluster.store.add_listener(
        cluster.rt("Pod"),
        lambda e: mixed.append(
            len(
                {
                    p.labels.get("pod-template-hash")
                    for p in cluster.sim.state.pods.values()
                    if p.active
                }
            )
            > 1
        ),
    )
    try:
        cluster.update_spec("Deployment", "web", new_image)
        await eventually(
            lambda: (
                (s := cluster.status("Deployment", "web")).get("observedGeneration") == 2
                and s.get("updatedReplicas") == 3
                and s.get("readyReplicas") == 3
            )
        )
    finally:
        unsubscribe()
    assert images(cluster) == {"nginx:1.28"}
    assert not any(mixed)  # old and new pods never ran side by side


async def test_statefulset_rolls_pods_from_the_highest_ordinal(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "replicas": 3,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "db"}},
                "template": template("db"),
            },
        }
    )
    await eventually(lambda: cluster.status("StatefulSet", "db").get("readyReplicas") == 3)
    deleted: list[str] = []
    unsubscribe = cluster.store.add_listener(
        cluster.rt("Pod"),
        lambda e: deleted.append(e.object["metadata"]["name"]) if e.type == "DELETED" else None,
    )
    try:
        cluster.update_spec("StatefulSet", "db", new_image)
        status = await eventually(
            lambda: (
                (s := cluster.status("StatefulSet", "db")).get("observedGeneration") == 2
                and s.get("updatedReplicas") == 3
                and s.get("readyReplicas") == 3
                and s
            )
        )
    finally:
        unsubscribe()
    assert deleted == ["db-2", "db-1", "db-0"]
    assert status["currentRevision"] == status["updateRevision"]
    assert images(cluster) == {"nginx:1.28"}


async def test_daemonset_rolls_one_node_at_a_time(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")},
        }
    )
    await eventually(lambda: cluster.status("DaemonSet", "agent").get("numberReady") == 3)
    unavailable: list[int] = []
    unsubscribe = cluster.store.add_listener(
        cluster.rt("Pod"),
        lambda e: unavailable.append(
            3 - sum(1 for p in cluster.sim.state.pods.values() if p.active and p.ready)
        ),
    )
    try:
        cluster.update_spec("DaemonSet", "agent", new_image)
        await eventually(
            lambda: (
                (s := cluster.status("DaemonSet", "agent")).get("observedGeneration") == 2
                and s.get("updatedNumberScheduled") == 3
                and s.get("numberReady") == 3
            )
        )
    finally:
        unsubscribe()
    assert images(cluster) == {"nginx:1.28"}
    assert max(unavailable) == 1


async def test_indexed_job_runs_each_index_once(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "shards", "namespace": "default"},
            "spec": {
                "completions": 3,
                "parallelism": 3,
                "completionMode": "Indexed",
                "template": template("shards", restartPolicy="Never"),
            },
        }
    )
    status = await eventually(
        lambda: (s := cluster.status("Job", "shards")).get("succeeded") == 3 and s
    )
    assert status["completedIndexes"] == "0,1,2"
    indexes = sorted(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        for p in cluster.pods()
    )
    assert indexes == ["0", "1", "2"]


async def test_pods_for_another_scheduler_or_gated_are_not_bound(cluster: Cluster) -> None:
    cluster.create(bare_pod("custom", schedulerName="my-scheduler"))
    cluster.create(bare_pod("gated", schedulingGates=[{"name": "example.com/quota"}]))
    cluster.create(bare_pod("plain"))

    await eventually(lambda: cluster.get("Pod", "plain")["status"]["phase"] == "Running")
    gated = await eventually(
        lambda: (p := cluster.get("Pod", "gated"))["status"].get("conditions") and p
    )
    assert condition(gated, "PodScheduled")["reason"] == "SchedulingGated"
    assert "nodeName" not in cluster.get("Pod", "custom")["spec"]
    assert "conditions" not in cluster.get("Pod", "custom")["status"]

    cluster.update_spec("Pod", "gated", lambda p: p["spec"].pop("schedulingGates"))

    await eventually(lambda: cluster.get("Pod", "gated")["status"]["phase"] == "Running")


async def test_a_bound_pod_reports_containers_creating_until_ready(
    cluster_factory: Callable[..., Any],
) -> None:
    slow: Cluster = await cluster_factory(nodes=1, pod_ready_seconds=30)
    slow.create(bare_pod("starting"))

    pod = await eventually(
        lambda: (p := slow.get("Pod", "starting"))["status"].get("containerStatuses") and p
    )
    assert pod["status"]["phase"] == "Pending"
    assert condition(pod, "PodScheduled")["status"] == "True"
    assert condition(pod, "Ready")["reason"] == "ContainersNotReady"
    assert pod["status"]["containerStatuses"][0]["state"] == {
        "waiting": {"reason": "ContainerCreating"}
    }
    assert pod["status"]["hostIP"]


async def test_orphaned_pods_keep_running_without_their_replicaset(cluster: Cluster) -> None:
    cluster.create(deployment(replicas=2))
    await eventually(lambda: len(cluster.pods("Running")) == 2)
    (replicaset,) = cluster.store.list(cluster.rt("ReplicaSet"), "default")[0]

    cluster.store.delete(cluster.rt("Deployment"), "default", "web", propagation="Orphan")
    cluster.store.delete(
        cluster.rt("ReplicaSet"), "default", replicaset["metadata"]["name"], propagation="Orphan"
    )

    assert len(cluster.pods("Running")) == 2
    assert all("ownerReferences" not in p["metadata"] for p in cluster.pods())
    assert all(r.owner_uid is None for r in cluster.sim.state.pods.values())
    assert cluster.sim.state.pods_by_owner == {}


async def test_statefulset_claims_bound_volumes_per_ordinal(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "db"}},
                "template": template("db"),
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        }
    )
    await eventually(lambda: cluster.status("StatefulSet", "db").get("readyReplicas") == 2)

    claims, _ = cluster.store.list(cluster.rt("PersistentVolumeClaim"), "default")
    assert [c["metadata"]["name"] for c in claims] == ["data-db-0", "data-db-1"]
    assert {c["status"]["phase"] for c in claims} == {"Bound"}
    assert cluster.get("Pod", "db-1")["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-1"}}
    ]

    cluster.store.delete(cluster.rt("StatefulSet"), "default", "db")

    assert cluster.pods() == []
    assert len(cluster.store.list(cluster.rt("PersistentVolumeClaim"), "default")[0]) == 2


async def test_min_ready_seconds_delays_availability(cluster: Cluster) -> None:
    patient = deployment(replicas=2)
    patient["spec"]["minReadySeconds"] = 1
    cluster.create(patient)

    ready_at = time.monotonic()
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 2)
    assert cluster.status("Deployment", "web").get("availableReplicas", 0) == 0

    await eventually(lambda: cluster.status("Deployment", "web").get("availableReplicas") == 2)
    assert time.monotonic() - ready_at >= 0.9
    assert condition(cluster.get("Deployment", "web"), "Available")["status"] == "True"


async def test_stuck_rollout_exceeds_its_progress_deadline(cluster: Cluster) -> None:
    stuck = deployment(replicas=2)
    stuck["spec"]["progressDeadlineSeconds"] = 1
    stuck["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12"
    cluster.create(stuck)

    def progressing() -> dict[str, Any]:
        conditions = cluster.status("Deployment", "web").get("conditions") or []
        return next((c for c in conditions if c["type"] == "Progressing"), {})

    await eventually(lambda: progressing().get("status") == "False")
    assert progressing()["reason"] == "ProgressDeadlineExceeded"
    assert condition(cluster.get("Deployment", "web"), "Available")["status"] == "False"

    http.apply(cluster.sim, {"action": "add", "count": 2, "cpu": "16"})

    await eventually(lambda: progressing().get("reason") == "NewReplicaSetAvailable")


@pytest.mark.parametrize(
    ("max_surge", "max_unavailable", "most_pods", "fewest_available"),
    [
        pytest.param(0, 2, 10, 8, id="no-surge-two-down"),
        pytest.param(3, 0, 13, 10, id="three-surge-none-down"),
        pytest.param("20%", "10%", 12, 9, id="percentages"),
    ],
)
async def test_rolling_update_stays_within_surge_and_unavailability(
    cluster: Cluster,
    max_surge: int | str,
    max_unavailable: int | str,
    most_pods: int,
    fewest_available: int,
) -> None:
    rolling = deployment(replicas=10)
    rolling["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
    }
    cluster.create(rolling)
    await eventually(lambda: cluster.status("Deployment", "web").get("availableReplicas") == 10)
    pods_seen: list[int] = []
    available_seen: list[int] = []

    def observe(event: StoreEvent) -> None:
        active = [p for p in cluster.sim.state.pods.values() if p.active]
        pods_seen.append(len(active))
        available_seen.append(sum(1 for p in active if p.ready))

    unsubscribe = cluster.store.add_listener(cluster.rt("Pod"), observe)
    try:
        cluster.update_spec("Deployment", "web", new_image)
        await eventually(
            lambda: (
                (s := cluster.status("Deployment", "web")).get("observedGeneration") == 2
                and s.get("updatedReplicas") == 10
                and s.get("availableReplicas") == 10
                and s.get("replicas") == 10
            )
        )
    finally:
        unsubscribe()
    assert images(cluster) == {"nginx:1.28"}
    assert max(pods_seen) <= most_pods
    assert min(available_seen) >= fewest_available


UNREACHABLE = "node.kubernetes.io/unreachable"


def pod_on(cluster: Cluster, node: str) -> dict[str, Any]:
    return next(p for p in cluster.pods() if p["spec"].get("nodeName") == node)


async def test_not_ready_node_stops_heartbeats_and_unreadies_its_pods(
    cluster_factory: Callable[..., Any],
) -> None:
    cluster: Cluster = await cluster_factory(nodes=3, heartbeat_seconds=0.02)
    cluster.create(deployment(replicas=3))
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 3)
    victim = pod_on(cluster, "test-node-0")["metadata"]["name"]

    def renewed(node: str) -> str:
        return str(cluster.get("Lease", node, LEASE_NAMESPACE)["spec"]["renewTime"])

    http.apply(cluster.sim, {"action": "not-ready", "names": ["test-node-0"]})

    node = cluster.get("Node", "test-node-0", None)
    assert condition(node, "Ready")["status"] == "Unknown"
    assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
        (UNREACHABLE, "NoSchedule"),
        (UNREACHABLE, "NoExecute"),
    }
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 2)
    assert condition(cluster.get("Pod", victim), "Ready")["reason"] == "NodeNotReady"
    frozen, other = renewed("test-node-0"), renewed("test-node-1")
    await eventually(lambda: renewed("test-node-1") != other)
    assert renewed("test-node-0") == frozen
    assert cluster.sim.stats()["unreachableNodes"] == 1

    http.apply(cluster.sim, {"action": "ready", "names": ["test-node-0"]})

    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 3)
    node = cluster.get("Node", "test-node-0", None)
    assert "taints" not in node["spec"]
    assert condition(node, "Ready")["status"] == "True"
    assert cluster.get("Pod", victim)["spec"]["nodeName"] == "test-node-0"
    await eventually(lambda: renewed("test-node-0") != frozen)


async def test_pods_tolerating_unreachable_briefly_are_evicted_and_replaced(
    cluster: Cluster,
) -> None:
    impatient = deployment(
        replicas=3,
        tolerations=[
            {
                "key": UNREACHABLE,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 0,
            }
        ],
    )
    cluster.create(impatient)
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 3)

    http.apply(cluster.sim, {"action": "not-ready", "names": ["test-node-0"]})

    await eventually(
        lambda: (
            cluster.status("Deployment", "web").get("readyReplicas") == 3
            and all(p["spec"]["nodeName"] != "test-node-0" for p in cluster.pods())
        )
    )
