"""The transformer end to end: a hub object and its dependencies become one work per
member cluster, and deleting the object removes every one of them
(`fleet.running_fleet`: every built service as a real process)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from flotilla.common import events
from flotilla.common.testing import eventually, schemaless_crd
from flotilla.kubesim.testing import api_client

from .fleet import MEMBERS, Fleet
from .test_end_to_end import NS, fleet, web

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

__all__ = ["fleet"]  # the end-to-end fixture, shared with test_end_to_end

WIDGET_CRD = schemaless_crd("example.com", "Widget", "v1")


def web_with_dependencies(replicas: int) -> dict[str, Any]:
    """`web` reading its environment from ConfigMap settings, running as ServiceAccount runner."""
    obj = web(replicas)
    pod = obj["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "runner"
    pod["containers"][0]["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    return obj


def ref(api_version: str, kind: str, name: str) -> events.ObjectRef:
    return events.ObjectRef(api_version=api_version, kind=kind, name=name, namespace=NS)


WEB = ref("apps/v1", "Deployment", "web")
SETTINGS = ref("v1", "ConfigMap", "settings")
RUNNER = ref("v1", "ServiceAccount", "runner")
NAMESPACE = events.ObjectRef(api_version="v1", kind="Namespace", name=NS)


def works(fleet: Fleet) -> dict[tuple[str, str], events.WorkRendered]:
    """The last work per (object, cluster), what a syncer converges to."""
    last: dict[tuple[str, str], events.WorkRendered] = {}
    for envelope in fleet.of("WorkRendered"):
        work = envelope.payload
        assert isinstance(work, events.WorkRendered)
        assert envelope.key == events.work_key(work.ref, work.cluster)
        last[(work.ref.key, work.cluster)] = work
    return last


def present(fleet: Fleet) -> dict[tuple[str, str], events.WorkRendered]:
    return {k: w for k, w in works(fleet).items() if w.manifest is not None}


async def test_a_split_deployment_and_its_dependencies_reach_exactly_its_clusters(
    fleet: Fleet,
) -> None:
    await fleet.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await fleet.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": NS},
            "data": {"MODE": "prod"},
        }
    )
    await fleet.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "runner", "namespace": NS},
        }
    )
    await fleet.create(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "ClusterPlacementPolicy",
            "metadata": {"name": "web"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]},
        }
    )
    await fleet.create(web_with_dependencies(replicas=9))

    decided = await fleet.wait_for("PlacementDecided", WEB.key)
    assert isinstance(decided.payload, events.PlacementDecided)
    placed = {p.cluster: p.replicas for p in decided.payload.clusters}
    assert placed == {name: 3 for name in MEMBERS}

    wanted = {(r.key, c) for r in (WEB, SETTINGS, RUNNER, NAMESPACE) for c in MEMBERS}

    def all_rendered() -> bool:
        return wanted <= set(present(fleet))

    await eventually(all_rendered, timeout=60, what="the works of web and its dependencies")
    rendered = present(fleet)
    for cluster in MEMBERS:
        own = rendered[(WEB.key, cluster)].manifest
        assert own is not None
        assert own["spec"]["replicas"] == 3
        assert own["metadata"]["annotations"]["flotilla.io/origin"] == WEB.key
        assert own["metadata"]["annotations"]["flotilla.io/decision"] == decided.payload.decision_id
        assert "resourceVersion" not in own["metadata"] and "status" not in own
        for dependency in (SETTINGS, RUNNER, NAMESPACE):
            assert rendered[(dependency.key, cluster)].dependency_of == [WEB]
    # Exactly those works, and dependencies before the object that needs them.
    assert set(rendered) == wanted
    order = [(e.payload.ref.key, e.payload.cluster) for e in fleet.of("WorkRendered")]  # type: ignore[union-attr]
    for cluster in MEMBERS:
        assert order.index((NAMESPACE.key, cluster)) < order.index((WEB.key, cluster))
        assert order.index((SETTINGS.key, cluster)) < order.index((WEB.key, cluster))

    await fleet.delete(web_with_dependencies(replicas=9))

    def all_removed() -> bool:
        last = works(fleet)
        return all(key in last and last[key].manifest is None for key in wanted)

    await eventually(all_removed, timeout=60, what="removal of every work of web")
    assert not present(fleet).keys() & wanted


async def test_a_type_one_member_lacks_stays_off_it_with_a_warning(fleet: Fleet) -> None:
    """eu-central reports no Widgets: a copied Widget lands on the other two only, and
    the user hears which cluster was left out and why."""
    await fleet.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    crd: Any = WIDGET_CRD
    await k8s.ApiextensionsV1Api(fleet.api).create_custom_resource_definition(crd)
    # The syncer reports what each member serves: only two members get the type.
    for member in ("us-east", "us-west"):
        async with api_client(fleet.members[member]) as member_api:
            await k8s.ApiextensionsV1Api(member_api).create_custom_resource_definition(crd)
    await fleet.create(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "ClusterPlacementPolicy",
            "metadata": {"name": "widgets"},
            "spec": {
                "resourceSelectors": [{"apiVersion": "example.com/v1", "kind": "Widget"}],
                "strategy": "copy",
            },
        }
    )
    await fleet.create(
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "gadget", "namespace": NS},
            "spec": {"size": 3},
        }
    )
    gadget = ref("example.com/v1", "Widget", "gadget")
    elsewhere = {(gadget.key, "us-east"), (gadget.key, "us-west")}

    def placed_elsewhere() -> bool:
        decisions = fleet.of("PlacementDecided", gadget.key)
        last = decisions[-1].payload if decisions else None
        return (
            isinstance(last, events.PlacementDecided)
            and {p.cluster for p in last.clusters} == {"us-east", "us-west"}
            and {k for k in present(fleet) if k[0] == gadget.key} == elsewhere
        )

    await eventually(placed_elsewhere, timeout=60, what="gadget on us-east and us-west only")

    async def warned() -> bool:
        found = await fleet.warnings(NS, "IncompatibleCluster")
        return any("eu-central" in (e.message or "") for e in found)

    await eventually(warned, timeout=60, what="an IncompatibleCluster Warning naming eu-central")
