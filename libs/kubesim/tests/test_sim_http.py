"""The simulator behind a real kubesim server, driven exactly as a Flotilla service would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client, watch

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import api_client, http_session

FAST = SimOptions(nodes=2, pod_ready_seconds=0.05, job_seconds=0.05)
Factory = Callable[..., Awaitable[KubeSim]]


async def poll(check: Callable[[], Awaitable[Any]], within: float = 10.0) -> Any:
    """Await `check()` until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)


def deployment(name: str, replicas: int) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(
                            name="web",
                            image="nginx:1.27",
                            resources=client.V1ResourceRequirements(requests={"cpu": "250m"}),
                        )
                    ]
                ),
            ),
        ),
    )


async def test_deployment_over_http_becomes_ready(kubesim_factory: Factory) -> None:
    cluster = await kubesim_factory("member-a", sim=FAST)
    async with api_client(cluster) as api:
        apps = client.AppsV1Api(api)
        core = client.CoreV1Api(api)
        await apps.create_namespaced_deployment("default", deployment("web", 3))

        async def ready() -> Any:
            d = await apps.read_namespaced_deployment_status("web", "default")
            return d.status.ready_replicas == d.spec.replicas and d

        found = await poll(ready)
        assert found.status.available_replicas == 3
        assert found.status.observed_generation == 1
        pods = await core.list_namespaced_pod("default", label_selector="app=web")
        assert {p.status.phase for p in pods.items} == {"Running"}
        nodes = await core.list_node()
        assert {n.metadata.labels["kubernetes.io/hostname"] for n in nodes.items} == {
            "member-a-node-0",
            "member-a-node-1",
        }


async def test_pod_watch_sees_a_pod_scheduled_and_running(kubesim_factory: Factory) -> None:
    cluster = await kubesim_factory("member-b", sim=FAST)
    async with api_client(cluster) as api:
        core = client.CoreV1Api(api)
        listed = await core.list_namespaced_pod("default")
        await core.create_namespaced_pod(
            "default",
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="solo"),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
            ),
        )
        seen: list[tuple[str, str | None, str]] = []
        stream = watch.Watch()
        async with stream:
            async for event in stream.stream(
                core.list_namespaced_pod,
                "default",
                resource_version=listed.metadata.resource_version,
                timeout_seconds=10,
            ):
                pod = event["object"]
                seen.append((event["type"], pod.spec.node_name, pod.status.phase))
                if pod.status.phase == "Running":
                    stream.stop()
        assert seen[0] == ("ADDED", None, "Pending")
        assert seen[-1][0] == "MODIFIED"
        assert seen[-1][1] is not None
        assert seen[-1][2] == "Running"


async def test_sim_nodes_route_adds_and_cordons_nodes(kubesim_factory: Factory) -> None:
    cluster = await kubesim_factory("member-c", sim=FAST)
    headers = {"Authorization": f"Bearer {cluster.token}"}
    async with http_session(cluster, base_url=cluster.url) as http:
        async with http.post("/sim/v1/nodes", json={"action": "add", "count": 2}) as response:
            assert response.status == 401
        async with http.post(
            "/sim/v1/nodes", json={"action": "add", "count": 2, "gpus": 4}, headers=headers
        ) as response:
            assert response.status == 200
            added = (await response.json())["nodes"]
        assert added == ["member-c-node-2", "member-c-node-3"]
        async with http.post(
            "/sim/v1/nodes", json={"action": "cordon", "names": added[:1]}, headers=headers
        ) as response:
            assert response.status == 200
        async with http.get("/sim/v1/nodes", headers=headers) as response:
            listing = await response.json()
        by_name = {n["name"]: n for n in listing["items"]}
        assert by_name["member-c-node-2"]["unschedulable"] is True
        assert by_name["member-c-node-3"]["allocatable"]["nvidia.com/gpu"] == 4
        async with http.post(
            "/sim/v1/nodes", json={"action": "remove", "names": ["ghost"]}, headers=headers
        ) as response:
            assert response.status == 404
            status = await response.json()
        assert status["kind"] == "Status"
        assert status["reason"] == "NotFound"
        async with http.post("/sim/v1/nodes", data=b"{not json", headers=headers) as response:
            assert response.status == 400
        async with http.get("/sim/v1/stats", headers=headers) as response:
            stats = await response.json()
        assert stats["nodes"] == 4
    async with api_client(cluster) as api:
        node = await client.CoreV1Api(api).read_node("member-c-node-2")
        assert node.spec.unschedulable is True


async def test_stopping_the_server_leaves_no_simulator_tasks(kubesim_factory: Factory) -> None:
    before = set(asyncio.all_tasks())
    cluster = await kubesim_factory("member-d", sim=FAST)
    assert cluster.simulator is not None
    assert len(asyncio.all_tasks() - before) > 0
    await cluster.stop()
    assert not {t for t in asyncio.all_tasks() - before if not t.done()}
