"""Events: one object through two APIs, field selectors, expiry, and what the simulator records."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from flotilla.kubesim import events
from flotilla.kubesim.__main__ import build, parse_args
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import recorder
from flotilla.kubesim.store import Store
from flotilla.kubesim.testing import http_session

from .simcluster import Cluster, bare_pod, container, deployment, eventually, template

CORE = "/api/v1/namespaces/default/events"
NEW = "/apis/events.k8s.io/v1/namespaces/default/events"


def warning(name: str = "hub-warning") -> dict[str, Any]:
    """A Warning Event as a Flotilla service writes one on a hub object (core/v1)."""
    return {
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "name": "member-1",
            "namespace": "default",
            "uid": "u-1",
            "fieldPath": "spec",
        },
        "reason": "Unreachable",
        "message": "member-1 stopped answering",
        "type": "Warning",
        "source": {"component": "flotilla-watcher"},
        "reportingComponent": "flotilla-watcher",
        "reportingInstance": "watcher-0",
        "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:05:00Z",
    }


async def _call(hub: KubeSim, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        http_session(hub) as http,
        http.request(
            method, f"{hub.url}{path}", json=body, headers={"Authorization": f"Bearer {hub.token}"}
        ) as resp,
    ):
        return resp.status, await resp.json()


async def test_a_core_event_is_the_same_object_through_events_k8s_io(hub: KubeSim) -> None:
    status, created = await _call(hub, "POST", CORE, warning())
    assert status == 201, created
    status, seen = await _call(hub, "GET", f"{NEW}/hub-warning")
    assert status == 200, seen
    assert seen["apiVersion"] == "events.k8s.io/v1"
    assert seen["metadata"]["uid"] == created["metadata"]["uid"]
    assert seen["regarding"] == created["involvedObject"]
    assert seen["note"] == "member-1 stopped answering"
    assert seen["reportingController"] == "flotilla-watcher"
    assert seen["deprecatedSource"] == {"component": "flotilla-watcher"}
    assert seen["deprecatedCount"] == 3
    assert seen["deprecatedLastTimestamp"] == "2026-01-01T00:05:00Z"
    assert "involvedObject" not in seen and "message" not in seen


async def test_an_events_k8s_io_event_is_read_back_through_core(hub: KubeSim) -> None:
    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "scheduled"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "default-scheduler",
        "reportingInstance": "default-scheduler-kubesim",
        "action": "Binding",
        "reason": "Scheduled",
        "regarding": {"kind": "Pod", "name": "web-0", "namespace": "default"},
        "note": "Successfully assigned default/web-0 to node-1",
        "type": "Normal",
    }
    status, created = await _call(hub, "POST", NEW, new_style)
    assert status == 201, created
    assert created["regarding"]["name"] == "web-0"
    _, core = await _call(hub, "GET", f"{CORE}/scheduled")
    assert core["kind"] == "Event" and core["apiVersion"] == "v1"
    assert core["involvedObject"] == {"kind": "Pod", "name": "web-0", "namespace": "default"}
    assert core["message"] == new_style["note"]
    assert core["reportingComponent"] == "default-scheduler"
    # An update through the new API lands on the same object.
    created["note"] = "changed"
    status, updated = await _call(hub, "PUT", f"{NEW}/scheduled", created)
    assert status == 200, updated
    assert (await _call(hub, "GET", f"{CORE}/scheduled"))[1]["message"] == "changed"
    assert (await _call(hub, "DELETE", f"{NEW}/scheduled"))[0] == 200
    assert (await _call(hub, "GET", f"{CORE}/scheduled"))[0] == 404


@pytest.mark.parametrize(
    ("path", "selector", "found"),
    [
        (CORE, "involvedObject.kind=Cluster,involvedObject.name=member-1", True),
        (CORE, "involvedObject.uid=u-1,involvedObject.fieldPath=spec", True),
        (CORE, "involvedObject.apiVersion=flotilla.io/v1alpha1", True),
        (CORE, "involvedObject.name=other", False),
        (CORE, "reason=Unreachable,type=Warning", True),
        (CORE, "source=flotilla-watcher", True),
        (CORE, "source=kubelet", False),
        (NEW, "regarding.kind=Cluster,regarding.name=member-1", True),
        (NEW, "regarding.namespace=default,reason=Unreachable", True),
        (NEW, "regarding.name=other", False),
        (NEW, "reportingController=flotilla-watcher", True),
    ],
)
async def test_field_selectors_of_both_apis(
    hub: KubeSim, path: str, selector: str, found: bool
) -> None:
    await _call(hub, "POST", CORE, warning())
    status, listed = await _call(hub, "GET", f"{path}?fieldSelector={selector}")
    assert status == 200, listed
    assert [e["metadata"]["name"] for e in listed["items"]] == (["hub-warning"] if found else [])


async def test_watching_through_events_k8s_io_sees_core_writes(hub: KubeSim) -> None:
    async with (
        http_session(hub) as http,
        http.get(
            f"{hub.url}{NEW}",
            params={"watch": "1", "fieldSelector": "regarding.name=member-1"},
            headers={"Authorization": f"Bearer {hub.token}"},
        ) as resp,
    ):
        await _call(hub, "POST", CORE, warning())
        line = await resp.content.readline()
    event = json.loads(line)
    assert event["type"] == "ADDED"
    assert event["object"]["apiVersion"] == "events.k8s.io/v1"
    assert event["object"]["note"] == "member-1 stopped answering"


async def test_events_expire_a_ttl_after_their_last_write() -> None:
    store = Store()
    now = [1000.0]
    expiry = events.Expiry(store, ttl=3600, clock=lambda: now[0])
    expiry.start()
    try:
        rt = store.resource_type("v1", "Event")
        store.create(rt, warning("old"))
        now[0] += 1800
        young = store.create(rt, warning("young"))
        now[0] += 1800
        assert expiry.expire() == 1
        assert [e["metadata"]["name"] for e in store.list(rt)[0]] == ["young"]
        young["count"] = 4  # a write renews the lease
        store.update(rt, young)
        now[0] += 3599
        assert expiry.expire() == 0
        now[0] += 1
        assert expiry.expire() == 1
        assert store.list(rt)[0] == []
    finally:
        await expiry.stop()


async def test_kubesim_expires_events_with_its_configured_ttl() -> None:
    async with KubeSim("short", hub=True, event_ttl=0.2) as sim:
        rt = sim.store.resource_type("v1", "Event")
        sim.store.create(rt, warning())
        await eventually(lambda: sim.store.count(rt) == 0)


def test_cli_flag_sets_the_event_ttl() -> None:
    args = parse_args(
        ["--name", "x", "--port", "0", "--kubeconfig", "k", "--hub", "--event-ttl", "60"]
    )
    assert build(args).event_expiry.ttl == 60.0
    args = parse_args(["--name", "x", "--port", "0", "--kubeconfig", "k", "--hub"])
    assert build(args).event_expiry.ttl == events.DEFAULT_TTL_SECONDS


# -- what the simulator records ------------------------------------------------------------------


def _events(cluster: Cluster, **involved: str) -> list[dict[str, Any]]:
    rt = cluster.store.resource_type("v1", "Event")
    selector = ",".join(f"involvedObject.{k}={v}" for k, v in involved.items())
    return cluster.store.list(rt, None, None, selector)[0]


def _reasons(cluster: Cluster, **involved: str) -> list[tuple[str, str, str]]:
    return sorted(
        (e["reason"], e["source"]["component"], e["message"]) for e in _events(cluster, **involved)
    )


async def test_pod_lifecycle_events(cluster: Cluster) -> None:
    cluster.create(bare_pod("solo"))
    await eventually(lambda: len(_events(cluster, kind="Pod", name="solo")) >= 5)
    pod = cluster.get("Pod", "solo")
    node = pod["spec"]["nodeName"]
    by_reason = {e["reason"]: e for e in _events(cluster, kind="Pod", name="solo")}
    scheduled = by_reason["Scheduled"]
    assert scheduled["message"] == f"Successfully assigned default/solo to {node}"
    assert scheduled["source"] == {"component": "default-scheduler"}
    assert scheduled["involvedObject"]["uid"] == pod["metadata"]["uid"]
    started = by_reason["Started"]
    assert started["source"] == {"component": "kubelet", "host": node}
    assert started["involvedObject"]["fieldPath"] == "spec.containers{app}"
    assert started["message"] == "Started container app"
    assert by_reason["Pulling"]["message"] == 'Pulling image "nginx:1.27"'
    assert by_reason["Created"]["message"] == "Created container: app"
    assert started["count"] == 1 and started["type"] == "Normal"
    assert started["firstTimestamp"] and started["lastTimestamp"]

    cluster.store.delete(cluster.rt("Pod"), "default", "solo")
    await eventually(lambda: any(e["reason"] == "Killing" for e in _events(cluster, name="solo")))


async def test_unschedulable_pod_gets_a_failed_scheduling_warning(cluster: Cluster) -> None:
    cluster.create(bare_pod("huge", containers=[container(cpu="100")]))
    found = await eventually(
        lambda: [e for e in _events(cluster, name="huge") if e["reason"] == "FailedScheduling"]
    )
    assert found[0]["type"] == "Warning"
    assert found[0]["message"].startswith("0/3 nodes are available")


async def test_deployment_and_replicaset_events(cluster: Cluster) -> None:
    cluster.create(deployment("web", replicas=2))
    await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 2)
    (rs,) = cluster.store.list(cluster.rt("ReplicaSet"), "default")[0]
    rs_name = rs["metadata"]["name"]
    await eventually(lambda: len(_events(cluster, kind="ReplicaSet")) == 2)
    assert _reasons(cluster, kind="Deployment", name="web") == [
        (
            "ScalingReplicaSet",
            "deployment-controller",
            f"Scaled up replica set {rs_name} from 0 to 2",
        )
    ]
    created = _reasons(cluster, kind="ReplicaSet", name=rs_name)
    assert {r[:2] for r in created} == {("SuccessfulCreate", "replicaset-controller")}
    assert all(r[2].startswith(f"Created pod: {rs_name}-") for r in created)

    cluster.update_spec("Deployment", "web", lambda d: d["spec"].update(replicas=1))
    await eventually(
        lambda: any(r[0] == "SuccessfulDelete" for r in _reasons(cluster, kind="ReplicaSet"))
    )
    assert (
        "ScalingReplicaSet",
        "deployment-controller",
        f"Scaled down replica set {rs_name} from 2 to 1",
    ) in _reasons(cluster, kind="Deployment", name="web")


async def test_job_completion_is_recorded(cluster: Cluster) -> None:
    cluster.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "once", "namespace": "default"},
            "spec": {"template": template("once", restartPolicy="Never")},
        }
    )
    await eventually(
        lambda: ("Completed", "job-controller", "Job completed") in _reasons(cluster, name="once")
    )
    assert any(r[0] == "SuccessfulCreate" for r in _reasons(cluster, kind="Job", name="once"))


async def test_node_not_ready_is_recorded_on_node_and_pods(cluster: Cluster) -> None:
    cluster.create(bare_pod("p", nodeName="test-node-0"))
    await eventually(lambda: cluster.get("Pod", "p")["status"].get("phase") == "Running")
    cluster.sim.set_nodes_ready(["test-node-0"], False)
    await eventually(
        lambda: (
            ("NodeNotReady", "node-controller", "Node test-node-0 status is now: NodeNotReady")
            in _reasons(cluster, kind="Node", name="test-node-0")
        )
    )
    await eventually(
        lambda: (
            ("NodeNotReady", "node-controller", "Node is not ready") in _reasons(cluster, name="p")
        )
    )


async def test_repeated_events_are_aggregated(cluster: Cluster) -> None:
    involved = {"kind": "Pod", "namespace": "default", "name": "x", "uid": "u"}
    for _ in range(3):
        cluster.sim.recorder.record(involved, "Warning", "BackOff", "Back-off", "kubelet", "n")
    cluster.sim.recorder.record(involved, "Warning", "BackOff", "other", "kubelet", "n")
    cluster.sim.recorder.flush()
    found = sorted(
        (e["message"], e["count"]) for e in _events(cluster, name="x") if e["reason"] == "BackOff"
    )
    assert found == [("Back-off", 3), ("other", 1)]


async def test_a_repeat_bumps_a_new_version_and_keeps_what_a_client_added(
    cluster: Cluster,
) -> None:
    rt = cluster.store.resource_type("v1", "Event")
    handed: list[tuple[dict[str, Any], str]] = []
    unsubscribe = cluster.store.add_record_listener(
        rt, lambda record: handed.append((record.object, json.dumps(record.object)))
    )
    involved = {"kind": "Pod", "namespace": "default", "name": "y", "uid": "u-y"}
    try:
        cluster.sim.recorder.record(involved, "Warning", "BackOff", "Back-off", "kubelet", "n")
        cluster.sim.recorder.flush()
        (first,) = _events(cluster, name="y")
        first["related"] = {"kind": "Node", "name": "n"}  # a client's addition
        cluster.store.update(rt, first)
        for _ in range(2):
            cluster.sim.recorder.record(involved, "Warning", "BackOff", "Back-off", "kubelet", "n")
        cluster.sim.recorder.flush()
    finally:
        unsubscribe()
    (event,) = _events(cluster, name="y")
    assert event["count"] == 3
    assert event["related"] == {"kind": "Node", "name": "n"}
    assert len(handed) == 4
    # Every version a watcher was handed still reads as it did then.
    assert [json.dumps(obj) for obj, _ in handed] == [text for _, text in handed]


async def test_many_similar_events_are_combined_like_client_go(cluster: Cluster) -> None:
    involved = {"kind": "ReplicaSet", "namespace": "default", "name": "rs", "uid": "u-rs"}
    for i in range(15):
        cluster.sim.recorder.record(
            involved, "Normal", "SuccessfulCreate", f"Created pod: rs-{i}", "replicaset-controller"
        )
    cluster.sim.recorder.flush()
    found = sorted((e["message"], e["count"]) for e in _events(cluster, name="rs"))
    singles = [(f"Created pod: rs-{i}", 1) for i in range(9)]
    assert found == sorted([*singles, ("(combined from similar events): Created pod: rs-14", 6)])


async def test_event_recording_can_be_switched_off(cluster_factory: Any) -> None:
    quiet: Cluster = await cluster_factory(nodes=1, record_events=False)
    quiet.create(bare_pod("silent"))
    await eventually(lambda: quiet.get("Pod", "silent")["status"].get("phase") == "Running")
    assert _events(quiet) == []
    args = parse_args(["--name", "x", "--port", "0", "--kubeconfig", "k", "--no-events"])
    assert args.no_events is True


async def test_events_wait_while_the_simulator_is_busy() -> None:
    store = Store()
    busy = [True]
    writer = recorder.Recorder(store, lambda *_: True, lambda: busy[0])
    task = asyncio.create_task(writer.run())
    try:
        involved = {"kind": "Pod", "namespace": "default", "name": "p", "uid": "u"}
        writer.record(involved, "Normal", "Started", "Started container c", "kubelet", "n")
        await asyncio.sleep(0.05)
        rt = store.resource_type("v1", "Event")
        assert store.count(rt) == 0 and len(writer) == 1
        busy[0] = False
        await eventually(lambda: store.count(rt) == 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_stored_events_stay_compact_and_read_as_plain_json(cluster: Cluster) -> None:
    """Recorded Events share their key table (and repeated texts) across Events."""
    import sys

    cluster.create(bare_pod("compact"))
    await eventually(lambda: len(_events(cluster, kind="Pod", name="compact")) >= 5)
    rt = cluster.store.resource_type("v1", "Event")
    stored = [
        e
        for e in cluster.store.iter_frozen(rt)
        if e["involvedObject"].get("name") == "compact" and e["reason"] in ("Created", "Started")
    ]
    assert len(stored) == 2
    for event in stored:
        assert sys.getsizeof(event) < sys.getsizeof(dict(event))
        assert json.loads(json.dumps(event)) == dict(event)
        assert event["apiVersion"] == "v1" and event["kind"] == "Event"
    created, started = sorted(stored, key=lambda e: e["reason"])
    assert created["involvedObject"] is started["involvedObject"]
    assert "generation" not in created["metadata"]
