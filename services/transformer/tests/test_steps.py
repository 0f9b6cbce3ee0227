"""The sync pipeline's steps, one table each."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.common.events import ObjectRef
from flotilla.common.interpreters import Registry
from flotilla.transformer import steps
from flotilla.transformer.steps import ClusterFacts, Work
from flotilla.transformer.transformations import RenderError

REGISTRY = Registry.with_builtins()


def work_for(obj: dict[str, Any], cluster: ClusterFacts | None = None, **fields: Any) -> Work:
    return Work(
        ref=ObjectRef.of(obj),
        cluster=cluster or ClusterFacts("c1"),
        decision_id="d-1",
        interpreter=REGISTRY.for_object(obj),
        **fields,
    )


SERVER_METADATA = {
    "uid": "u-1",
    "resourceVersion": "42",
    "generation": 3,
    "creationTimestamp": "2026-01-01T00:00:00Z",
    "managedFields": [{"manager": "kubectl"}],
    "ownerReferences": [{"uid": "o-1", "kind": "X", "name": "x", "apiVersion": "v1"}],
    "selfLink": "/x",
}


def with_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(copy.deepcopy(SERVER_METADATA))
    obj["metadata"]["annotations"] = {"flotilla.io/placement": "{}", "team": "a"}
    obj["status"] = {"observedGeneration": 3}
    return obj


def service() -> dict[str, Any]:
    return manifest(
        "v1",
        "Service",
        {
            "type": "NodePort",
            "clusterIP": "10.0.0.7",
            "clusterIPs": ["10.0.0.7"],
            "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}],
        },
    )


def job() -> dict[str, Any]:
    labels = {
        "app": "train",
        "controller-uid": "u-1",
        "job-name": "train",
        "batch.kubernetes.io/controller-uid": "u-1",
        "batch.kubernetes.io/job-name": "train",
    }
    spec = template(pod_spec(restartPolicy="Never"))
    spec["metadata"]["labels"] = dict(labels)
    obj = manifest(
        "batch/v1",
        "Job",
        {"selector": {"matchLabels": {"controller-uid": "u-1"}}, "template": spec},
        name="train",
    )
    obj["metadata"]["labels"] = dict(labels)
    return obj


STRIP_CASES = [
    ("metadata and status", with_server_fields(manifest("v1", "ConfigMap", data={"a": "1"})), {}),
    (
        "service addresses",
        with_server_fields(service()),
        {
            "type": "NodePort",
            "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080}],
        },
    ),
    (
        "pvc volume name",
        with_server_fields(
            manifest("v1", "PersistentVolumeClaim", {"volumeName": "pv-1", "resources": {}})
        ),
        {"resources": {}},
    ),
    (
        "job selector and controller labels",
        with_server_fields(job()),
        {
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": pod_spec(restartPolicy="Never"),
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("obj", "spec"), [c[1:] for c in STRIP_CASES], ids=[c[0] for c in STRIP_CASES]
)
def test_strip_server_fields(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    stripped = steps.strip_server_fields(copy.deepcopy(obj), work_for(obj))
    assert "status" not in stripped
    assert not set(SERVER_METADATA) & set(stripped["metadata"])
    assert stripped["metadata"]["annotations"] == {"team": "a"}
    assert stripped.get("spec", {}) == spec
    if obj["kind"] == "Job":
        assert stripped["metadata"]["labels"] == {"app": "train"}


def test_origin_labels_and_annotations() -> None:
    obj = manifest("apps/v1", "Deployment", {"replicas": 1}, name="web")
    result = steps.origin(copy.deepcopy(obj), work_for(obj, hub_generation=4))
    assert result["metadata"]["labels"]["flotilla.io/origin"] == "apps-v1-deployment-shop-web"
    assert result["metadata"]["annotations"] == {
        "flotilla.io/origin": "apps/v1/Deployment/shop/web",
        "flotilla.io/decision": "d-1",
        "flotilla.io/hub-generation": "4",
    }


NAMESPACE_CASES = [
    ("namespaced object", manifest("v1", "ConfigMap"), "metadata.namespace", "eu-shop"),
    (
        "namespace itself",
        manifest("v1", "Namespace", name="shop", namespace=None),
        "metadata.name",
        "eu-shop",
    ),
    (
        "rolebinding subjects",
        manifest(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            subjects=[{"kind": "ServiceAccount", "name": "app", "namespace": "shop"}],
        ),
        "subjects.0.namespace",
        "eu-shop",
    ),
]


def at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


@pytest.mark.parametrize(
    ("obj", "path", "expected"),
    [c[1:] for c in NAMESPACE_CASES],
    ids=[c[0] for c in NAMESPACE_CASES],
)
def test_namespace_mapping(obj: dict[str, Any], path: str, expected: str) -> None:
    mapped = ClusterFacts("eu", {steps.NAMESPACE_PREFIX_LABEL: "eu-"})
    assert at(steps.namespace_mapping(copy.deepcopy(obj), work_for(obj, mapped)), path) == expected
    unmapped = steps.namespace_mapping(copy.deepcopy(obj), work_for(obj))
    assert unmapped == obj


def test_namespace_mapping_refuses_an_invalid_namespace() -> None:
    obj = manifest("v1", "ConfigMap")
    cluster = ClusterFacts("eu", {steps.NAMESPACE_PREFIX_LABEL: "x" * 60 + "-"})
    with pytest.raises(RenderError, match="not a valid namespace name"):
        steps.namespace_mapping(obj, work_for(obj, cluster))


def test_security_defaults_fill_what_is_unset_on_restricted_clusters() -> None:
    app = container("app")
    app["securityContext"] = {
        "allowPrivilegeEscalation": True,
        "capabilities": {"drop": ["NET_RAW"]},
    }
    obj = manifest(
        "apps/v1",
        "Deployment",
        {"replicas": 1, "template": template(pod_spec(app, initContainers=[container("init")]))},
    )
    restricted = ClusterFacts("c1", {steps.SECURITY_DEFAULTS_LABEL: "restricted"})
    result = steps.security_defaults(copy.deepcopy(obj), work_for(obj, restricted))
    pod = result["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # An explicit choice is kept; the ALL drop is added to what the user drops.
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": True,
        "capabilities": {"drop": ["NET_RAW", "ALL"]},
    }
    assert pod["initContainers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    untouched = steps.security_defaults(copy.deepcopy(obj), work_for(obj))
    assert untouched == obj


def test_pipeline_refuses_a_duplicate_step() -> None:
    pipeline = steps.Pipeline()
    pipeline.register("a")(steps.origin)
    with pytest.raises(ValueError, match="already registered"):
        pipeline.register("a")(steps.strip_server_fields)
    assert steps.PIPELINE.names == (
        "strip-server-fields",
        "transformations",
        "origin",
        "namespace-mapping",
        "security-defaults",
    )


@pytest.mark.parametrize(
    ("obj", "path", "expected"),
    [
        (
            manifest("v1", "Service", {"clusterIP": "None", "clusterIPs": ["None"]}),
            "spec",
            {"clusterIP": "None", "clusterIPs": ["None"]},
        ),
        (
            manifest(
                "batch/v1",
                "Job",
                {"manualSelector": True, "selector": {"matchLabels": {"run": "x"}}},
            ),
            "spec.selector",
            {"matchLabels": {"run": "x"}},
        ),
    ],
    ids=["headless service keeps clusterIP None", "manual job selector is kept"],
)
def test_strip_keeps_what_the_user_chose(obj: dict[str, Any], path: str, expected: Any) -> None:
    assert at(steps.strip_server_fields(copy.deepcopy(obj), work_for(obj)), path) == expected
