"""The store keeps sub-objects that many objects repeat once, invisibly to readers."""

from __future__ import annotations

from typing import Any

from flotilla.kubesim import store as store_module
from flotilla.kubesim.store import Store


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
