"""The defaults a real API server fills in, table-driven like the module under test."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.kubesim import defaults

from . import builders


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("nginx:1.27", "IfNotPresent"),
        ("registry:5000/team/app", "Always"),
        ("registry:5000/team/app:v2", "IfNotPresent"),
        ("nginx@sha256:abc", "IfNotPresent"),
    ],
)
def test_image_pull_policy_follows_the_tag(image: str, policy: str) -> None:
    assert defaults.image_pull_policy(image) == policy


def _deployment(**spec: Any) -> dict[str, Any]:
    obj = builders.deployment("web", containers=[builders.container(ports=[{"containerPort": 80}])])
    obj["spec"].update(spec)
    return obj


CASES = [
    ("apps", "Deployment", _deployment(), "spec.revisionHistoryLimit", 10),
    ("apps", "Deployment", _deployment(), "spec.progressDeadlineSeconds", 600),
    ("apps", "Deployment", _deployment(), "spec.strategy.rollingUpdate.maxSurge", "25%"),
    (
        "apps",
        "Deployment",
        _deployment(strategy={"type": "Recreate"}),
        "spec.strategy",
        {"type": "Recreate"},
    ),
    ("apps", "Deployment", _deployment(), "spec.template.spec.dnsPolicy", "ClusterFirst"),
    ("apps", "Deployment", _deployment(), "spec.template.spec.schedulerName", "default-scheduler"),
    ("apps", "Deployment", _deployment(), "spec.template.spec.securityContext", {}),
    (
        "apps",
        "Deployment",
        _deployment(),
        "spec.template.spec.containers.0.ports.0.protocol",
        "TCP",
    ),
    (
        "apps",
        "Deployment",
        _deployment(),
        "spec.template.spec.containers.0.terminationMessagePolicy",
        "File",
    ),
    ("apps", "StatefulSet", _deployment(), "spec.podManagementPolicy", "OrderedReady"),
    ("apps", "StatefulSet", _deployment(), "spec.updateStrategy.rollingUpdate.partition", 0),
    ("apps", "DaemonSet", _deployment(), "spec.updateStrategy.rollingUpdate.maxUnavailable", 1),
    ("batch", "Job", {"spec": {"template": {"spec": {"containers": []}}}}, "spec.completions", 1),
    ("batch", "Job", {"spec": {"parallelism": 3}}, "spec.completions", None),
    ("batch", "CronJob", {"spec": {}}, "spec.concurrencyPolicy", "Allow"),
    ("", "Service", {"spec": {"ports": [{"port": 80}]}}, "spec.ports.0.targetPort", 80),
    ("", "Service", {"spec": {}}, "spec.sessionAffinity", "None"),
    (
        "",
        "Pod",
        {"spec": {"containers": [{"name": "a", "image": "x"}]}},
        "spec.serviceAccountName",
        "default",
    ),
    ("", "Pod", {"spec": {"containers": []}}, "spec.enableServiceLinks", True),
    ("apps", "Deployment", _deployment(), "spec.template.spec.enableServiceLinks", None),
    ("", "Secret", {}, "type", "Opaque"),
]


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, list):
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj.get(part)
        else:
            return None
    return obj


@pytest.mark.parametrize(
    ("group", "kind", "obj", "path", "expected"),
    CASES,
    ids=[f"{kind}:{path}" for _, kind, _, path, _ in CASES],
)
def test_defaults(group: str, kind: str, obj: dict[str, Any], path: str, expected: Any) -> None:
    defaults.apply(group, kind, obj)
    assert _at(obj, path) == expected


def test_set_values_are_kept() -> None:
    obj = _deployment(revisionHistoryLimit=2)
    obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    defaults.apply("apps", "Deployment", obj)
    assert obj["spec"]["revisionHistoryLimit"] == 2
    assert obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Never"
