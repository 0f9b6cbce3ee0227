"""A hub and three member clusters in one event loop, used the way Flotilla uses them."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config, watch

from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import KubeSimFactory, api_client

from . import builders

pytestmark = pytest.mark.integration

MEMBERS = ("us-east", "eu-west", "ap-south")


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    """Bounded polling on a condition (never a bare sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def deployment(name: str, replicas: int) -> dict[str, Any]:
    requests = {"cpu": "100m", "memory": "64Mi"}
    return builders.deployment(
        name,
        replicas,
        containers=[builders.container(image="nginx", resources={"requests": requests})],
    )


async def deployment_ready(apps: k8s.AppsV1Api, name: str, replicas: int) -> bool:
    dep = await apps.read_namespaced_deployment_status(name, "default")
    return dep.status is not None and dep.status.ready_replicas == replicas


async def test_hub_and_three_members_in_one_process(
    kubesim_factory: KubeSimFactory, tmp_path: Path
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    members: dict[str, KubeSim] = {}
    for index, name in enumerate(MEMBERS):
        members[name] = await kubesim_factory(
            name,
            sim=SimOptions(
                nodes=index + 1,
                node_labels={"topology.kubernetes.io/region": name},
                pod_ready_seconds=0.1,
            ),
        )
    assert len({hub.url, *(m.url for m in members.values())}) == 4

    # The hub holds each member's kubeconfig, as Flotilla's Cluster objects reference it.
    async with api_client(hub) as hub_client:
        core = k8s.CoreV1Api(hub_client)
        assert (await core.list_node()).items == []
        await core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="flotilla")))
        for name, member in members.items():
            await core.create_namespaced_secret(
                "flotilla",
                k8s.V1Secret(
                    metadata=k8s.V1ObjectMeta(name=name),
                    string_data={"kubeconfig": yaml.safe_dump(member.kubeconfig())},
                ),
            )
        secrets = await core.list_namespaced_secret("flotilla")
        kubeconfigs = {
            s.metadata.name: yaml.safe_load(base64.b64decode(s.data["kubeconfig"]).decode())
            for s in secrets.items
        }

    for index, name in enumerate(MEMBERS):
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfigs[name]))
        member_client = await config.new_client_from_config(config_file=str(path))
        try:
            core = k8s.CoreV1Api(member_client)
            apps = k8s.AppsV1Api(member_client)
            nodes = (await core.list_node()).items
            assert len(nodes) == index + 1
            assert {n.metadata.labels["topology.kubernetes.io/region"] for n in nodes} == {name}

            listed = await core.list_namespaced_pod("default")
            async with watch.Watch() as pod_watch:
                stream = pod_watch.stream(
                    core.list_namespaced_pod,
                    "default",
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=10,
                )
                await apps.create_namespaced_deployment("default", deployment("web", 3))
                running: set[str] = set()
                async for event in stream:
                    pod = event["object"]
                    if pod.status.phase == "Running":
                        running.add(pod.metadata.name)
                    if len(running) == 3:
                        break
            assert len(running) == 3

            await eventually(lambda apps=apps: deployment_ready(apps, "web", 3))
        finally:
            await member_client.close()

    async with api_client(members["us-east"]) as member_client:
        stats = await member_client.call_api(
            "/sim/v1/stats",
            "GET",
            auth_settings=["BearerToken"],
            response_types_map={200: "object"},
            _return_http_data_only=True,
        )
    assert stats["podsByPhase"].get("Running") == 3
