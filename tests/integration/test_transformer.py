"""The transformer end to end, and with it the whole pipeline (`fleet.running_fleet`:
every built service as a real process): a hub object and its dependencies become
one work per member cluster it is placed on and land on exactly those members (read
from each member with its own client), its pods running there; deleting the object
removes every one of them. A type one member lacks stays off it, with a Warning
Event on the hub object."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.cli.environment import member_labels
from flotilla.common import events
from flotilla.common.api import (
    DECISION_ANNOTATION,
    ORIGIN_ANNOTATION,
    ORIGIN_LABEL,
    origin_label,
)
from flotilla.common.testing import eventually, schemaless_crd
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import api_client

from .fleet import Fleet, fleet_fixture
from .test_end_to_end import NS, fleet, web

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

__all__ = ["fleet"]  # the end-to-end fixture, shared with test_end_to_end

WIDGET_CRD = schemaless_crd("example.com", "Widget", "v1")

MEMBERS4 = member_labels(4)
"""The three default members and a fourth (ap-south) that a policy leaves out."""
PLACED = ("us-east", "us-west", "eu-central")
LEFT_OUT = "ap-south"
assert set(MEMBERS4) == {*PLACED, LEFT_OUT}


fleet4 = fleet_fixture(MEMBERS4)
"""The end-to-end fleet with a fourth member, so a cluster that must get nothing exists."""


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


async def on_member(member: KubeSim, path: str, **query: str) -> Any:
    """GET `path` on a member through its own kubeconfig (None: 404)."""
    async with api_client(member) as api:
        try:
            return await api.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                auth_settings=["BearerToken"],
                response_types_map={200: "object"},
                _return_http_data_only=True,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


ON_MEMBER = {
    WEB: f"/apis/apps/v1/namespaces/{NS}/deployments/web",
    SETTINGS: f"/api/v1/namespaces/{NS}/configmaps/settings",
    RUNNER: f"/api/v1/namespaces/{NS}/serviceaccounts/runner",
    NAMESPACE: f"/api/v1/namespaces/{NS}",
}
"""Where each object of the test lives on a member."""


async def running_web_pods(member: KubeSim) -> int:
    listed = await on_member(member, f"/api/v1/namespaces/{NS}/pods", labelSelector="app=web")
    items = listed["items"] if listed else []
    return sum(1 for pod in items if (pod.get("status") or {}).get("phase") == "Running")


async def held(member: KubeSim) -> dict[events.ObjectRef, Any]:
    """The objects of the test that exist on `member` (a Terminating namespace counts)."""
    found = {ref: await on_member(member, path) for ref, path in ON_MEMBER.items()}
    return {ref: obj for ref, obj in found.items() if obj is not None}


async def test_a_split_deployment_and_its_dependencies_reach_exactly_its_clusters(
    fleet4: Fleet,
) -> None:
    """Nine replicas over the three clusters the policy names land as 3+3+3, with the
    ConfigMap, ServiceAccount and Namespace they need on those three members (read
    from each member itself) and nothing on the fourth; their pods run there. Deleting
    the Deployment removes it and every as-needed dependency from the members — the
    Namespace too: Flotilla created it there, so it goes with its last dependent."""
    fleet = fleet4
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
            "spec": {
                "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                "clusterNames": list(PLACED),
            },
        }
    )
    await fleet.create(web_with_dependencies(replicas=9))

    decided = await fleet.wait_for("PlacementDecided", WEB.key)
    assert isinstance(decided.payload, events.PlacementDecided)
    placed = {p.cluster: p.replicas for p in decided.payload.clusters}
    assert placed == {name: 3 for name in PLACED}
    assert decided.payload.rejected_clusters() == [LEFT_OUT]

    wanted = {(r.key, c) for r in (WEB, SETTINGS, RUNNER, NAMESPACE) for c in PLACED}

    def all_rendered() -> bool:
        return wanted <= set(present(fleet))

    await eventually(all_rendered, timeout=60, what="the works of web and its dependencies")
    rendered = present(fleet)
    # A copy names the decision that last changed it: a later decision that places
    # the same share there (the scheduler deciding again) sends it nothing new.
    decisions = {
        e.payload.decision_id: e.payload
        for e in fleet.of("PlacementDecided", WEB.key)
        if isinstance(e.payload, events.PlacementDecided)
    }
    for cluster in PLACED:
        own = rendered[(WEB.key, cluster)].manifest
        assert own is not None
        assert own["spec"]["replicas"] == 3
        assert own["metadata"]["annotations"][ORIGIN_ANNOTATION] == WEB.key
        rendered_from = decisions[own["metadata"]["annotations"][DECISION_ANNOTATION]]
        assert {p.cluster: p.replicas for p in rendered_from.clusters}[cluster] == 3
        assert "resourceVersion" not in own["metadata"] and "status" not in own
        for dependency in (SETTINGS, RUNNER, NAMESPACE):
            assert rendered[(dependency.key, cluster)].dependency_of == [WEB]
    # Exactly those works, and dependencies before the object that needs them.
    assert set(rendered) == wanted
    order = [(e.payload.ref.key, e.payload.cluster) for e in fleet.of("WorkRendered")]  # type: ignore[union-attr]
    for cluster in PLACED:
        assert order.index((NAMESPACE.key, cluster)) < order.index((WEB.key, cluster))
        assert order.index((SETTINGS.key, cluster)) < order.index((WEB.key, cluster))

    # On the members themselves: the copies, and 3 pods Running on each of the three.
    async def landed() -> bool:
        for cluster in PLACED:
            member = fleet.members[cluster]
            if set(await held(member)) != set(ON_MEMBER):
                return False
            if await running_web_pods(member) != 3:
                return False
        return True

    await eventually(landed, timeout=90, what="web, its dependencies and 3 Running pods per member")
    for cluster in PLACED:
        copies = await held(fleet.members[cluster])
        for ref, obj in copies.items():
            assert obj["metadata"]["labels"][ORIGIN_LABEL] == origin_label(ref.key), (cluster, ref)
            assert obj["metadata"]["annotations"][ORIGIN_ANNOTATION] == ref.key, (cluster, ref)
        assert copies[WEB]["spec"]["replicas"] == 3
        assert copies[SETTINGS]["data"] == {"MODE": "prod"}
        pod_spec = copies[WEB]["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == "runner"
    outside = fleet.members[LEFT_OUT]
    assert await held(outside) == {}, f"{LEFT_OUT} got what only the placed clusters need"
    assert await running_web_pods(outside) == 0

    await fleet.delete(web_with_dependencies(replicas=9))

    def all_removed() -> bool:
        last = works(fleet)
        return all(key in last and last[key].manifest is None for key in wanted)

    await eventually(all_removed, timeout=60, what="removal of every work of web")
    assert not present(fleet).keys() & wanted

    async def cleared() -> bool:
        for cluster in MEMBERS4:
            member = fleet.members[cluster]
            if await held(member) or await running_web_pods(member):
                return False
        return True

    await eventually(cleared, timeout=90, what="web and its dependencies gone from the members")
    # The hub keeps its own objects: only the member copies went.
    hub_core = k8s.CoreV1Api(fleet.api)
    assert (await hub_core.read_namespaced_config_map("settings", NS)).data == {"MODE": "prod"}
    assert (await hub_core.read_namespaced_service_account("runner", NS)).metadata.name == "runner"


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
        return any(
            "eu-central" in (e.message or "")
            and e.involved_object.api_version == "example.com/v1"
            and e.involved_object.kind == "Widget"
            and e.involved_object.name == "gadget"
            and e.involved_object.namespace == NS
            for e in found
        )

    await eventually(
        warned, timeout=60, what="an IncompatibleCluster Warning on gadget naming eu-central"
    )
    path = f"/apis/example.com/v1/namespaces/{NS}/widgets/gadget"

    async def on_the_two() -> bool:
        found = [await on_member(fleet.members[m], path) for m in ("us-east", "us-west")]
        return all(found)

    await eventually(on_the_two, timeout=60, what="gadget applied on us-east and us-west")
