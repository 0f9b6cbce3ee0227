"""Custom resources are pruned, defaulted and validated by their CRD's schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.kubesim import schema

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["strategy"],
            "properties": {
                "strategy": {"type": "string", "enum": ["split", "copy", "any"]},
                "replicas": {"type": "integer", "minimum": 0, "default": 1},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                "port": {"x-kubernetes-int-or-string": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {"weight": {"type": "number", "default": 1.5}},
                    },
                },
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    },
}


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    schema.admit(obj, SPEC_SCHEMA, "Policy", "flotilla.io")
    return obj


def test_prune_and_default() -> None:
    obj = admitted(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "p"},
            "spec": {
                "strategy": "split",
                "unknown": 1,
                "labels": {"a": "b"},
                "items": [{"weight": 2, "junk": True}, {}],
                "free": {"anything": {"goes": 1}},
            },
            "extra": "dropped",
        }
    )
    assert obj == {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "p"},
        "spec": {
            "strategy": "split",
            "replicas": 1,
            "labels": {"a": "b"},
            "items": [{"weight": 2}, {"weight": 1.5}],
            "free": {"anything": {"goes": 1}},
        },
    }


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({}, "spec.strategy", "Required value"),
        ({"strategy": "spread"}, "spec.strategy", "Unsupported value"),
        ({"strategy": "any", "replicas": "3"}, "spec.replicas", "must be of type integer"),
        ({"strategy": "any", "replicas": -1}, "spec.replicas", "greater than or equal to 0"),
        ({"strategy": "any", "name": "Abc"}, "spec.name", "should match"),
        ({"strategy": "any", "name": "abcdefghij"}, "spec.name", "Too long"),
        ({"strategy": "any", "port": 1.5}, "spec.port", "integer or string"),
        ({"strategy": "any", "labels": {"a": 1}}, "spec.labels.a", "must be of type string"),
        ({"strategy": "any", "items": [{}, {}, {}]}, "spec.items", "Too many"),
        ({"strategy": "any", "items": [{"weight": "x"}]}, "spec.items[0].weight", "number"),
    ],
    ids=[
        "required",
        "enum",
        "type",
        "minimum",
        "pattern",
        "max-length",
        "int-or-string",
        "additional-properties",
        "max-items",
        "nested-item",
    ],
)
def test_violations(spec: dict[str, Any], field: str, fragment: str) -> None:
    causes = schema.validate({"metadata": {"name": "p"}, "spec": spec}, SPEC_SCHEMA)
    assert any(f == field and fragment in message for f, message in causes), causes


def policy_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "policies.flotilla.io"},
        "spec": {
            "group": "flotilla.io",
            "scope": "Namespaced",
            "names": {"plural": "policies", "singular": "policy", "kind": "Policy"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": SPEC_SCHEMA},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


async def test_custom_resources_over_http(client: Any) -> None:
    await k8s.ApiextensionsV1Api(client).create_custom_resource_definition(policy_crd())
    custom = k8s.CustomObjectsApi(client)
    args = ("flotilla.io", "v1alpha1", "default", "policies")
    body = {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "p"},
        "spec": {"strategy": "copy", "typo": True},
    }
    created = await custom.create_namespaced_custom_object(*args, body)
    assert created["spec"] == {"strategy": "copy", "replicas": 1}

    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object(
            *args, "p", {"spec": {"strategy": "nope"}}, _content_type="application/merge-patch+json"
        )
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.strategy"

    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object_status(
            *args, "p", {"status": {"ready": "yes"}}, _content_type="application/merge-patch+json"
        )
    assert err.value.status == 422
    ok = await custom.patch_namespaced_custom_object_status(
        *args,
        "p",
        {"status": {"ready": True, "junk": 1}},
        _content_type="application/merge-patch+json",
    )
    assert ok["status"] == {"ready": True}
