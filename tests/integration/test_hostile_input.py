"""Issue 8 end to end: input that once stalled or misled the pipeline, on a kubesim hub
with the watcher, the dependency detector and the scheduler as in-process services
on real NATS and Redis.

What each test proves:

* objects as large as an API server stores (a ~700 KB ConfigMap, ~1.4 MB as JSON;
  a Deployment carrying over 1 MiB, 200 KB of it in an annotation) and a custom
  resource nested 250 levels deep are observed *and* analysed, and a later object
  of each type still flows;
* on a bus too small for an object, that object is reported (Warning Event,
  dead-letter entry with its identity) and skipped, and its type keeps flowing;
* a Deployment with a 253-character name and a missing ConfigMap is analysed,
  reported and placed;
* a Deployment in namespace ``bad`` never gets a Secret of Flotilla's own
  namespace into its analysis, by annotation or by a generic reference.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.common import capacity, events, kube
from flotilla.common.api import DEPENDENCIES_ANNOTATION
from flotilla.common.bus import Bus
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.service import started
from flotilla.common.testing import CRD_DIR, eventually, schemaless_crd
from flotilla.depdetector import service as depdetector
from flotilla.kubesim.server import KubeSim
from flotilla.scheduler import service as scheduler
from flotilla.watcher import service as watcher

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # The test's own client writes megabyte objects to the hub; aiohttp suggests
    # streaming such bodies, which does not matter for a test.
    pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning"),
]

NS = "shop"
WIDGET_CRD = schemaless_crd("example.com", "Widget", "v1")


class EventLog:
    """Every event published under one prefix, in arrival order."""

    def __init__(self) -> None:
        self.events: list[events.Envelope] = []

    async def on_message(self, msg: Msg) -> None:
        self.events.append(events.decode(msg.data))

    def of(self, event_type: str, key: str) -> list[events.Envelope]:
        return [e for e in self.events if e.type == event_type and e.key == key]


class Installation:
    """A hub, the services under one prefix, and what they published."""

    def __init__(self, hub: KubeSim, api: Any, dyn: DynamicClient, log: EventLog) -> None:
        self.hub = hub
        self.api = api
        self.dyn = dyn
        self.log = log
        self.bus: Bus

    async def create(self, obj: Any) -> dict[str, Any]:
        resource = await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        return kube.checked(await self.dyn.create(resource, body=obj))

    async def flowed(self, obj: Any, timeout: float = 30.0) -> events.ResourceAnalyzed:
        """Wait until `obj` was observed and analysed; the analysis."""
        ref = events.ObjectRef.of(obj)
        await eventually(
            lambda: self.log.of("ResourceObserved", ref.key), timeout, what=f"{ref.key} observed"
        )
        found = await eventually(
            lambda: self.log.of("ResourceAnalyzed", ref.key), timeout, what=f"{ref.key} analysed"
        )
        payload = found[-1].payload
        assert isinstance(payload, events.ResourceAnalyzed)
        return payload

    async def warnings(self, namespace: str, reason: str) -> list[Any]:
        listed = await k8s.CoreV1Api(self.api).list_namespaced_event(namespace)
        return [e for e in listed.items if e.reason == reason and e.type == "Warning"]


@contextlib.asynccontextmanager
async def installation(
    kubesim_factory: Any,
    bus_server: NatsServer,
    tmp_path: Path,
    unique: str,
    *,
    redis: RedisServer | None = None,
) -> AsyncIterator[Installation]:
    """Hub with the CRDs and namespaces, the watcher and the detector (and, given a
    Redis, the scheduler), all under the prefix ``h<unique>``."""
    hub: KubeSim = await kubesim_factory("hub", hub=True)
    kubeconfig = tmp_path / "hub.kubeconfig"
    hub.write_kubeconfig(kubeconfig)
    prefix = f"h{unique}"

    def settings(service: str, **extra: Any) -> dict[str, Any]:
        return {
            "service": service,
            "instance": f"{service}-1",
            "nats_url": bus_server.url,
            "stream_prefix": prefix,
            "partitions": 2,
            "hub_kubeconfig": kubeconfig,
            "health_host": "127.0.0.1",
            "health_port": 0,
            **extra,
        }

    log = EventLog()
    api = await k8s_config.new_client_from_config_dict(hub.kubeconfig(), context=hub.name)
    connection = await nats.connect(bus_server.url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(connection.close)
        stack.push_async_callback(api.close)
        dyn = await stack.enter_async_context(DynamicClient(api))
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        crd: Any = WIDGET_CRD
        await k8s.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
        for name in (NS, "bad", "flotilla-system"):
            namespace: Any = {"metadata": {"name": name}}
            await k8s.CoreV1Api(api).create_namespace(namespace)
        await connection.subscribe(f"{prefix}.events.>", cb=log.on_message)
        await connection.flush()
        setup = Installation(hub, api, dyn, log)

        watching = await stack.enter_async_context(
            started(watcher.WatcherSettings(**settings("watcher")), watcher.setup)
        )
        setup.bus = watching.runtime.bus
        await eventually(watching.app.started.is_set, timeout=30, what="the watcher to start")
        await stack.enter_async_context(
            started(depdetector.DetectorSettings(**settings("depdetector")), depdetector.setup)
        )
        if redis is not None:
            scheduler_settings = scheduler.SchedulerSettings(
                **settings("scheduler", redis_url=redis.url, capacity_prefix=f"{prefix}:capacity:")
            )
            await stack.enter_async_context(started(scheduler_settings, scheduler.setup))
        yield setup


def policy(*selectors: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ClusterPlacementPolicy",
        "metadata": {"name": "everything"},
        "spec": {"resourceSelectors": [{"apiVersion": a, "kind": k} for a, k in selectors]},
    }


def config_map(name: str, value: str = "v") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"value": value},
    }


def deployment(
    name: str, *, namespace: str = NS, env: str = "", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "app",
        "image": "app:1",
        "resources": {"requests": {"cpu": "100m"}},
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/app"}],
    }
    if env:
        container["env"] = [{"name": "BLOB", "value": env}]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {
                    "containers": [container],
                    "volumes": [{"name": "conf", "configMap": {"name": "app-config"}}],
                },
            },
        },
    }


def widget(name: str, depth: int) -> dict[str, Any]:
    nested: dict[str, Any] = {"leaf": True}
    for _ in range(depth):
        nested = {"inner": nested}
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": NS},
        "spec": nested,
    }


SELECTED = (("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("example.com/v1", "Widget"))


async def test_objects_as_large_or_deep_as_the_hub_stores_flow_and_block_nothing(
    kubesim_factory: Any, nats_server: NatsServer, tmp_path: Path, unique: str
) -> None:
    async with installation(kubesim_factory, nats_server, tmp_path, unique) as flotilla:
        await flotilla.create(policy(*SELECTED))
        # 700 KB of newlines: ~1.4 MB once JSON escapes them, as in the report.
        big = await flotilla.create(config_map("big", "\n" * 700_000))
        # The API server caps annotations at 256 KiB in total; the rest of the
        # mebibyte is in the pod template, which it does not cap.
        heavy = await flotilla.create(
            deployment("heavy", env="x" * 2**20, annotations={"note": "n" * 200_000})
        )
        deep = await flotilla.create(widget("deep", 250))
        after = [
            await flotilla.create(obj)
            for obj in (config_map("after"), deployment("after"), widget("after", 3))
        ]

        analysed = await flotilla.flowed(big)
        assert analysed.object["data"]["value"] == "\n" * 700_000
        observed = flotilla.log.of("ResourceObserved", events.ObjectRef.of(big).key)
        assert len(events.encode(observed[0])) > 2**20  # larger than NATS' own default
        analysed = await flotilla.flowed(heavy)
        assert analysed.replicas == 2
        analysed = await flotilla.flowed(deep)
        assert analysed.object["spec"] == deep["spec"]
        for obj in after:
            await flotilla.flowed(obj)
        assert await flotilla.bus.dead_letters() == []


async def test_an_object_the_bus_cannot_carry_is_reported_and_skipped(
    kubesim_factory: Any, tmp_path: Path, unique: str
) -> None:
    """A bus configured below what the hub stores (1 MiB, NATS' default): the object
    that does not fit is reported and skipped; its type keeps flowing, and its next
    change that fits flows too."""
    with NatsServer(config="max_payload: 1MB") as small_bus:
        async with installation(kubesim_factory, small_bus, tmp_path, unique) as flotilla:
            await flotilla.create(policy(*SELECTED))
            big = await flotilla.create(config_map("big", "\n" * 700_000))
            after = await flotilla.create(config_map("after"))
            await flotilla.flowed(after)

            (warning,) = await eventually(
                lambda: flotilla.warnings(NS, "ObjectTooLarge"), what="an ObjectTooLarge Event"
            )
            assert warning.involved_object.name == "big"
            (letter,) = await eventually(flotilla.bus.dead_letters, what="a dead letter")
            assert letter.reason == "ObjectTooLarge"
            assert letter.envelope is not None
            assert letter.envelope.key == events.ObjectRef.of(big).key
            assert "data" not in letter.envelope.payload.object
            assert flotilla.log.of("ResourceObserved", letter.envelope.key) == []

            resource = await flotilla.dyn.resources.get(api_version="v1", kind="ConfigMap")
            await flotilla.dyn.patch(
                resource,
                {"data": {"value": "small now"}},
                name="big",
                namespace=NS,
                content_type="application/merge-patch+json",
            )
            analysed = await flotilla.flowed(big)
            assert analysed.object["data"]["value"] == "small now"


async def test_a_253_character_name_with_a_missing_dependency_is_analysed_and_placed(
    kubesim_factory: Any,
    nats_server: NatsServer,
    redis_server: RedisServer,
    tmp_path: Path,
    unique: str,
) -> None:
    async with installation(
        kubesim_factory, nats_server, tmp_path, unique, redis=redis_server
    ) as flotilla:
        cache = RedisCapacityCache.from_url(redis_server.url, prefix=f"h{unique}:capacity:")
        try:
            node = {"cpu": 8000, "memory": 32 * 2**30, "pods": 110}
            await cache.put(
                capacity.ClusterCapacity(
                    cluster="east",
                    allocatable=node,
                    available=node,
                    nodes=[capacity.NodeCapacity(name="n1", allocatable=node, free=node)],
                    observed_at=time.time(),
                )
            )
        finally:
            await cache.aclose()
        await _ready_cluster(flotilla, "east")
        await flotilla.create(policy(("apps/v1", "Deployment")))
        name = "d" * 253
        long = await flotilla.create(deployment(name))

        analysed = await flotilla.flowed(long)
        assert [d.name for d in analysed.dependencies] == ["app-config"]
        key = events.ObjectRef.of(long).key
        decided = await eventually(
            lambda: flotilla.log.of("PlacementDecided", key), 30, what="a placement"
        )
        payload = decided[-1].payload
        assert isinstance(payload, events.PlacementDecided)
        assert [(p.cluster, p.replicas) for p in payload.clusters] == [("east", 2)]
        (missing,) = await eventually(lambda: flotilla.warnings(NS, "DependencyMissing"))
        assert missing.involved_object.name == name
        assert len(missing.metadata.name) <= 253


async def _ready_cluster(flotilla: Installation, name: str) -> None:
    cluster = await flotilla.create(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"kubeconfigSecretRef": {"namespace": "flotilla-system", "name": name}},
        }
    )
    resource = await flotilla.dyn.resources.get(api_version="flotilla.io/v1alpha1", kind="Cluster")
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    await flotilla.dyn.patch(
        resource.subresources["status"],
        {"status": {"conditions": [ready]}},
        name=cluster["metadata"]["name"],
        content_type="application/merge-patch+json",
    )


async def test_a_member_kubeconfig_never_becomes_a_dependency(
    kubesim_factory: Any, nats_server: NatsServer, tmp_path: Path, unique: str
) -> None:
    async with installation(kubesim_factory, nats_server, tmp_path, unique) as flotilla:
        await flotilla.create(policy(("apps/v1", "Deployment"), ("example.com/v1", "Widget")))
        secret = {"apiVersion": "v1", "kind": "Secret", "name": "east"}
        secret_in_system = {**secret, "namespace": "flotilla-system"}
        by_annotation = deployment(
            "thief",
            namespace="bad",
            annotations={DEPENDENCIES_ANNOTATION: json.dumps([secret_in_system])},
        )
        by_reference = widget("thief", 1)
        by_reference["metadata"]["namespace"] = "bad"
        by_reference["spec"]["credentials"] = secret_in_system
        for obj in (by_annotation, by_reference):
            analysed = await flotilla.flowed(await flotilla.create(obj))
            assert all(d.namespace == "bad" for d in analysed.dependencies)

        def refused_on(events_: list[Any]) -> set[str]:
            return {e.involved_object.kind for e in events_}

        async def both_refused() -> bool:
            return refused_on(await flotilla.warnings("bad", "DependencyRefused")) == {
                "Deployment",
                "Widget",
            }

        await eventually(both_refused, what="a DependencyRefused Event on each")
