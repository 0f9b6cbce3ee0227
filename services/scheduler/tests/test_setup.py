"""The composed scheduler (`service.setup`) with real NATS, Redis and a kubesim hub:
an object nothing can take, and a Cluster it cannot read (dead-lettered by the kit),
are reported on the hub as Warning Events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from pydantic import SecretStr

from flotilla.common import events, kube
from flotilla.common.api import Strategy
from flotilla.common.events import ClusterObserved, ObjectRef, ResourceAnalyzed
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.service import started
from flotilla.common.testing import eventually
from flotilla.scheduler.service import SchedulerSettings, setup

pytestmark = pytest.mark.integration


async def test_unschedulable_object_gets_a_warning_event_on_the_hub(
    nats_server: NatsServer,
    redis_server: RedisServer,
    kubesim_factory: Any,
    unique: str,
    tmp_path: Path,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    kubeconfig = tmp_path / "hub.kubeconfig"
    hub.write_kubeconfig(kubeconfig)
    settings = SchedulerSettings(
        service="scheduler",
        instance="only",
        nats_url=nats_server.url,
        redis_url=SecretStr(redis_server.url),
        stream_prefix=f"sched{unique}",
        partitions=2,
        health_host="127.0.0.1",
        health_port=0,
        hub_kubeconfig=kubeconfig,
        capacity_prefix=f"sched:{unique}:",
    )
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "uid": "u-web"},
    }
    ref = ObjectRef.of(obj)
    analyzed = ResourceAnalyzed(
        ref=ref, object=obj, strategy=Strategy.SPLIT, replicas=3, requests={"cpu": 500}
    )
    cluster = ClusterObserved(
        cluster="bad",
        object={
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": "bad"},
            "spec": {"taints": [{"key": "gpu", "effect": "Sometimes"}]},
        },
    )
    async with started(settings, setup) as scheduler:
        bus = scheduler.runtime.bus
        await bus.publish(
            events.envelope(analyzed, key=ref.key, producer="test", uid="u-web", revision=1)
        )
        await bus.publish(events.envelope(cluster, key="bad", producer="test", revision=1))
        async with await kube.client_from_kubeconfig(kubeconfig) as api:
            core = k8s.CoreV1Api(api)

            async def warnings() -> dict[str, Any]:
                listed = await core.list_namespaced_event("default")
                found = {e.reason: e for e in listed.items if e.type == "Warning"}
                return found if {"Unschedulable", "InvalidCluster"} <= found.keys() else {}

            found = await eventually(warnings, timeout=20, what="both Warning Events")
        letters = await bus.dead_letters()
    assert found["Unschedulable"].involved_object.name == "web"
    assert found["Unschedulable"].message
    invalid = found["InvalidCluster"]
    assert (invalid.involved_object.kind, invalid.involved_object.name) == ("Cluster", "bad")
    assert "spec.taints[0].effect" in invalid.message
    assert [letter.reason for letter in letters] == ["InvalidObject"]
