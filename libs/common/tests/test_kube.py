"""kube helpers against a kubesim hub, through kubernetes_asyncio."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.common import kube
from flotilla.common.errors import InvalidObject, Unavailable
from flotilla.common.testing import CRD_DIR


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ApiException(status=503, reason="down"), Unavailable),
        (ApiException(status=429, reason="slow down"), Unavailable),
        (ApiException(status=409, reason="Conflict"), Unavailable),
        (ApiException(status=422, reason="Invalid"), InvalidObject),
        (ApiException(status=403, reason="Forbidden"), InvalidObject),
        (aiohttp.ClientConnectionError("refused"), Unavailable),
        (TimeoutError(), Unavailable),
    ],
    ids=["503", "429", "409", "422", "403", "connection", "timeout"],
)
def test_translate(error: BaseException, expected: type[Exception]) -> None:
    assert isinstance(kube.translate(error), expected)


def test_gvk_of() -> None:
    assert kube.gvk_of({"apiVersion": "apps/v1", "kind": "Deployment"}) == (
        "apps",
        "v1",
        "Deployment",
    )
    assert kube.gvk_of({"apiVersion": "v1", "kind": "Pod"}) == ("", "v1", "Pod")


@pytest.mark.integration
async def test_events_are_recorded_once_and_counted(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        core = client.CoreV1Api(api)
        cm = await core.create_namespaced_config_map(
            "default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}}
        )
        obj = api.sanitize_for_serialization(cm)
        obj.update(apiVersion="v1", kind="ConfigMap")
        recorder = kube.EventRecorder(api, "flotilla-test")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        await recorder.normal(obj, "Analyzed", "3 dependencies")
        listed = await core.list_namespaced_event("default")
        by_reason = {e.reason: e for e in listed.items}
        assert by_reason["DependencyMissing"].count == 2
        assert by_reason["DependencyMissing"].type == "Warning"
        assert by_reason["DependencyMissing"].involved_object.name == "cfg"
        assert by_reason["Analyzed"].count == 1
        dyn = await DynamicClient(api)
        with pytest.raises(InvalidObject, match="does not serve"):
            await kube.resource_for(dyn, "example.com/v1", "Nope")


@pytest.mark.parametrize(
    "object_name",
    ["web", "a" * 253, "a" * 236 + "." + "b" * 16, "Mixed_Case:name"],
    ids=["short", "longest", "dot-at-cut", "not-a-subdomain"],
)
def test_event_names_are_always_valid_dns_subdomains(object_name: str) -> None:
    name = kube.event_name(object_name, "0123456789abcdef")
    assert len(name) <= kube.MAX_NAME
    assert DNS_SUBDOMAIN.match(name), name
    assert name.endswith(".0123456789abcdef")


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.integration
async def test_a_long_name_gets_its_event_and_a_refused_event_does_not_raise(
    kubesim_factory: Any,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        core = client.CoreV1Api(api)
        long_name = "x" * 253
        cm = await core.create_namespaced_config_map(
            "default", {"metadata": {"name": long_name}, "data": {}}
        )
        obj = api.sanitize_for_serialization(cm)
        obj.update(apiVersion="v1", kind="ConfigMap")
        recorder = kube.EventRecorder(api, "flotilla-test")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        listed = await core.list_namespaced_event("default")
        assert [e.involved_object.name for e in listed.items] == [long_name]
        # The hub refuses (no such namespace): logged, not raised.
        elsewhere = {**obj, "metadata": {**obj["metadata"], "namespace": "nowhere"}}
        await recorder.warning(elsewhere, "DependencyMissing", "Secret nowhere/db does not exist")


@pytest.mark.integration
async def test_install_crds_is_idempotent(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        first = await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        again = await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        served = await client.ApiextensionsV1Api(api).list_custom_resource_definition()
    assert first == again
    assert "clusters.flotilla.io" in first
    assert {c.metadata.name for c in served.items} >= set(first)
