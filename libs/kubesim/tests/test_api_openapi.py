"""The OpenAPI documents kubectl reads: v3 root and group-versions, v2, CRD schemas."""

from __future__ import annotations

from typing import Any

from flotilla.common.testing import schemaless_crd
from flotilla.kubesim import openapi
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import auth_session


async def _get(hub: KubeSim, path: str) -> Any:
    async with auth_session(hub, base_url=hub.url) as http, http.get(path) as r:
        assert r.status == 200, path
        return await r.json()


async def test_v3_documents_let_kubectl_validate_on_the_server(hub: KubeSim) -> None:
    root = await _get(hub, "/openapi/v3")
    url = root["paths"]["apis/apps/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/apps/v1?hash=")
    apps = await _get(hub, url)
    patch = apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "apps",
        "version": "v1",
        "kind": "Deployment",
    }
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    schemas = apps["components"]["schemas"]
    deployment = schemas["io.k8s.api.apps.v1.Deployment"]
    assert deployment["x-kubernetes-group-version-kind"][0]["kind"] == "Deployment"
    spec = schemas["io.k8s.api.apps.v1.DeploymentSpec"]
    assert "selector" in spec["required"] and spec["properties"]["replicas"]["type"] == "integer"
    pod_spec = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]
    assert pod_spec["containers"]["x-kubernetes-patch-merge-key"] == "name"
    core = await _get(hub, "/openapi/v3/api/v1")
    assert "/api/v1/namespaces/{namespace}/pods/{name}" in core["paths"]


async def test_crd_schemas_are_published_and_the_hash_moves(hub: KubeSim) -> None:
    before = (await _get(hub, "/openapi/v3"))["paths"]
    assert "apis/example.com/v1" not in before
    async with auth_session(hub, base_url=hub.url) as http:
        crd = schemaless_crd("example.com", "Gadget")
        await http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    after = (await _get(hub, "/openapi/v3"))["paths"]
    gadgets = await _get(hub, after["apis/example.com/v1"]["serverRelativeURL"])
    schema = gadgets["components"]["schemas"]["com.example.v1.Gadget"]
    assert schema["x-kubernetes-group-version-kind"] == [
        {"group": "example.com", "version": "v1", "kind": "Gadget"}
    ]
    assert schema["properties"]["metadata"]["$ref"].endswith("meta.v1.ObjectMeta")
    v2 = await _get(hub, "/openapi/v2")
    assert v2["swagger"] == "2.0" and "com.example.v1.Gadget" in v2["definitions"]
    assert "#/components/" not in str(v2["definitions"]["io.k8s.api.apps.v1.DeploymentSpec"])


def test_unknown_fields_are_found_and_pruned() -> None:
    definitions, roots = openapi.builtin_schemas()
    root = definitions[roots[("v1", "ConfigMap")]]
    obj = {"metadata": {"name": "x", "nope": 1}, "data": {"a": "b"}, "extra": {}}
    unknown, mismatched = openapi.unknown_fields(obj, root, definitions, prune=True)
    assert unknown == ["metadata.nope", "extra"] and mismatched == []
    assert obj == {"metadata": {"name": "x"}, "data": {"a": "b"}}
    _, mismatched = openapi.unknown_fields({"data": {"a": 1}}, root, definitions, prune=False)
    assert mismatched == [("data.a", "string", 1)]


def test_vendored_builtin_schemas_match_the_generator() -> None:
    """Regenerate with `python -m flotilla.kubesim.openapi` when this fails."""
    assert openapi.BUILTIN_SCHEMAS.read_bytes() == openapi.generate_builtin_schemas()
