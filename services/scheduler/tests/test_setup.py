"""The composed scheduler (`service.setup`) with real NATS, Redis and a kubesim hub:
an object nothing can take is reported on the hub as a Warning Event."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from flotilla.common import events, kube
from flotilla.common.api import Strategy
from flotilla.common.events import ObjectRef, ResourceAnalyzed
from flotilla.common.infra import NatsServer, RedisServer
from flotilla.common.service import started
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
        redis_url=redis_server.url,
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
    async with started(settings, setup) as scheduler:
        await scheduler.runtime.bus.publish(
            events.envelope(analyzed, key=ref.key, producer="test", uid="u-web", revision=1)
        )
        async with await kube.client_from_kubeconfig(kubeconfig) as api:
            core = k8s.CoreV1Api(api)
            deadline = time.monotonic() + 20
            while True:
                listed = await core.list_namespaced_event("default")
                found = [e for e in listed.items if e.reason == "Unschedulable"]
                if found:
                    break
                assert time.monotonic() < deadline, "no Unschedulable event on the hub"
                await asyncio.sleep(0.1)
    assert found[0].type == "Warning"
    assert found[0].involved_object.name == "web"
    assert found[0].message
