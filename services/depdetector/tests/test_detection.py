from __future__ import annotations

import json
import random
from typing import Any

import pytest

from flotilla.common.api import DependencyEntry
from flotilla.common.builders import manifest, resource_interpreter
from flotilla.common.interpreters import Registry
from flotilla.depdetector import detection

# --- builders -----------------------------------------------------------------------


class PodSpec:
    """Builds a PodSpec that uses the things a test names, e.g.
    ``PodSpec().with_service_account("web").with_config_map_volume("cfg").build()``."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] = {"containers": [{"name": "app", "image": "web:1"}]}

    @property
    def app(self) -> dict[str, Any]:
        container: dict[str, Any] = self.spec["containers"][0]
        return container

    def with_service_account(self, name: str) -> PodSpec:
        self.spec["serviceAccountName"] = name
        return self

    def with_config_map_volume(self, name: str) -> PodSpec:
        self.spec.setdefault("volumes", []).append({"name": name, "configMap": {"name": name}})
        return self

    def with_secret_volume(self, name: str) -> PodSpec:
        self.spec.setdefault("volumes", []).append({"name": name, "secret": {"secretName": name}})
        return self

    def with_pvc(self, name: str) -> PodSpec:
        volume = {"name": "data", "persistentVolumeClaim": {"claimName": name}}
        self.spec.setdefault("volumes", []).append(volume)
        return self

    def with_volume(self, **volume: Any) -> PodSpec:
        self.spec.setdefault("volumes", []).append({"name": "extra", **volume})
        return self

    def with_projected(self, config_map: str, secret: str) -> PodSpec:
        sources = [{"configMap": {"name": config_map}}, {"secret": {"name": secret}}]
        self.spec.setdefault("volumes", []).append(
            {"name": "projected", "projected": {"sources": [*sources, {"serviceAccountToken": {}}]}}
        )
        return self

    def with_secret_env(self, secret: str, key: str = "password") -> PodSpec:
        ref = {"secretKeyRef": {"name": secret, "key": key}}
        self.app.setdefault("env", []).append({"name": key.upper(), "valueFrom": ref})
        return self

    def with_config_map_env(self, config_map: str) -> PodSpec:
        ref = {"configMapKeyRef": {"name": config_map, "key": "level"}}
        self.app.setdefault("env", []).append({"name": "LEVEL", "valueFrom": ref})
        return self

    def with_env_from(self, config_map: str | None = None, secret: str | None = None) -> PodSpec:
        env_from = self.app.setdefault("envFrom", [])
        if config_map:
            env_from.append({"configMapRef": {"name": config_map}})
        if secret:
            env_from.append({"secretRef": {"name": secret}})
        return self

    def with_init_container_env_from(self, secret: str) -> PodSpec:
        init = {"name": "init", "image": "init:1", "envFrom": [{"secretRef": {"name": secret}}]}
        self.spec.setdefault("initContainers", []).append(init)
        return self

    def with_image_pull_secret(self, name: str) -> PodSpec:
        self.spec.setdefault("imagePullSecrets", []).append({"name": name})
        return self

    def build(self) -> dict[str, Any]:
        return self.spec


def deployment(pod: PodSpec, **kw: Any) -> dict[str, Any]:
    return manifest(
        "apps/v1",
        "Deployment",
        {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod.build()}},
        **kw,
    )


def dep(
    kind: str,
    name: str,
    namespace: str | None = "shop",
    api_version: str = "v1",
    detected: bool = True,
) -> DependencyEntry:
    return DependencyEntry(
        api_version=api_version, kind=kind, name=name, namespace=namespace, detected=detected
    )


def detect(obj: dict[str, Any], registry: Registry | None = None) -> list[DependencyEntry]:
    registry = registry or Registry.with_builtins()
    return detection.detect(obj, registry.for_object(obj))


# --- pod specs ----------------------------------------------------------------------


def test_deployment_yields_exactly_its_five_dependencies() -> None:
    pod = (
        PodSpec()
        .with_service_account("web-sa")
        .with_config_map_volume("web-config")
        .with_secret_env("db-credentials")
        .with_pvc("web-data")
        .with_image_pull_secret("registry")
    )
    assert detect(deployment(pod)) == [
        dep("ConfigMap", "web-config"),
        dep("PersistentVolumeClaim", "web-data"),
        dep("Secret", "db-credentials"),
        dep("Secret", "registry"),
        dep("ServiceAccount", "web-sa"),
    ]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(PodSpec(), [], id="nothing"),
        pytest.param(PodSpec().with_secret_volume("tls"), [dep("Secret", "tls")], id="secret-vol"),
        pytest.param(
            PodSpec().with_projected("ca", "token"),
            [dep("ConfigMap", "ca"), dep("Secret", "token")],
            id="projected",
        ),
        pytest.param(
            PodSpec().with_env_from(config_map="env", secret="keys"),
            [dep("ConfigMap", "env"), dep("Secret", "keys")],
            id="env-from",
        ),
        pytest.param(
            PodSpec().with_config_map_env("logging"), [dep("ConfigMap", "logging")], id="env-cm"
        ),
        pytest.param(
            PodSpec().with_init_container_env_from("migrations"),
            [dep("Secret", "migrations")],
            id="init-container",
        ),
        pytest.param(
            PodSpec().with_volume(
                csi={"driver": "secrets-store", "nodePublishSecretRef": {"name": "csi-creds"}}
            ),
            [dep("Secret", "csi-creds")],
            id="csi-node-publish-secret",
        ),
        pytest.param(
            PodSpec().with_volume(azureFile={"secretName": "azure", "shareName": "data"}),
            [dep("Secret", "azure")],
            id="azure-file",
        ),
        pytest.param(
            PodSpec().with_volume(
                rbd={"image": "x", "monitors": ["m"], "secretRef": {"name": "ceph"}}
            ),
            [dep("Secret", "ceph")],
            id="rbd-secret-ref",
        ),
        pytest.param(
            PodSpec().with_config_map_volume("cfg").with_config_map_env("cfg"),
            [dep("ConfigMap", "cfg")],
            id="same-object-twice",
        ),
    ],
)
def test_pod_spec_references(pod: PodSpec, expected: list[DependencyEntry]) -> None:
    assert detect(deployment(pod)) == expected


def test_deprecated_service_account_field_counts_only_alone() -> None:
    spec = PodSpec().build()
    spec["serviceAccount"] = "old"
    assert detect(manifest("v1", "Pod", spec)) == [dep("ServiceAccount", "old")]
    spec["serviceAccountName"] = "new"
    assert detect(manifest("v1", "Pod", spec)) == [dep("ServiceAccount", "new")]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            manifest("v1", "Pod", PodSpec().with_pvc("scratch").build()),
            [dep("PersistentVolumeClaim", "scratch")],
            id="pod",
        ),
        pytest.param(
            manifest(
                "batch/v1",
                "CronJob",
                {
                    "jobTemplate": {
                        "spec": {"template": {"spec": PodSpec().with_secret_env("s3").build()}}
                    }
                },
            ),
            [dep("Secret", "s3")],
            id="cronjob",
        ),
        pytest.param(
            manifest(
                "apps/v1",
                "StatefulSet",
                {"serviceName": "db-headless", "template": {"spec": PodSpec().build()}},
            ),
            [dep("Service", "db-headless")],
            id="statefulset-governing-service",
        ),
        pytest.param(
            manifest(
                "example.com/v1",
                "Widget",
                {"podSpec": PodSpec().with_image_pull_secret("pull").build()},
            ),
            [],
            id="unknown-kind-pull-secret-not-guessed",
        ),
    ],
)
def test_pod_specs_come_from_the_interpreter(
    obj: dict[str, Any], expected: list[DependencyEntry]
) -> None:
    assert detect(obj) == expected


# --- interpreter-declared, owners and generic heuristics --------------------------------


def test_flink_deployment_declared_and_component_dependencies() -> None:
    registry = Registry.with_builtins()
    registry.register(resource_interpreter())
    flink = manifest(
        "flink.apache.org/v1beta1",
        "FlinkDeployment",
        {
            "serviceAccount": "flink",
            "jobManager": {"replicas": 1, "podTemplate": {"spec": PodSpec().build()}},
            "taskManager": {
                "replicas": 3,
                "podTemplate": {"spec": PodSpec().with_config_map_volume("flink-conf").build()},
            },
        },
    )
    assert detect(flink, registry) == [
        dep("ConfigMap", "flink-conf"),
        dep("ServiceAccount", "flink"),
    ]


def test_owner_references() -> None:
    obj = manifest("apps/v1", "ReplicaSet", {"template": {"spec": PodSpec().build()}})
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "web",
            "uid": "1",
            "controller": True,
        }
    ]
    assert detect(obj) == [dep("Deployment", "web", api_version="apps/v1")]


def test_role_binding_depends_on_its_role_and_service_accounts() -> None:
    binding = manifest(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        subjects=[
            {"kind": "ServiceAccount", "name": "web-sa"},
            {"kind": "ServiceAccount", "name": "ops", "namespace": "ops"},
            {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"},
        ],
    )
    assert detect(binding) == [
        dep("Role", "reader", api_version="rbac.authorization.k8s.io/v1"),
        dep("ServiceAccount", "ops", namespace="ops"),
        dep("ServiceAccount", "web-sa"),
    ]
    binding["roleRef"]["kind"] = "ClusterRole"
    assert dep("Role", "reader", api_version="rbac.authorization.k8s.io/v1") not in detect(binding)


def widget(spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return manifest("example.com/v1", "Widget", spec, **kw)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            widget({"backend": {"apiVersion": "example.com/v1", "kind": "Database", "name": "pg"}}),
            [dep("Database", "pg", api_version="example.com/v1")],
            id="nested-apiVersion-kind-name",
        ),
        pytest.param(
            widget(
                {
                    "targets": [
                        {
                            "ref": {
                                "apiVersion": "v1",
                                "kind": "ConfigMap",
                                "name": "a",
                                "namespace": "other",
                            }
                        }
                    ]
                }
            ),
            [dep("ConfigMap", "a", namespace="other")],
            id="nested-in-list-with-namespace",
        ),
        pytest.param(
            widget(
                {
                    "class": {
                        "apiVersion": "storage.k8s.io/v1",
                        "kind": "StorageClass",
                        "name": "ssd",
                    }
                }
            ),
            [dep("StorageClass", "ssd", namespace=None, api_version="storage.k8s.io/v1")],
            id="cluster-scoped-kind-has-no-namespace",
        ),
        pytest.param(
            widget({"auth": {"tokenSecretRef": {"name": "tok", "key": "t"}}}),
            [dep("Secret", "tok")],
            id="suffix-SecretRef",
        ),
        pytest.param(
            widget({"secretRef": {"name": "creds"}, "configMapRef": {"name": "cfg"}}),
            [dep("ConfigMap", "cfg"), dep("Secret", "creds")],
            id="secretRef-configMapRef",
        ),
        pytest.param(
            widget({"settingsConfigMapKeyRef": {"name": "cfg", "key": "k"}}),
            [dep("ConfigMap", "cfg")],
            id="suffix-ConfigMapKeyRef",
        ),
        pytest.param(
            widget({"serviceAccountName": "robot", "storage": {"claimName": "data"}}),
            [dep("PersistentVolumeClaim", "data"), dep("ServiceAccount", "robot")],
            id="serviceAccountName-claimName",
        ),
        pytest.param(widget({"secretName": "generated-cert"}), [], id="secretName-is-not-guessed"),
        pytest.param(
            widget(
                {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "X", "name": "s"}}
            ),
            [],
            id="apiGroup-reference-has-no-version",
        ),
        pytest.param(
            widget({"secretRef": {"kind": "Vault", "name": "v"}}),
            [],
            id="ref-with-own-kind-is-not-a-secret",
        ),
        pytest.param(widget({"secretRef": {"key": "k"}}), [], id="ref-without-name"),
        pytest.param(
            widget({}, status={"lastRef": {"apiVersion": "v1", "kind": "Secret", "name": "old"}}),
            [],
            id="status-is-ignored",
        ),
        pytest.param(
            widget({"self": {"apiVersion": "example.com/v1", "kind": "Widget", "name": "web"}}),
            [],
            id="self-reference-is-ignored",
        ),
        pytest.param(
            widget({"serviceAccountName": "robot"}, namespace=None),
            [dep("ServiceAccount", "robot", namespace=None)],
            id="cluster-scoped-object",
        ),
    ],
)
def test_generic_heuristics(obj: dict[str, Any], expected: list[DependencyEntry]) -> None:
    assert detect(obj) == expected


# --- the annotation -------------------------------------------------------------------

USER_ENTRIES: list[dict[str, Any]] = [
    {"apiVersion": "example.com/v1", "kind": "Database", "name": "orders", "detected": False},
    {"apiVersion": "v1", "kind": "Secret", "name": "db-credentials", "namespace": "shop"},
]


def annotated_deployment(value: list[dict[str, Any]] | str) -> dict[str, Any]:
    text = value if isinstance(value, str) else json.dumps(value)
    pod = PodSpec().with_secret_env("db-credentials").with_config_map_volume("web-config")
    return deployment(pod, annotations={"flotilla.io/dependencies": text})


def test_user_entries_are_kept_verbatim_and_first() -> None:
    obj = annotated_deployment(USER_ENTRIES)
    registry = Registry.with_builtins()
    assert detection.dependencies(obj, registry.for_object(obj)) == [
        dep("Database", "orders", namespace=None, api_version="example.com/v1", detected=False),
        dep("Secret", "db-credentials", detected=False),
        dep("ConfigMap", "web-config"),
    ]


def test_second_run_writes_byte_identical_annotation() -> None:
    obj = annotated_deployment(USER_ENTRIES)
    interpreter = Registry.with_builtins().for_object(obj)
    first = detection.annotation_value(obj, interpreter)
    obj["metadata"]["annotations"]["flotilla.io/dependencies"] = first
    second = detection.annotation_value(obj, interpreter)
    assert second == first
    assert first == (
        '[{"apiVersion":"example.com/v1","kind":"Database","name":"orders","detected":false},'
        '{"apiVersion":"v1","kind":"Secret","name":"db-credentials","namespace":"shop",'
        '"detected":false},'
        '{"apiVersion":"v1","kind":"ConfigMap","name":"web-config","namespace":"shop",'
        '"detected":true}]'
    )


def test_stale_detected_entries_are_replaced() -> None:
    stale: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "name": "gone",
        "namespace": "shop",
        "detected": True,
    }
    obj = annotated_deployment([stale])
    interpreter = Registry.with_builtins().for_object(obj)
    assert [e.name for e in detection.dependencies(obj, interpreter)] == [
        "web-config",
        "db-credentials",
    ]


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        pytest.param(
            {"apiVersion": "v1", "kind": "Secret", "name": "db-credentials"},
            ["db-credentials", "web-config"],
            id="namespace-omitted-means-own",
        ),
        pytest.param(
            {"apiVersion": "v1", "kind": "Secret", "name": "db-credentials", "namespace": "ops"},
            ["db-credentials", "web-config", "db-credentials"],
            id="other-namespace-is-another-object",
        ),
    ],
)
def test_user_entry_without_namespace_covers_the_detected_one(
    user: dict[str, Any], expected: list[str]
) -> None:
    obj = annotated_deployment([user])
    interpreter = Registry.with_builtins().for_object(obj)
    assert [e.name for e in detection.dependencies(obj, interpreter)] == expected


def test_cluster_scoped_user_entry_matches_without_namespace() -> None:
    user = [
        dep("StorageClass", "ssd", namespace=None, api_version="storage.k8s.io/v1", detected=False)
    ]
    detected = [dep("StorageClass", "ssd", namespace=None, api_version="storage.k8s.io/v1")]
    assert detection.merge_dependencies(user, detected, namespace="shop") == [
        dep("StorageClass", "ssd", namespace=None, api_version="storage.k8s.io/v1", detected=False)
    ]


@pytest.mark.parametrize("seed", range(5))
def test_merge_does_not_depend_on_detection_order(seed: int) -> None:
    detected = [dep("Secret", "b"), dep("ConfigMap", "z"), dep("Secret", "a"), dep("Secret", "a")]
    shuffled = detected[:]
    random.Random(seed).shuffle(shuffled)
    user = [dep("Secret", "a", detected=False), dep("Secret", "a", detected=False)]
    assert detection.merge_dependencies(user, shuffled) == [
        dep("Secret", "a", detected=False),
        dep("ConfigMap", "z"),
        dep("Secret", "b"),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("not json", "flotilla.io/dependencies: not JSON", id="not-json"),
        pytest.param('{"kind": "Secret"}', "expected a JSON list", id="not-a-list"),
        pytest.param(
            '[{"apiVersion":"v1","kind":"Secret","name":"a"},{"kind":"Secret","name":"b"}]',
            r"flotilla.io/dependencies\[1\]: apiVersion: Field required",
            id="entry-missing-field",
        ),
        pytest.param(
            '[{"apiVersion":"v1","kind":"Secret","name":"a","detectd":false}]',
            r"\[0\]: detectd: unknown field",
            id="entry-typo",
        ),
    ],
)
def test_malformed_annotation_is_reported(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detection.user_dependencies(annotated_deployment(value))


# --- scope: what an object may depend on ------------------------------------------------


API_VERSIONS = {
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "CustomResourceDefinition": "apiextensions.k8s.io/v1",
    "IngressClass": "networking.k8s.io/v1",
    "PriorityClass": "scheduling.k8s.io/v1",
    "RuntimeClass": "node.k8s.io/v1",
    "StorageClass": "storage.k8s.io/v1",
}


def ref(kind: str, name: str, namespace: str | None = None) -> Any:
    api_version = API_VERSIONS.get(kind, "v1")
    return DependencyEntry(api_version=api_version, kind=kind, name=name, namespace=namespace)


SYSTEM = "flotilla-system"
OWN = "Flotilla's own"
NOT_ALLOWED = "not a kind objects may depend on"
# (id, dependent kind, dependent namespace, dependency, refused because … or None)
SCOPE_CASES = [
    ("same namespace", "Deployment", "shop", ref("Secret", "db", "shop"), None),
    ("no namespace means own", "Deployment", "shop", ref("ConfigMap", "cfg"), None),
    ("other namespace", "Deployment", "bad", ref("Secret", "db", "shop"), "must be in"),
    ("member kubeconfig", "Deployment", "bad", ref("Secret", "us-east", SYSTEM), OWN),
    ("system namespace even when own", "Deployment", SYSTEM, ref("Secret", "us-east"), OWN),
    ("cluster-scoped object, system ns", "ClusterIssuer", None, ref("Secret", "x", SYSTEM), OWN),
    ("cluster-scoped object, any ns", "ClusterIssuer", None, ref("Secret", "ca", "certs"), None),
    ("own Namespace", "Deployment", "shop", ref("Namespace", "shop"), None),
    ("another Namespace", "Deployment", "shop", ref("Namespace", "other"), "its own namespace"),
    ("system Namespace", "ClusterIssuer", None, ref("Namespace", SYSTEM), OWN),
    ("PriorityClass", "Deployment", "shop", ref("PriorityClass", "high"), None),
    ("StorageClass", "PersistentVolumeClaim", "shop", ref("StorageClass", "fast"), None),
    ("IngressClass", "Ingress", "shop", ref("IngressClass", "nginx"), None),
    ("RuntimeClass", "Pod", "shop", ref("RuntimeClass", "gvisor"), None),
    ("ClusterRole from a RoleBinding", "RoleBinding", "shop", ref("ClusterRole", "view"), None),
    ("ClusterRole otherwise", "Deployment", "shop", ref("ClusterRole", "x"), "only a RoleBinding"),
    ("ClusterRoleBinding", "Deployment", "shop", ref("ClusterRoleBinding", "root"), NOT_ALLOWED),
    ("Node", "Deployment", "shop", ref("Node", "n1"), NOT_ALLOWED),
    ("CRD", "Widget", "shop", ref("CustomResourceDefinition", "x"), NOT_ALLOWED),
]


@pytest.mark.parametrize(
    ("kind", "namespace", "entry", "refused"),
    [case[1:] for case in SCOPE_CASES],
    ids=[case[0] for case in SCOPE_CASES],
)
def test_dependency_scope(
    kind: str, namespace: str | None, entry: DependencyEntry, refused: str | None
) -> None:
    why = detection.refusal(
        entry, kind=kind, namespace=namespace, system_namespace="flotilla-system"
    )
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_within_scope_keeps_order_and_says_why() -> None:
    entries = [ref("Secret", "db"), ref("Secret", "x", "flotilla-system"), ref("ConfigMap", "c")]
    allowed, refused = detection.within_scope(
        entries, kind="Deployment", namespace="shop", system_namespace="flotilla-system"
    )
    assert [e.name for e in allowed] == ["db", "c"]
    assert [(e.name, "Flotilla's own" in why) for e, why in refused] == [("x", True)]
