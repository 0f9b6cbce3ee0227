"""Readiness per kind, the status report and its dedup fingerprint, drift, ownership."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.common.api import ORIGIN_LABEL
from flotilla.common.events import ObjectRef
from flotilla.syncer import observation

from .builders import config_map, deployment


def _with(kind: str, spec: dict[str, Any], status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x", **meta}, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (_with("Deployment", {"replicas": 3}, {"availableReplicas": 3}), True),
        (_with("Deployment", {"replicas": 3}, {"availableReplicas": 2}), False),
        (_with("Deployment", {}, {"availableReplicas": 1}), True),
        (
            _with(
                "Deployment",
                {"replicas": 3},
                {"availableReplicas": 3, "observedGeneration": 1},
                generation=2,
            ),
            False,
        ),
        (_with("ReplicaSet", {"replicas": 2}, {"availableReplicas": 2}), True),
        (_with("StatefulSet", {"replicas": 2}, {"availableReplicas": 1}), False),
        (_with("DaemonSet", {}, {"desiredNumberScheduled": 3, "numberAvailable": 3}), True),
        (_with("DaemonSet", {}, {"desiredNumberScheduled": 3, "numberAvailable": 2}), False),
        (
            _with("Job", {}, {"conditions": [{"type": "Complete", "status": "True"}]}),
            True,
        ),
        (_with("Job", {"completions": 2}, {"succeeded": 2}), True),
        (_with("Job", {"completions": 2}, {"succeeded": 1}), False),
        (_with("Pod", {}, {"conditions": [{"type": "Ready", "status": "True"}]}), True),
        (_with("Pod", {}, {"conditions": [{"type": "Ready", "status": "False"}]}), False),
        (_with("ConfigMap", {}, {}), True),
    ],
    ids=[
        "deployment-available",
        "deployment-short",
        "deployment-default-one",
        "deployment-stale-generation",
        "replicaset",
        "statefulset-short",
        "daemonset-available",
        "daemonset-short",
        "job-complete",
        "job-succeeded",
        "job-running",
        "pod-ready",
        "pod-not-ready",
        "other-exists",
    ],
)
def test_ready_per_kind(obj: dict[str, Any], expected: bool) -> None:
    assert observation.ready(obj) is expected


def test_report_carries_generations_decision_and_readiness() -> None:
    live = deployment(replicas=2)
    live["metadata"]["generation"] = 4
    live["status"] = {"observedGeneration": 4, "availableReplicas": 2, "replicas": 2}
    ref = ObjectRef.of(live)
    report = observation.observed(ref, "east", live)
    assert (report.exists, report.ready, report.generation, report.observed_generation) == (
        True,
        True,
        4,
        4,
    )
    assert (report.hub_generation, report.decision_id) == (1, "d1")
    assert report.status["availableReplicas"] == 2
    gone = observation.observed(ref, "east", None)
    assert (gone.exists, gone.ready) == (False, False)


def test_fingerprint_changes_only_with_what_the_report_says() -> None:
    live = deployment()
    live["status"] = {"availableReplicas": 1}
    ref = ObjectRef.of(live)
    first = observation.fingerprint(observation.observed(ref, "east", live))
    live["metadata"]["resourceVersion"] = "99"  # not part of the report
    assert observation.fingerprint(observation.observed(ref, "east", live)) == first
    live["status"] = {"availableReplicas": 3}
    assert observation.fingerprint(observation.observed(ref, "east", live)) != first


def _live(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a server returns it: server fields and defaults added."""
    live = copy.deepcopy(manifest)
    live["metadata"].update({"uid": "u1", "resourceVersion": "7", "generation": 1})
    live["metadata"]["labels"]["added-by-someone"] = "yes"
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    live["status"] = {"replicas": 3}
    return live


def test_server_defaults_and_other_fields_are_not_drift() -> None:
    manifest = deployment()
    assert not observation.drifted(manifest, _live(manifest))


@pytest.mark.parametrize(
    "edit",
    [
        lambda o: o["spec"].__setitem__("replicas", 7),
        lambda o: o["spec"]["template"]["spec"]["containers"][0].__setitem__("image", "evil"),
        lambda o: o["metadata"]["labels"].pop(ORIGIN_LABEL),
        lambda o: o["spec"]["template"]["spec"]["containers"].append({"name": "extra"}),
        lambda o: o["spec"].pop("selector"),
    ],
    ids=["replicas", "image", "origin-label", "extra-container", "field-removed"],
)
def test_a_changed_flotilla_field_is_drift(edit: Any) -> None:
    manifest = deployment()
    live = _live(manifest)
    edit(live)
    assert observation.drifted(manifest, live)


def test_only_flotillas_copy_of_the_same_hub_object_may_be_deleted() -> None:
    ours = config_map()
    key = ObjectRef.of(ours).key
    assert observation.is_flotillas(ours, key)
    assert not observation.is_flotillas(ours, "v1/ConfigMap/shop/other")
    unlabelled = config_map()
    unlabelled["metadata"]["labels"] = {}
    assert not observation.is_flotillas(unlabelled, key)
    unannotated = config_map()
    unannotated["metadata"]["annotations"] = {}
    assert not observation.is_flotillas(unannotated, key)


def test_at_a_checked_generation_only_the_metadata_is_compared() -> None:
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"flotilla.io/origin": "hub"}},
        "spec": {"replicas": 2},
    }
    live = copy.deepcopy(manifest)
    live["metadata"]["generation"] = 3
    live["spec"]["replicas"] = 5
    assert observation.drifted(manifest, live)
    assert not observation.drifted(manifest, live, content=False)
    del live["metadata"]["labels"]["flotilla.io/origin"]
    assert observation.drifted(manifest, live, content=False)
