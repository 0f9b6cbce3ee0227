"""Evictions and PodDisruptionBudgets: the HTTP subresource and the simulator's controller."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from flotilla.kubesim import protobuf
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import http_session

from .simcluster import Cluster, deployment, eventually

PODS = "/api/v1/namespaces/default/pods"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


class Api:
    """Just enough of an HTTP client for these tests."""

    def __init__(self, hub: KubeSim, http: aiohttp.ClientSession) -> None:
        self.hub = hub
        self.http = http

    async def call(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str
    ) -> tuple[int, Any]:
        async with self.http.request(
            method,
            f"{self.hub.url}{path}",
            json=body if raw is None else None,
            data=raw,
            headers={"Authorization": f"Bearer {self.hub.token}", **headers},
        ) as resp:
            return resp.status, await resp.json()

    async def running_pod(self, name: str, ready: bool = True) -> None:
        pod = {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        }
        status, created = await self.call("POST", PODS, pod)
        assert status == 201, created
        created["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        status, body = await self.call("PUT", f"{PODS}/{name}/status", created)
        assert status == 200, body

    async def budget(self, allowed: int, healthy: int = 3, desired: int = 2) -> None:
        pdb = {
            "metadata": {"name": "web"},
            "spec": {"minAvailable": desired, "selector": {"matchLabels": {"app": "web"}}},
        }
        status, created = await self.call("POST", PDBS, pdb)
        assert status == 201, created
        # What the disruption controller would have written (a hub runs none).
        created["status"] = {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": healthy,
        }
        status, body = await self.call("PUT", f"{PDBS}/web/status", created)
        assert status == 200, body

    async def evict(self, name: str, **extra: Any) -> tuple[int, Any]:
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        return await self.call("POST", f"{PODS}/{name}/eviction", {**eviction, **extra})


@pytest.fixture
async def api(hub: KubeSim) -> Any:
    async with http_session(hub) as http:
        yield Api(hub, http)


async def test_discovery_advertises_the_eviction_subresource(api: Api) -> None:
    status, body = await api.call("GET", "/api/v1")
    assert status == 200
    entry = next(r for r in body["resources"] if r["name"] == "pods/eviction")
    assert (entry["group"], entry["version"], entry["kind"]) == ("policy", "v1", "Eviction")
    assert entry["verbs"] == ["create"]


async def test_eviction_spends_the_budget_then_answers_429(api: Api) -> None:
    for name in ("a", "b", "c"):
        await api.running_pod(name)
    await api.budget(allowed=1)

    status, body = await api.evict("a")
    assert status == 201, body
    assert body["status"] == "Success"
    assert (await api.call("GET", f"{PODS}/a"))[0] == 404
    _, pdb = await api.call("GET", f"{PDBS}/web")
    assert pdb["status"]["disruptionsAllowed"] == 0
    assert set(pdb["status"]["disruptedPods"]) == {"a"}

    status, body = await api.evict("b")
    assert status == 429
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web needs 2 healthy pods and has 3 currently",
        }
    ]
    assert (await api.call("GET", f"{PODS}/b"))[0] == 200


async def test_pods_without_a_budget_or_not_running_are_simply_deleted(api: Api) -> None:
    status, body = await api.call(
        "POST", PODS, {"metadata": {"name": "pending", "labels": {"app": "web"}}, "spec": {}}
    )
    assert status == 201, body
    await api.budget(allowed=0)
    assert (await api.evict("pending"))[0] == 201  # Pending pods ignore budgets
    await api.call("DELETE", f"{PDBS}/web")
    await api.running_pod("free")
    assert (await api.evict("free"))[0] == 201


async def test_unready_pods_are_evictable_while_the_budget_is_healthy(api: Api) -> None:
    await api.running_pod("sick", ready=False)
    await api.budget(allowed=0, healthy=2, desired=2)
    assert (await api.evict("sick"))[0] == 201


async def test_a_budget_not_yet_observed_refuses_evictions(api: Api) -> None:
    await api.running_pod("a")
    pdb = {"metadata": {"name": "web"}, "spec": {"maxUnavailable": 1, "selector": {}}}
    assert (await api.call("POST", PDBS, pdb))[0] == 201
    status, body = await api.evict("a")
    assert status == 429
    assert "still being processed" in body["details"]["causes"][0]["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"metadata": {"name": "other"}}, 400),
        ({"kind": "Pod"}, 400),
    ],
    ids=["name-mismatch", "not-an-eviction"],
)
async def test_bad_evictions_are_refused(api: Api, body: dict[str, Any], code: int) -> None:
    await api.running_pod("a")
    status, answer = await api.evict("a", **body)
    assert status == code, answer
    assert (await api.call("GET", f"{PODS}/a"))[0] == 200


async def test_protobuf_eviction_with_delete_options(api: Api) -> None:
    await api.running_pod("a")
    eviction = protobuf.encode(
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "a", "namespace": "default"},
            "deleteOptions": {"preconditions": {"uid": "not-the-uid"}},
        }
    )
    status, body = await api.call(
        "POST", f"{PODS}/a/eviction", raw=eviction, **{"Content-Type": protobuf.MEDIA_TYPE}
    )
    assert status == 409, body  # the precondition was read from the protobuf body
    _, pod = await api.call("GET", f"{PODS}/a")
    eviction = protobuf.encode(
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "a"},
            "deleteOptions": {"preconditions": {"uid": pod["metadata"]["uid"]}},
        }
    )
    status, body = await api.call(
        "POST", f"{PODS}/a/eviction", raw=eviction, **{"Content-Type": protobuf.MEDIA_TYPE}
    )
    assert status == 201, body


# -- the disruption controller -----------------------------------------------------------------


def _pdb(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def _budget(cluster: Cluster) -> dict[str, Any]:
    return cluster.status("PodDisruptionBudget", "web")


@pytest.mark.parametrize(
    ("spec", "desired", "allowed"),
    [
        ({"minAvailable": 2}, 2, 2),
        ({"minAvailable": "50%"}, 2, 2),
        ({"maxUnavailable": 1}, 3, 1),
        ({"maxUnavailable": "34%"}, 2, 2),
    ],
    ids=["min-int", "min-percent", "max-int", "max-percent-rounds-up"],
)
async def test_budget_status_follows_the_deployment(
    cluster: Cluster, spec: dict[str, Any], desired: int, allowed: int
) -> None:
    cluster.create(deployment("web", replicas=4))
    cluster.create(_pdb(**spec))
    status = await eventually(
        lambda: _budget(cluster).get("currentHealthy") == 4 and _budget(cluster)
    )
    assert status["expectedPods"] == 4
    assert status["desiredHealthy"] == desired
    assert status["disruptionsAllowed"] == allowed
    condition = status["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "DisruptionAllowed",
        "True",
        "SufficientPods",
    )


async def test_budget_recounts_when_pods_go_and_blocks_at_the_floor(cluster: Cluster) -> None:
    cluster.create(deployment("web", replicas=2))
    cluster.create(_pdb(minAvailable=2))
    await eventually(lambda: _budget(cluster).get("currentHealthy") == 2)
    assert _budget(cluster)["disruptionsAllowed"] == 0
    assert _budget(cluster)["conditions"][0]["reason"] == "InsufficientPods"
    cluster.update_spec("Deployment", "web", lambda d: d["spec"].update(replicas=3))
    await eventually(lambda: _budget(cluster).get("disruptionsAllowed") == 1)


async def test_evictions_can_only_be_created(api: Api) -> None:
    await api.running_pod("a")
    status, body = await api.call("GET", f"{PODS}/a/eviction")
    assert status == 405, body
