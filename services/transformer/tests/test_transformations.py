"""Transformations over realistic manifests: each patch type, targeting, failures."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from flotilla.common.api import PlacementPolicySpec, TransformationSpec
from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.transformer import transformations
from flotilla.transformer.steps import ClusterFacts
from flotilla.transformer.transformations import NamedTransformation, RenderError

OREGON = ClusterFacts("oregon", {"region": "us-west", "gpu": "v100-32gb"})
EU = ClusterFacts("eu", {"region": "eu", "gpu-vendor": "nvidia", "gpu-memory": "32GB"})
PLAIN = ClusterFacts("plain", {"region": "eu"})


def transformation(*rules: dict[str, Any], name: str = "t") -> NamedTransformation:
    spec = TransformationSpec.model_validate({"transformations": list(rules)})
    return NamedTransformation(transformations.TRANSFORMATION, name, spec)


def gpu_job() -> dict[str, Any]:
    return manifest(
        "batch/v1",
        "Job",
        {
            "parallelism": 1,
            "template": template(
                pod_spec(
                    container("train", requests={"nvidia.com/gpu": "1"}),
                    restartPolicy="Never",
                )
            ),
        },
        name="train",
    )


def deployment() -> dict[str, Any]:
    app = container("app", requests={"cpu": "100m"})
    app["env"] = [{"name": "MODE", "value": "prod"}, {"name": "LOG", "value": "info"}]
    app["ports"] = [{"containerPort": 8080, "name": "http"}]
    sidecar = container("istio-proxy")
    return manifest(
        "apps/v1",
        "Deployment",
        {"replicas": 3, "template": template(pod_spec(app, sidecar))},
    )


GPU_NODE_SELECTORS = transformation(
    {
        "targetClusters": ["oregon"],
        "patchType": "strategic",
        "patch": {"spec": {"template": {"spec": {"nodeSelector": {"gpu-model": "V100-32GB"}}}}},
    },
    {
        "targetSelector": {"matchLabels": {"gpu-memory": "32GB"}},
        "patchType": "strategic",
        "patch": {
            "spec": {
                "template": {"spec": {"nodeSelector": {"gpu-model": "V100", "gpu-memory": "32GB"}}}
            }
        },
    },
    name="gpu-node-selectors",
)


@dataclass
class Case:
    id: str
    obj: dict[str, Any]
    chosen: tuple[NamedTransformation, ...]
    cluster: ClusterFacts
    expect: dict[str, Any] = field(default_factory=dict)
    """Path (dotted, list items by index) → expected value."""


def at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, list):
            obj = obj[int(part)] if int(part) < len(obj) else None
        else:
            obj = obj.get(part)
        if obj is None:
            return None
    return obj


CASES = [
    Case(
        "gpu job on oregon: by name",
        gpu_job(),
        (GPU_NODE_SELECTORS,),
        OREGON,
        {"spec.template.spec.nodeSelector": {"gpu-model": "V100-32GB"}},
    ),
    Case(
        "gpu job on eu: by label selector",
        gpu_job(),
        (GPU_NODE_SELECTORS,),
        EU,
        {"spec.template.spec.nodeSelector": {"gpu-model": "V100", "gpu-memory": "32GB"}},
    ),
    Case(
        "gpu job elsewhere: untouched",
        gpu_job(),
        (GPU_NODE_SELECTORS,),
        PLAIN,
        {"spec.template.spec.nodeSelector": None},
    ),
    Case(
        "strategic $patch: delete removes one container by name",
        deployment(),
        (
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "strategic",
                    "patch": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [{"name": "istio-proxy", "$patch": "delete"}]
                                }
                            }
                        }
                    },
                }
            ),
        ),
        PLAIN,
        {"spec.template.spec.containers.0.name": "app", "spec.template.spec.containers.1": None},
    ),
    Case(
        "strategic merge over env by name keeps the other entries",
        deployment(),
        (
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "strategic",
                    "patch": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "app",
                                            "env": [
                                                {"name": "LOG", "value": "debug"},
                                                {"name": "REGION", "value": "eu"},
                                            ],
                                        }
                                    ]
                                }
                            }
                        }
                    },
                }
            ),
        ),
        PLAIN,
        {
            "spec.template.spec.containers.0.env": [
                {"name": "MODE", "value": "prod"},
                {"name": "LOG", "value": "debug"},
                {"name": "REGION", "value": "eu"},
            ],
            "spec.template.spec.containers.0.image": "app:1",
            "spec.template.spec.containers.1.name": "istio-proxy",
        },
    ),
    Case(
        "strategic tolerations replace the list (no merge key upstream)",
        deployment(),
        (
            transformation(
                {
                    "targetSelector": {"matchLabels": {"region": "eu"}},
                    "patchType": "strategic",
                    "patch": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "tolerations": [
                                        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
                                    ]
                                }
                            }
                        }
                    },
                }
            ),
        ),
        PLAIN,
        {
            "spec.template.spec.tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
            ]
        },
    ),
    Case(
        "merge patch (RFC 7386) replaces lists and deletes with null",
        deployment(),
        (
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "merge",
                    "patch": {
                        "metadata": {"labels": {"tier": "edge"}},
                        "spec": {"template": {"metadata": {"labels": {"app": None}}}},
                    },
                }
            ),
        ),
        PLAIN,
        {"metadata.labels": {"tier": "edge"}, "spec.template.metadata.labels": {}},
    ),
    Case(
        "json patch (RFC 6902) replaces an image and adds an env entry",
        deployment(),
        (
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "json",
                    "patch": [
                        {
                            "op": "replace",
                            "path": "/spec/template/spec/containers/0/image",
                            "value": "mirror.eu/app:1",
                        },
                        {
                            "op": "add",
                            "path": "/spec/template/spec/containers/0/env/-",
                            "value": {"name": "MIRROR", "value": "eu"},
                        },
                    ],
                }
            ),
        ),
        PLAIN,
        {
            "spec.template.spec.containers.0.image": "mirror.eu/app:1",
            "spec.template.spec.containers.0.env.2": {"name": "MIRROR", "value": "eu"},
        },
    ),
    Case(
        "rules apply in order: a later transformation sees the earlier one's result",
        deployment(),
        (
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "merge",
                    "patch": {"spec": {"replicas": 5}},
                }
            ),
            transformation(
                {
                    "targetClusters": ["plain"],
                    "patchType": "json",
                    "patch": [
                        {"op": "test", "path": "/spec/replicas", "value": 5},
                        {"op": "replace", "path": "/spec/replicas", "value": 7},
                    ],
                },
                name="second",
            ),
        ),
        PLAIN,
        {"spec.replicas": 7},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_patch_types(case: Case) -> None:
    original = copy.deepcopy(case.obj)
    result = transformations.apply_all(copy.deepcopy(case.obj), case.chosen, case.cluster)
    for path, value in case.expect.items():
        assert at(result, path) == value, path
    assert case.obj == original  # the input is never modified


FAILURES = [
    (
        "json test fails",
        transformation(
            {
                "targetClusters": ["plain"],
                "patchType": "json",
                "patch": [{"op": "test", "path": "/spec/replicas", "value": 99}],
            }
        ),
        "could not be applied",
    ),
    (
        "json path missing",
        transformation(
            {
                "targetClusters": ["plain"],
                "patchType": "json",
                "patch": [{"op": "remove", "path": "/spec/nothing/here"}],
            }
        ),
        "could not be applied",
    ),
    (
        "strategic list item without its merge key",
        transformation(
            {
                "targetClusters": ["plain"],
                "patchType": "strategic",
                "patch": {"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}},
            }
        ),
        "merge key",
    ),
    (
        "strategic $patch: replace at the root drops the identity",
        transformation(
            {
                "targetClusters": ["plain"],
                "patchType": "strategic",
                "patch": {"$patch": "replace", "spec": {}},
            }
        ),
        "apiVersion, kind, name or namespace",
    ),
    (
        "json move takes the metadata away",
        transformation(
            {
                "targetClusters": ["plain"],
                "patchType": "json",
                "patch": [{"op": "move", "from": "/metadata", "path": "/spec/meta"}],
            }
        ),
        "apiVersion, kind, name or namespace",
    ),
]


@pytest.mark.parametrize(
    ("chosen", "message"), [(t, m) for _, t, m in FAILURES], ids=[i for i, _, _ in FAILURES]
)
def test_failures_name_the_transformation_and_cluster(
    chosen: NamedTransformation, message: str
) -> None:
    with pytest.raises(RenderError) as raised:
        transformations.apply_all(deployment(), (chosen,), PLAIN)
    assert raised.value.reason == "TransformationFailed"
    assert "Transformation t" in raised.value.message
    assert "cluster plain" in raised.value.message
    assert message in raised.value.message


def test_names_policy_first_then_annotation_without_repeats() -> None:
    policy = PlacementPolicySpec.model_validate(
        {"resourceSelectors": [{"apiVersion": "v1", "kind": "Pod"}], "transformations": ["a", "b"]}
    )
    obj = manifest("v1", "Pod", annotations={"flotilla.io/transformations": "c, a ,d"})
    assert transformations.names(obj, policy) == ["a", "b", "c", "d"]
    assert transformations.names(manifest("v1", "Pod"), None) == []


def test_resolve_prefers_the_namespace_then_cluster_wide() -> None:
    spec = GPU_NODE_SELECTORS.spec
    catalog = {
        ("Transformation", "shop", "gpu"): spec,
        ("ClusterTransformation", None, "gpu"): spec,
        ("ClusterTransformation", None, "mirror"): spec,
        ("Transformation", "other", "mirror-local"): spec,
    }
    found, missing = transformations.resolve(["gpu", "mirror", "mirror-local"], "shop", catalog)
    assert [(t.kind, t.name) for t in found] == [
        ("Transformation", "gpu"),
        ("ClusterTransformation", "mirror"),
    ]
    assert missing == ["mirror-local"]
