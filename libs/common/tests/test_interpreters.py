from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.common import interpreters, paths
from flotilla.common.api import GroupVersionKind, Strategy
from flotilla.common.builders import (
    FLINK_INTERPRETER,
    container,
    manifest,
    pod_spec,
    resource_interpreter,
    template,
)
from flotilla.common.interpreters import (
    Component,
    DuplicateInterpreterError,
    Follow,
    InterpretationError,
    InvalidInterpreterError,
    Registry,
)

GI = 2**30
MI = 2**20

# --- builders -----------------------------------------------------------------------


def deployment(replicas: int | None = 3, spec: dict[str, Any] | None = None, **kw: Any) -> Any:
    body: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}, "template": template(spec)}
    if replicas is not None:
        body["replicas"] = replicas
    return manifest("apps/v1", "Deployment", body, **kw)


def flink_deployment(jobmanager: int = 1, taskmanager: int = 3) -> dict[str, Any]:
    def component(replicas: int, cpu: str, memory: str) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "podTemplate": template(
                pod_spec(container("flink", requests={"cpu": cpu, "memory": memory}))
            ),
        }

    return manifest(
        "flink.apache.org/v1beta1",
        "FlinkDeployment",
        {
            "serviceAccount": "flink",
            "jobManager": component(jobmanager, "1", "2Gi"),
            "taskManager": component(taskmanager, "2", "4Gi"),
        },
    )


@pytest.fixture
def registry() -> Registry:
    return Registry.with_builtins()


# --- strategies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_version", "kind", "strategy"),
    [
        ("apps/v1", "Deployment", Strategy.SPLIT),
        ("apps/v1", "ReplicaSet", Strategy.SPLIT),
        ("apps/v1", "StatefulSet", Strategy.ANY),
        ("apps/v1", "DaemonSet", Strategy.COPY),
        ("batch/v1", "Job", Strategy.ANY),
        ("batch/v1", "CronJob", Strategy.ANY),
        ("v1", "Pod", Strategy.ANY),
        ("v1", "Service", Strategy.AS_NEEDED),
        ("networking.k8s.io/v1", "Ingress", Strategy.AS_NEEDED),
        ("v1", "Namespace", Strategy.AS_NEEDED),
        ("v1", "ServiceAccount", Strategy.AS_NEEDED),
        ("v1", "ConfigMap", Strategy.AS_NEEDED),
        ("v1", "Secret", Strategy.AS_NEEDED),
        ("v1", "PersistentVolumeClaim", Strategy.AS_NEEDED),
        ("rbac.authorization.k8s.io/v1", "Role", Strategy.AS_NEEDED),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", Strategy.AS_NEEDED),
        ("example.com/v1", "Widget", Strategy.ANY),
        ("apps/v1beta2", "Deployment", Strategy.ANY),
    ],
    ids=lambda v: str(v),
)
def test_default_strategy(
    registry: Registry, api_version: str, kind: str, strategy: Strategy
) -> None:
    interpretation = registry.interpret(manifest(api_version, kind, {}))
    assert interpretation.strategy is strategy


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param("copy", Strategy.COPY, id="copy"),
        pytest.param("as-needed", Strategy.AS_NEEDED, id="as-needed"),
        pytest.param("any", Strategy.ANY, id="any"),
    ],
)
def test_strategy_annotation_overrides(registry: Registry, annotation: str, expected: Any) -> None:
    obj = deployment(annotations={"flotilla.io/strategy": annotation})
    interpretation = registry.interpret(obj)
    assert interpretation.strategy is expected


def test_unknown_strategy_annotation_is_rejected_with_the_choices(registry: Registry) -> None:
    obj = deployment(annotations={"flotilla.io/strategy": "spread"})
    with pytest.raises(
        InterpretationError,
        match=r"annotation flotilla.io/strategy: unknown strategy 'spread'; "
        r"use one of split, copy, any, as-needed",
    ):
        registry.interpret(obj)


# --- replicas and requests ----------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "replicas"),
    [
        pytest.param(deployment(replicas=5), 5, id="deployment"),
        pytest.param(deployment(replicas=0), 0, id="scaled-to-zero"),
        pytest.param(deployment(replicas=None), 1, id="defaulted"),
        pytest.param(
            manifest("batch/v1", "Job", {"parallelism": 4, "template": template()}), 4, id="job"
        ),
        pytest.param(
            manifest(
                "batch/v1",
                "CronJob",
                {"jobTemplate": {"spec": {"parallelism": 2, "template": template()}}},
            ),
            2,
            id="cronjob",
        ),
        pytest.param(manifest("apps/v1", "DaemonSet", {"template": template()}), 1, id="daemonset"),
    ],
)
def test_replicas(registry: Registry, obj: dict[str, Any], replicas: int) -> None:
    assert registry.interpret(obj).replicas == replicas


@pytest.mark.parametrize("bad", ["three", -1, 1.5, True])
def test_bad_replicas_name_the_path(registry: Registry, bad: Any) -> None:
    obj = deployment()
    obj["spec"]["replicas"] = bad
    with pytest.raises(InterpretationError, match=r"\.spec\.replicas: replicas must be"):
        registry.interpret(obj)


@pytest.mark.parametrize(
    ("spec", "requests"),
    [
        pytest.param(pod_spec(container()), {}, id="no-resources"),
        pytest.param(
            pod_spec(container(requests={"cpu": "250m", "memory": "64Mi"})),
            {"cpu": 250, "memory": 64 * MI},
            id="one-container",
        ),
        pytest.param(
            pod_spec(
                container("a", requests={"cpu": "250m", "memory": "64Mi"}),
                container("b", requests={"cpu": "1", "nvidia.com/gpu": 1}),
            ),
            {"cpu": 1250, "memory": 64 * MI, "nvidia.com/gpu": 1},
            id="containers-add-up",
        ),
        pytest.param(
            pod_spec(container(limits={"cpu": "2", "memory": "1Gi"}, requests={"cpu": "1"})),
            {"cpu": 1000, "memory": GI},
            id="limit-without-request-counts",
        ),
        pytest.param(
            pod_spec(
                container(requests={"cpu": "500m", "memory": "64Mi"}),
                initContainers=[
                    container("migrate", requests={"cpu": "2", "memory": "32Mi"}),
                    container("warm", requests={"cpu": "100m"}),
                ],
            ),
            {"cpu": 2000, "memory": 64 * MI},
            id="init-container-peak",
        ),
        pytest.param(
            pod_spec(
                container(requests={"cpu": "500m"}),
                initContainers=[
                    {**container("proxy", requests={"cpu": "200m"}), "restartPolicy": "Always"},
                    container("migrate", requests={"cpu": "600m"}),
                ],
            ),
            {"cpu": 800},
            id="sidecar-runs-beside-later-init-and-app",
        ),
        pytest.param(
            pod_spec(container(requests={"cpu": "1"}), overhead={"cpu": "250m", "memory": "120Mi"}),
            {"cpu": 1250, "memory": 120 * MI},
            id="pod-overhead",
        ),
    ],
)
def test_requests_per_replica(registry: Registry, spec: dict[str, Any], requests: Any) -> None:
    assert registry.interpret(deployment(spec=spec)).requests == requests
    assert registry.interpret(manifest("v1", "Pod", spec)).requests == requests


def test_total_requests_multiply_by_replicas(registry: Registry) -> None:
    obj = deployment(replicas=4, spec=pod_spec(container(requests={"cpu": "250m"})))
    assert registry.interpret(obj).total_requests == {"cpu": 1000}


def test_cronjob_requests_come_from_the_job_template(registry: Registry) -> None:
    job_template = template(pod_spec(container(requests={"memory": "1Gi"})))
    obj = manifest("batch/v1", "CronJob", {"jobTemplate": {"spec": {"template": job_template}}})
    assert registry.interpret(obj).requests == {"memory": GI}


def test_bad_quantity_names_the_field(registry: Registry) -> None:
    obj = deployment(spec=pod_spec(container(requests={"cpu": "lots"})))
    with pytest.raises(
        InterpretationError,
        match=r"\.spec\.template\.spec\.containers\[0\]\.resources\.requests\.cpu: .*'lots'",
    ):
        registry.interpret(obj)


# --- multi-component workloads (a FlinkDeployment) --------------------------------------


def test_flink_deployment_components(registry: Registry) -> None:
    registry.register(resource_interpreter())
    interpretation = registry.interpret(flink_deployment(jobmanager=1, taskmanager=3))
    assert interpretation.strategy is Strategy.ANY
    assert interpretation.components == [
        Component(name="jobmanager", replicas=1, requests={"cpu": 1000, "memory": 2 * GI}),
        Component(name="taskmanager", replicas=3, requests={"cpu": 2000, "memory": 4 * GI}),
    ]
    assert interpretation.components[1].total_requests == {"cpu": 6000, "memory": 12 * GI}
    assert interpretation.total_requests == {"cpu": 7000, "memory": 14 * GI}
    assert [r.path for r in interpretation.status_aggregation] == [".status.readyReplicas"]


def test_flink_without_an_interpreter_is_an_opaque_any(registry: Registry) -> None:
    interpretation = registry.interpret(flink_deployment())
    assert interpretation.strategy is Strategy.ANY
    assert interpretation.components == []
    assert interpretation.total_requests == {}


# --- registry -----------------------------------------------------------------------


def test_declared_interpreter_overrides_builtin_until_removed(registry: Registry) -> None:
    declared = resource_interpreter(
        "deployments-copy",
        target={"apiVersion": "apps/v1", "kind": "Deployment"},
        strategy="copy",
        components=[],
        podTemplate={"path": ".spec.template"},
    )
    registry.register(declared)
    gvk = GroupVersionKind("apps", "v1", "Deployment")
    assert registry.lookup(gvk).source == "ResourceInterpreter/deployments-copy"
    assert registry.interpret(deployment()).strategy is Strategy.COPY
    registry.unregister(gvk)
    assert registry.lookup(gvk).source == "built-in"
    assert registry.interpret(deployment()).strategy is Strategy.SPLIT


def test_duplicate_declared_interpreter_is_an_error(registry: Registry) -> None:
    registry.register(resource_interpreter("flink"))
    with pytest.raises(
        DuplicateInterpreterError,
        match=r"ResourceInterpreter/flink-2 and ResourceInterpreter/flink both describe "
        r"flink.apache.org/v1beta1, Kind=FlinkDeployment",
    ):
        registry.register(resource_interpreter("flink-2"))


def test_duplicate_builtin_is_an_error() -> None:
    registry = Registry()
    registry.register_builtin(interpreters.BUILTINS[0])
    with pytest.raises(DuplicateInterpreterError, match="built-in and built-in"):
        registry.register_builtin(interpreters.BUILTINS[0])


def test_builtins_declare_each_type_once() -> None:
    gvks = [spec.target.gvk for spec in interpreters.BUILTINS]
    assert len(gvks) == len(set(gvks))


def test_bad_path_in_an_interpreter_names_the_field(registry: Registry) -> None:
    spec_components = copy.deepcopy(FLINK_INTERPRETER["spec"]["components"])
    spec_components[1]["podTemplatePath"] = ".spec.taskManager..podTemplate"
    with pytest.raises(
        InvalidInterpreterError,
        match=r"ResourceInterpreter/flink: spec\.components\[1\]\.podTemplatePath: .*position 18",
    ):
        registry.register(resource_interpreter(components=spec_components))


# --- follows ------------------------------------------------------------------------


def test_service_follows_workloads_its_selector_matches(registry: Registry) -> None:
    service = manifest("v1", "Service", {"selector": {"app": "web"}, "ports": [{"port": 80}]})
    assert registry.interpret(service).follows == [
        Follow(namespace="shop", pod_labels={"app": "web"})
    ]


def test_service_without_selector_follows_nothing(registry: Registry) -> None:
    assert registry.interpret(manifest("v1", "Service", {"ports": [{"port": 80}]})).follows == []


def test_ingress_follows_its_backend_services_once_each(registry: Registry) -> None:
    def backend(name: str) -> dict[str, Any]:
        return {"backend": {"service": {"name": name, "port": {"number": 80}}}}

    ingress = manifest(
        "networking.k8s.io/v1",
        "Ingress",
        {
            "defaultBackend": backend("web")["backend"],
            "rules": [
                {"host": "a.example", "http": {"paths": [backend("web"), backend("api")]}},
                {"host": "b.example", "http": {"paths": [backend("api")]}},
            ],
        },
    )
    follows = registry.interpret(ingress).follows
    assert [(f.kind, f.name, f.namespace) for f in follows] == [
        ("Service", "web", "shop"),
        ("Service", "api", "shop"),
    ]


# --- what later stages read through an interpreter ------------------------------------


@pytest.mark.parametrize(
    ("obj", "path", "replicas"),
    [
        pytest.param(deployment(replicas=6), ("spec", "replicas"), 2, id="deployment"),
        pytest.param(deployment(replicas=None), ("spec", "replicas"), 4, id="replicas-unset"),
        pytest.param(
            manifest("batch/v1", "Job", {"parallelism": 5, "template": template()}),
            ("spec", "parallelism"),
            1,
            id="job-parallelism",
        ),
    ],
)
def test_with_replicas_renders_one_clusters_share_and_leaves_the_object_alone(
    registry: Registry, obj: dict[str, Any], path: tuple[str, str], replicas: int
) -> None:
    before = copy.deepcopy(obj)
    rendered = registry.for_object(obj).with_replicas(obj, replicas)
    assert rendered[path[0]][path[1]] == replicas
    assert obj == before
    rendered[path[0]][path[1]] = before[path[0]].get(path[1])
    if path[1] not in before[path[0]]:
        del rendered[path[0]][path[1]]
    assert rendered == before, "nothing but the replicas changes"


def test_with_replicas_refuses_a_type_that_cannot_be_split(registry: Registry) -> None:
    pod = manifest("v1", "Pod", pod_spec())
    with pytest.raises(InterpretationError, match="v1, Kind=Pod declares no replicas path"):
        registry.for_object(pod).with_replicas(pod, 2)


def test_status_rules_pair_each_compiled_path_with_its_op(registry: Registry) -> None:
    rules = registry.for_object(deployment()).status_rules
    assert [(path.text, op.value) for path, op in rules] == [
        (".status.replicas", "sum"),
        (".status.readyReplicas", "sum"),
        (".status.availableReplicas", "sum"),
        (".status.updatedReplicas", "sum"),
        (".status.unavailableReplicas", "sum"),
    ]
    status = {"status": {"readyReplicas": 2}}
    assert paths.get_all(status, rules[1][0]) == [2]
