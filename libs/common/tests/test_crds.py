"""The CRD files and the pydantic models describe the same API.

The API server validates with the CRD schema, Flotilla with `flotilla.common.api`;
if they disagree a user can create an object Flotilla rejects (or the reverse).
These tests compare their field names, required fields and enums recursively, and
check the documented examples (docs/examples, the README) against both.
"""

from __future__ import annotations

import copy
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from flotilla.common import api
from flotilla.common.testing import CRD_DIR

CRD_FILES = sorted(CRD_DIR.glob("*.yaml"))

SPEC_MODELS: dict[str, type[BaseModel]] = {
    "Cluster": api.ClusterSpec,
    "PlacementPolicy": api.PlacementPolicySpec,
    "ClusterPlacementPolicy": api.PlacementPolicySpec,
    "ResourceInterpreter": api.ResourceInterpreterSpec,
    "Transformation": api.TransformationSpec,
    "ClusterTransformation": api.TransformationSpec,
}
STATUS_MODELS: dict[str, type[BaseModel]] = {"Cluster": api.ClusterStatus}


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


CRDS = {load(path)["spec"]["names"]["kind"]: load(path) for path in CRD_FILES}


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# --- shapes: field names, required fields and enums, recursively ---------------------

Shape = Any
ANY_VALUE = "any"


def _unwrap(annotation: Any) -> Any:
    """The type that decides a field's shape: no Optional, Annotated, list or dict."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif origin is list:
            annotation = typing.get_args(annotation)[0]
        elif origin is dict:
            return dict
        else:
            return annotation


def model_shape(annotation: Any) -> Shape:
    inner = _unwrap(annotation)
    if inner is typing.Any:
        return ANY_VALUE
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return frozenset(str(member.value) for member in inner)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        fields = {
            (info.alias or name): (model_shape(info.annotation), info.is_required())
            for name, info in inner.model_fields.items()
        }
        return {
            "fields": {alias: shape for alias, (shape, _) in fields.items()},
            "required": frozenset(alias for alias, (_, required) in fields.items() if required),
        }
    return None


def schema_shape(schema: dict[str, Any]) -> Shape:
    if schema.get("type") == "array":
        return schema_shape(schema["items"])
    if "enum" in schema:
        return frozenset(schema["enum"])
    if "properties" in schema:
        return {
            "fields": {name: schema_shape(sub) for name, sub in schema["properties"].items()},
            "required": frozenset(schema.get("required", [])),
        }
    if "type" not in schema and schema.get("x-kubernetes-preserve-unknown-fields"):
        return ANY_VALUE
    return None


def differences(model: Shape, schema: Shape, where: str = "") -> list[str]:
    """Readable differences between two shapes, so a failure says what drifted."""
    if isinstance(model, dict) and isinstance(schema, dict):
        found = []
        for name in sorted(model["fields"].keys() - schema["fields"].keys()):
            found.append(f"{where}.{name}: in the pydantic model, not in the CRD")
        for name in sorted(schema["fields"].keys() - model["fields"].keys()):
            found.append(f"{where}.{name}: in the CRD, not in the pydantic model")
        if model["required"] != schema["required"]:
            found.append(
                f"{where}: required {sorted(model['required'])} in the model, "
                f"{sorted(schema['required'])} in the CRD"
            )
        for name in sorted(model["fields"].keys() & schema["fields"].keys()):
            found += differences(model["fields"][name], schema["fields"][name], f"{where}.{name}")
        return found
    if model != schema:
        return [f"{where}: {model!r} in the model, {schema!r} in the CRD"]
    return []


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_spec_fields_agree(kind: str) -> None:
    schema = root_schema(CRDS[kind])["properties"]["spec"]
    assert differences(model_shape(SPEC_MODELS[kind]), schema_shape(schema), "spec") == []


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_status_fields_agree(kind: str) -> None:
    schema = root_schema(CRDS[kind])["properties"].get("status")
    if kind not in STATUS_MODELS:
        assert schema is None
        return
    assert differences(model_shape(STATUS_MODELS[kind]), schema_shape(schema), "status") == []


@pytest.mark.parametrize(
    "drift",
    [
        pytest.param(lambda s: s["properties"].pop("maxClusters"), id="field-removed"),
        pytest.param(lambda s: s["properties"].update(maxCluster={"type": "integer"}), id="typo"),
        pytest.param(lambda s: s["required"].clear(), id="required-dropped"),
        pytest.param(lambda s: s["properties"]["splitBy"]["enum"].pop(), id="enum-value-lost"),
        pytest.param(
            lambda s: s["properties"]["spread"]["properties"].pop("minGroups"), id="nested-field"
        ),
    ],
)
def test_drift_is_detected(drift: Any) -> None:
    schema = copy.deepcopy(root_schema(CRDS["PlacementPolicy"])["properties"]["spec"])
    drift(schema)
    assert differences(model_shape(api.PlacementPolicySpec), schema_shape(schema), "spec") != []


# --- the CRD files themselves ---------------------------------------------------------


def test_one_crd_per_flotilla_kind() -> None:
    assert sorted(CRDS) == sorted(api.MODELS)


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_crd_metadata(kind: str) -> None:
    crd = CRDS[kind]
    names = crd["spec"]["names"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{names['plural']}.{api.GROUP}"
    assert crd["spec"]["group"] == api.GROUP
    assert crd["spec"]["scope"] == ("Namespaced" if kind in api.NAMESPACED_KINDS else "Cluster")
    assert names["singular"] == kind.lower()
    assert names["listKind"] == f"{kind}List"
    assert names["shortNames"]
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (api.VERSION, True, True)
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Age"}


def test_short_names_are_unique() -> None:
    short = [n for crd in CRDS.values() for n in crd["spec"]["names"]["shortNames"]]
    assert len(short) == len(set(short))


def test_cluster_has_status_subresource_and_columns() -> None:
    [version] = CRDS["Cluster"]["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Ready", "Cordoned", "Draining", "Placements", "Age"]


def _walk(schema: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    nodes = [(where, schema)]
    for name, sub in schema.get("properties", {}).items():
        nodes += _walk(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        nodes += _walk(schema["items"], f"{where}[*]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += _walk(schema["additionalProperties"], f"{where}{{*}}")
    return nodes


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_schema_is_structural(kind: str) -> None:
    """Every node has a type, except int-or-string and free-form (patch) nodes."""
    untyped = [
        where
        for where, node in _walk(root_schema(CRDS[kind]), kind)
        if "type" not in node
        and not node.get("x-kubernetes-int-or-string")
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert untyped == []
    free_form = [
        where
        for where, node in _walk(root_schema(CRDS[kind]), kind)
        if node.get("x-kubernetes-preserve-unknown-fields")
    ]
    patch = f"{kind}.spec.transformations[*].patch"
    assert free_form == ([patch] if kind.endswith("Transformation") else [])


# --- the documented examples ---------------------------------------------------------
# Verbatim where the document is concrete. Where it abbreviates (`{...}`, `...`, a
# list of condition types, `{key, operator, …}`), the placeholder is filled with
# a concrete value of the shape the document describes; each is marked.

CLUSTER_EXAMPLE = """
apiVersion: flotilla.io/v1alpha1
kind: Cluster
metadata: {name: us-east, labels: {region: us-east, zone: us-east-1a, gpu: v100}}
spec:
  kubeconfigSecretRef: {namespace: flotilla-system, name: us-east, key: kubeconfig}
  taints: [{key: dedicated, value: batch, effect: NoSchedule}]   # NoSchedule | NoExecute
  unschedulable: false        # cordon: no new placements here
  evictAfter: null            # drain: RFC3339 time after which existing placements move away
status:
  conditions:                 # filled in: [Ready, Cordoned, Draining, Drained]
  - {type: Ready, status: "True", reason: Heartbeat, lastTransitionTime: "2026-11-29T12:00:00Z"}
  - {type: Cordoned, status: "False", reason: Schedulable}
  - {type: Draining, status: "False", reason: NoEviction}
  - {type: Drained, status: "False", reason: NoEviction}
  allocatable: {cpu: "24", memory: 96Gi, pods: "330"}
  available:   {cpu: "10", memory: 40Gi, pods: "200"}
  apiResources: [{group: apps, version: v1, kind: Deployment}]
  placements: 12              # objects still placed here
  lastHeartbeatTime: "2026-11-29T12:00:05Z"   # filled in: ...
"""

POLICY_SPEC_EXAMPLE = """
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: web,
                       labelSelector: {matchLabels: {app: web}}}]   # filled in: {...}
  priority: 0                       # highest wins when several match
  strategy: split                   # optional; default comes from the type's interpreter
  clusterSelector:                  # filled in: {matchLabels: {...}, matchExpressions: [...]}
    matchLabels: {gpu: v100}
    matchExpressions: [{key: region, operator: In, values: [us-east, eu-west]}]
  clusterNames: [us-east, eu-west]  # optional allow-list
  tolerations:                      # filled in: [{key, operator, value, effect, tolerationSeconds}]
  - {key: dedicated, operator: Equal, value: batch, effect: NoExecute, tolerationSeconds: 60}
  maxClusters: 2                    # "any N of M"
  spread: {labelKey: region, minGroups: 2, maxGroups: 3}
  splitBy: capacity                 # capacity (default) | weights
  weights: [{clusterSelector: {matchLabels: {gpu: v100}}, weight: 2}]   # filled in: {...}
  failover: {tolerationSeconds: 60, failback: true}
  transformations: [use-v100-32g]
"""

INTERPRETER_EXAMPLE = """
apiVersion: flotilla.io/v1alpha1
kind: ResourceInterpreter
metadata: {name: flink}
spec:
  target: {apiVersion: flink.apache.org/v1beta1, kind: FlinkDeployment}
  strategy: any
  replicas: {path: .spec.replicas}                        # what `split` divides
  podTemplate: {path: .spec.template}                     # requests per replica
  components:                                             # multi-pod-template workloads
  - {name: jobmanager,  replicasPath: .spec.jobManager.replicas,
     podTemplatePath: .spec.jobManager.podTemplate}
  - {name: taskmanager, replicasPath: .spec.taskManager.replicas,
     podTemplatePath: .spec.taskManager.podTemplate}
  statusAggregation: [{path: .status.readyReplicas, op: sum}]   # sum|min|max|all|any|first
  dependencies: [{path: .spec.serviceAccount, apiVersion: v1, kind: ServiceAccount}]
"""

TRANSFORMATION_SPEC_EXAMPLE = """
spec:
  transformations:                  # applied in order
  - targetClusters: [eu-west]       # or targetSelector: {matchLabels: {region: eu}}
    patchType: strategic            # strategic | merge | json
    patch: {spec: {template: {spec: {nodeSelector: {gpu-model: V100, gpu-memory: 32GB}}}}}
"""


def example(kind: str) -> dict[str, Any]:
    text = {
        "Cluster": CLUSTER_EXAMPLE,
        "PlacementPolicy": POLICY_SPEC_EXAMPLE,
        "ClusterPlacementPolicy": POLICY_SPEC_EXAMPLE,
        "ResourceInterpreter": INTERPRETER_EXAMPLE,
        "Transformation": TRANSFORMATION_SPEC_EXAMPLE,
        "ClusterTransformation": TRANSFORMATION_SPEC_EXAMPLE,
    }[kind]
    obj: dict[str, Any] = yaml.safe_load(text)
    obj.setdefault("apiVersion", api.API_VERSION)
    obj.setdefault("kind", kind)
    namespace = {"namespace": "shop"} if kind in api.NAMESPACED_KINDS else {}
    obj.setdefault("metadata", {"name": "example", **namespace})
    return obj


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_architecture_example_validates_against_the_model(kind: str) -> None:
    parsed = api.parse_object(kind, example(kind))
    assert parsed.kind == kind


def test_architecture_examples_read_as_documented() -> None:
    cluster = api.parse_object("Cluster", example("Cluster"))
    assert isinstance(cluster, api.Cluster)
    assert cluster.spec.taints[0].effect is api.TaintEffect.NO_SCHEDULE
    assert cluster.spec.evict_after is None
    assert cluster.status.allocatable["memory"] == "96Gi"
    ready = cluster.status.condition("Ready")
    assert ready is not None and ready.status is api.ConditionStatus.TRUE
    policy = api.parse_object("PlacementPolicy", example("PlacementPolicy"))
    assert isinstance(policy, api.PlacementPolicy)
    assert policy.spec.max_clusters == 2
    assert policy.spec.spread == api.Spread(label_key="region", min_groups=2, max_groups=3)
    assert policy.spec.failover == api.Failover(toleration_seconds=60, failback=True)
    interpreter = api.parse_object("ResourceInterpreter", example("ResourceInterpreter"))
    assert isinstance(interpreter, api.ResourceInterpreter)
    assert [c.name for c in interpreter.spec.components] == ["jobmanager", "taskmanager"]


# A small validator for the OpenAPI subset the CRDs use, so the examples are checked
# against the schema the API server enforces, not only against pydantic. (No
# OpenAPI/JSON-schema validator is among the project's locked dependencies.)


def schema_errors(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null is not allowed"]
    if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        return []
    if "anyOf" in schema:
        if not any(not schema_errors(value, option, where) for option in schema["anyOf"]):
            return [f"{where}: {value!r} matches none of {schema['anyOf']}"]
        if "pattern" in schema and not re.search(schema["pattern"], str(value)):
            return [f"{where}: {value!r} does not match {schema['pattern']}"]
        return []
    python_types: dict[str, Any] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "boolean": bool,
        "number": int | float,
    }
    if not isinstance(value, python_types[schema["type"]]) or (
        schema["type"] == "integer" and value is True
    ):
        return [f"{where}: {value!r} is not of type {schema['type']}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value!r} is below the minimum {schema['minimum']}")
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{where}: too short")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{where}: needs at least {schema['minItems']} items")
    if isinstance(value, list):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        errors += [
            f"{where}.{key}: required" for key in schema.get("required", []) if key not in value
        ]
        properties = schema.get("properties")
        for key, item in value.items():
            if properties is not None and key in properties:
                errors += schema_errors(item, properties[key], f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(item, schema["additionalProperties"], f"{where}.{key}")
            elif properties is not None and key != "metadata":
                errors.append(f"{where}.{key}: unknown field (the API server would drop it)")
    return errors


@pytest.mark.parametrize("kind", sorted(SPEC_MODELS))
def test_architecture_example_validates_against_the_crd(kind: str) -> None:
    assert schema_errors(example(kind), root_schema(CRDS[kind])) == []


@pytest.mark.parametrize(
    ("kind", "mutate", "message"),
    [
        pytest.param(
            "PlacementPolicy",
            lambda o: o["spec"].update(maxClusters=0),
            "below the minimum 1",
            id="max-clusters",
        ),
        pytest.param(
            "PlacementPolicy",
            lambda o: o["spec"]["weights"][0].update(weight=-1),
            "below the minimum 0",
            id="negative-weight",
        ),
        pytest.param(
            "PlacementPolicy",
            lambda o: o["spec"].update(strategy="spread"),
            "not in",
            id="unknown-strategy",
        ),
        pytest.param(
            "Transformation",
            lambda o: o["spec"]["transformations"][0].update(patchType="xml"),
            "not in",
            id="patch-type",
        ),
        pytest.param(
            "ResourceInterpreter",
            lambda o: o["spec"]["replicas"].update(path="spec.replicas"),
            "does not match",
            id="path-without-dot",
        ),
        pytest.param(
            "Cluster",
            lambda o: o["status"]["allocatable"].update(cpu="lots"),
            "does not match",
            id="quantity",
        ),
    ],
)
def test_crd_and_model_reject_the_same_mistakes(kind: str, mutate: Any, message: str) -> None:
    obj = example(kind)
    mutate(obj)
    assert any(message in error for error in schema_errors(obj, root_schema(CRDS[kind])))
    with pytest.raises(api.InvalidObjectError):
        api.parse_object(kind, obj)
