"""The store keeps sub-objects that many objects repeat once, invisibly to readers."""

from __future__ import annotations

import json
from typing import Any

from flotilla.kubesim import store as store_module
from flotilla.kubesim.store import Store, WatchRecord

from .simcluster import Cluster, bare_pod, container, deployment, eventually, template


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}], **spec},
    }


def test_equal_pod_parts_are_stored_once_and_copies_stay_independent() -> None:
    store = Store()
    pod_rt = store.resource_type("v1", "Pod")
    store.create(pod_rt, _pod("a"))
    store.create(pod_rt, _pod("b"))
    a = store.get_frozen(pod_rt, "default", "a")
    b = store.get_frozen(pod_rt, "default", "b")
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["spec"]["tolerations"] is b["spec"]["tolerations"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    # A change to one pod's (shared) part is a change to that pod only.
    changed = store.get(pod_rt, "default", "a")
    changed["spec"]["containers"][0]["image"] = "nginx:1.28"
    changed["metadata"]["labels"]["app"] = "api"
    store.update(pod_rt, changed)
    assert store.get(pod_rt, "default", "b")["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert store.get(pod_rt, "default", "b")["metadata"]["labels"] == {"app": "web"}
    assert store.get(pod_rt, "default", "a")["spec"]["containers"][0]["image"] == "nginx:1.28"
    # What callers get is their own copy.
    copy = store.get(pod_rt, "default", "b")
    copy["spec"]["containers"][0]["name"] = "mutated"
    assert store.get_frozen(pod_rt, "default", "a") is not None
    assert store.get(pod_rt, "default", "b")["spec"]["containers"][0]["name"] == "app"


def test_values_equal_in_python_but_not_in_json_are_not_merged() -> None:
    store = Store()
    pod_rt = store.resource_type("v1", "Pod")
    store.create(pod_rt, _pod("a", nodeSelector={"x": "1"}, affinity={"weight": 1}))
    store.create(pod_rt, _pod("b", nodeSelector={"x": "1"}, affinity={"weight": True}))
    store.create(pod_rt, _pod("c", nodeSelector={"x": "1"}, affinity={"weight": 1.0}))
    weights = [
        store.get_frozen(pod_rt, "default", name)["spec"]["affinity"]["weight"]
        for name in ("a", "b", "c")
    ]
    assert [type(w) for w in weights] == [int, bool, float]


def test_the_canonical_cache_is_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(store_module, "SHARED_CACHE_SIZE", 8)
    store = Store()
    pod_rt = store.resource_type("v1", "Pod")
    for index in range(40):
        store.create(pod_rt, _pod(f"p{index}", nodeSelector={"n": str(index)}))
    assert len(store._shared) <= 8
    assert store.get(pod_rt, "default", "p3")["spec"]["nodeSelector"] == {"n": "3"}


def test_events_carry_no_generation_as_upstream() -> None:
    store = Store()
    event = store.create(
        store.resource_type("v1", "Event"),
        {
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Scheduled",
        },
    )
    assert "generation" not in event["metadata"]
    pod = store.create(store.resource_type("v1", "Pod"), _pod("p"))
    assert pod["metadata"]["generation"] == 1


def test_one_timestamp_string_per_second(monkeypatch: Any) -> None:
    clock = [1_700_000_000.1]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    first = store_module.now_rfc3339()
    clock[0] = 1_700_000_000.9
    assert store_module.now_rfc3339() is first
    assert first == "2023-11-14T22:13:20Z"
    clock[0] = 1_700_000_001.0
    assert store_module.now_rfc3339() == "2023-11-14T22:13:21Z"


def test_readers_get_the_canonical_instance_of_equal_data() -> None:
    store = Store()
    first = store.shared({"cpu": 100, "pods": 1})
    assert store.shared({"cpu": 100, "pods": 1}) is first
    assert store.shared({"cpu": 100.0, "pods": 1}) is not first
    assert store.shared([]) == [] and store.shared([]) is store.shared([])


async def test_what_the_simulator_stores_never_changes_afterwards(cluster: Cluster) -> None:
    # The simulator reads stored pods without copying them and builds its writes from
    # their parts (bindings, statuses): every object a watcher was handed must still
    # serialize as it did when it was committed, through a rollout, a scale-down, an
    # unschedulable pod, node readiness flips and a Job running to completion.
    committed: list[tuple[dict[str, Any], str]] = []

    def keep(record: WatchRecord) -> None:
        for obj in (record.object, record.old):
            if obj is not None:
                committed.append((obj, json.dumps(obj)))

    kinds = ("Pod", "ReplicaSet", "Deployment", "Job", "Node")
    unsubscribes = [cluster.store.add_record_listener(cluster.rt(kind), keep) for kind in kinds]
    try:
        cluster.create(deployment(replicas=4))
        await eventually(lambda: cluster.status("Deployment", "web").get("readyReplicas") == 4)

        def new_image(d: dict[str, Any]) -> None:
            d["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.28"

        cluster.update_spec("Deployment", "web", new_image)
        await eventually(
            lambda: (
                (s := cluster.status("Deployment", "web")).get("updatedReplicas") == 4
                and s.get("availableReplicas") == 4
                and s.get("replicas") == 4
            )
        )
        cluster.update_spec("Deployment", "web", lambda d: d["spec"].update(replicas=2))
        cluster.create(bare_pod("big", containers=[container(cpu="12")]))
        cluster.create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "batch", "namespace": "default"},
                "spec": {"completions": 2, "template": template("batch", restartPolicy="Never")},
            }
        )
        await eventually(lambda: cluster.status("Job", "batch").get("succeeded") == 2)
        nodes = sorted(cluster.sim.state.nodes)
        cluster.sim.set_nodes_ready(nodes, False)
        cluster.sim.set_nodes_ready(nodes, True)
        await eventually(lambda: len(cluster.pods("Running")) == 2)
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()
    assert len(committed) > 100
    changed = [text for obj, text in committed if json.dumps(obj) != text]
    assert changed == []


def test_an_owned_update_hands_the_object_over_and_returns_the_stored_one() -> None:
    store = Store()
    pod_rt = store.resource_type("v1", "Pod")
    store.create(pod_rt, _pod("a"))
    status = {"phase": "Running", "podIP": "10.64.0.1"}
    meta = {"name": "a", "namespace": "default"}
    stored = store.update(
        pod_rt, {"metadata": meta, "status": status}, subresource="status", owned=True
    )
    assert stored is store.get_frozen(pod_rt, "default", "a")
    assert stored["status"] is status  # handed over, not copied
    # Without `owned`, the caller's object is copied in and a copy comes back.
    other = {"phase": "Succeeded"}
    copy = store.update(pod_rt, {"metadata": meta, "status": other}, subresource="status")
    assert copy is not store.get_frozen(pod_rt, "default", "a")
    assert store.get_frozen(pod_rt, "default", "a")["status"] is not other
    assert copy["status"] == other
