"""Issue 4 end to end: a kubesim hub, a real nats-server, the watcher and the
dependency detector as in-process services on their own runtimes.

What each test proves:

* a Deployment selected by a policy becomes a `ResourceAnalyzed` event carrying its
  dependencies, and the ``flotilla.io/dependencies`` annotation appears on the hub;
  Flotilla's own annotation writes do not trigger a new analysis, a user's do;
* a watcher that is stopped and started again publishes every change made while it
  was down — by resuming its watch, or by re-listing when the position expired —
  also when it is a real process killed with SIGKILL;
* a policy for a CRD created after the watcher started is honoured without a
  restart, and deleting it stops that watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.dynamic import DynamicClient
from nats.aio.msg import Msg

from flotilla.common import events, kube
from flotilla.common.api import DEPENDENCIES_ANNOTATION, PLACEMENT_ANNOTATION
from flotilla.common.config import Settings
from flotilla.common.infra import NatsServer
from flotilla.common.service import started
from flotilla.common.testing import CRD_DIR, eventually, schemaless_crd
from flotilla.depdetector import service as depdetector
from flotilla.kubesim.server import KubeSim
from flotilla.watcher import service as watcher

pytestmark = pytest.mark.integration


class EventLog:
    """Every event published under one stream prefix, decoded, in arrival order."""

    def __init__(self) -> None:
        self.events: list[events.Envelope] = []

    async def _on_message(self, msg: Msg) -> None:
        self.events.append(events.decode(msg.data))

    def of(self, event_type: str, key: str | None = None) -> list[events.Envelope]:
        return [e for e in self.events if e.type == event_type and (key is None or e.key == key)]

    async def wait_for(
        self,
        event_type: str,
        key: str | None = None,
        *,
        where: Callable[[events.Envelope], bool] = lambda _: True,
        timeout: float = 10.0,
    ) -> events.Envelope:
        def found() -> events.Envelope | None:
            return next((e for e in self.of(event_type, key) if where(e)), None)

        result: events.Envelope = await eventually(
            found, timeout=timeout, what=f"{event_type} {key or ''}"
        )
        return result


@pytest.fixture
async def event_log(nats_server: NatsServer, prefix: str) -> AsyncIterator[EventLog]:
    log = EventLog()
    nc = await nats.connect(nats_server.url)
    try:
        await nc.subscribe(f"{prefix}.events.>", cb=log._on_message)
        await nc.flush()
        yield log
    finally:
        await nc.close()


@pytest.fixture
def prefix(unique: str) -> str:
    return f"it{unique}"


@pytest.fixture
def settings_for(nats_server: NatsServer, prefix: str, tmp_path: Path) -> Callable[[str], Settings]:
    """Settings of one service replica under the test's prefix, talking to `hub`."""

    def build(service: str) -> Settings:
        return Settings(
            service=service,
            instance=f"{service}-1",
            nats_url=nats_server.url,
            stream_prefix=prefix,
            partitions=2,
            hub_kubeconfig=tmp_path / "hub.kubeconfig",
            health_host="127.0.0.1",
            health_port=0,
        )

    return build


async def install_crds(api: Any) -> None:
    await kube.install_crds(api, CRD_DIR.glob("*.yaml"))


@contextlib.asynccontextmanager
async def hub_client(hub: KubeSim) -> AsyncIterator[Any]:
    api = await k8s_config.new_client_from_config_dict(hub.kubeconfig(), context=hub.name)
    try:
        yield api
    finally:
        await api.close()


HubFactory = Callable[..., Awaitable[KubeSim]]


@pytest.fixture
def hub_factory(kubesim_factory: Any, tmp_path: Path) -> HubFactory:
    """`await hub_factory(watch_window=...)`: a hub with the CRDs and its kubeconfig file."""

    async def build(**options: Any) -> KubeSim:
        hub: KubeSim = await kubesim_factory("hub", hub=True, **options)
        hub.write_kubeconfig(tmp_path / "hub.kubeconfig")
        async with hub_client(hub) as api:
            await install_crds(api)
        return hub

    return build


@pytest.fixture
async def hub(hub_factory: HubFactory) -> KubeSim:
    return await hub_factory()


@pytest.fixture
async def api(hub: KubeSim) -> AsyncIterator[Any]:
    async with hub_client(hub) as client:
        yield client


NS = "shop"


# --- builders -------------------------------------------------------------------------


def deployment(name: str, *, replicas: int = 2, labels: dict[str, str] | None = None) -> Any:
    pod_labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {"team": "shop"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": "web-sa",
                    "imagePullSecrets": [{"name": "registry"}],
                    "volumes": [
                        {"name": "conf", "configMap": {"name": "web-config"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                    ],
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx",
                            "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
                            "env": [
                                {
                                    "name": "PASSWORD",
                                    "valueFrom": {
                                        "secretKeyRef": {"name": "web-secret", "key": "pw"}
                                    },
                                }
                            ],
                        }
                    ],
                },
            },
        },
    }


def cluster_policy(name: str, api_version: str, kind: str, **spec: Any) -> Any:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ClusterPlacementPolicy",
        "metadata": {"name": name},
        "spec": {"resourceSelectors": [{"apiVersion": api_version, "kind": kind}], **spec},
    }


def key(name: str, kind: str = "Deployment", api_version: str = "apps/v1") -> str:
    return f"{api_version}/{kind}/{NS}/{name}"


WIDGET_CRD = schemaless_crd("example.com", "Widget", "v1")


def widget(name: str) -> Any:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"size": 1, "configRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "w"}},
    }


class Hub:
    """Terse writes to the hub for the tests."""

    def __init__(self, dyn: DynamicClient) -> None:
        self.dyn = dyn

    async def _resource(self, obj: Any) -> Any:
        return await self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    async def create(self, obj: Any) -> dict[str, Any]:
        return kube.checked(await self.dyn.create(await self._resource(obj), body=obj))

    async def patch(self, obj: Any, patch: Any) -> dict[str, Any]:
        meta = obj["metadata"]
        return kube.checked(
            await self.dyn.patch(
                await self._resource(obj),
                patch,
                name=meta["name"],
                namespace=meta.get("namespace"),
                content_type="application/merge-patch+json",
            )
        )

    async def get(self, obj: Any) -> dict[str, Any]:
        meta = obj["metadata"]
        return kube.checked(
            await self.dyn.get(
                await self._resource(obj), name=meta["name"], namespace=meta.get("namespace")
            )
        )

    async def delete(self, obj: Any) -> None:
        meta = obj["metadata"]
        kube.checked(
            await self.dyn.delete(
                await self._resource(obj), name=meta["name"], namespace=meta.get("namespace")
            )
        )


@contextlib.asynccontextmanager
async def hub_writer(hub: KubeSim) -> AsyncIterator[Hub]:
    async with hub_client(hub) as api, DynamicClient(api) as dyn:
        namespace: Any = {"metadata": {"name": NS}}
        await k8s.CoreV1Api(api).create_namespace(namespace)
        yield Hub(dyn)


@contextlib.asynccontextmanager
async def running_watcher(settings: Settings, hub: KubeSim) -> AsyncIterator[watcher.Watcher]:
    async with started(settings, watcher.setup) as service:
        await eventually(service.app.started.is_set, what="the watcher to start", timeout=30)
        yield service.app


@contextlib.asynccontextmanager
async def running_detector(settings: Settings, hub: KubeSim) -> AsyncIterator[None]:
    async with started(settings, depdetector.setup):
        yield


# --- tests ----------------------------------------------------------------------------


async def test_selected_deployment_is_analysed_with_its_dependencies_without_loops(
    hub: KubeSim, event_log: EventLog, settings_for: Callable[[str], Settings]
) -> None:
    async with (
        hub_writer(hub) as writes,
        running_watcher(settings_for("watcher"), hub),
        running_detector(settings_for("depdetector"), hub),
    ):
        await writes.create(cluster_policy("shop", "apps/v1", "Deployment"))
        for name in ("web-sa", "web-config"):
            kind = "ServiceAccount" if name.endswith("sa") else "ConfigMap"
            meta = {"name": name, "namespace": NS}
            await writes.create({"apiVersion": "v1", "kind": kind, "metadata": meta})
        web = deployment("web")
        await writes.create(web)

        analysed = await event_log.wait_for("ResourceAnalyzed", key("web"))
        payload = analysed.payload
        assert isinstance(payload, events.ResourceAnalyzed)
        assert payload.strategy == "split"
        assert payload.replicas == 2
        assert payload.requests == {"cpu": 250, "memory": 64 * 2**20}
        assert payload.policy is not None and payload.policy.name == "shop"
        assert [(d.kind, d.name, d.namespace, d.detected) for d in payload.dependencies] == [
            ("ConfigMap", "web-config", NS, True),
            ("PersistentVolumeClaim", "web-data", NS, True),
            ("Secret", "registry", NS, True),
            ("Secret", "web-secret", NS, True),
            ("ServiceAccount", "web-sa", NS, True),
        ]

        async def annotation() -> Any:
            value = (await writes.get(web))["metadata"].get("annotations", {})
            return value.get(DEPENDENCIES_ANNOTATION)

        written = json.loads(await eventually(annotation))
        assert [e["name"] for e in written] == [d.name for d in payload.dependencies]
        assert all(e["detected"] for e in written)

        async def missing_reported() -> bool:
            listed = await k8s.CoreV1Api(writes.dyn.client).list_namespaced_event(NS)
            return any(
                e.reason == "DependencyMissing" and "web-secret" in e.message for e in listed.items
            )

        await eventually(missing_reported)

        # Flotilla-owned writes: the detector's own annotation (already done) and an
        # aggregator-style placement annotation. A later Deployment is the barrier:
        # the watcher sees one type's events in order, so once the barrier is
        # analysed, any observation the placement write caused would be in the log.
        placement = {"clusters": [{"cluster": "a", "replicas": 2}], "decision": "d1"}
        await writes.patch(
            web, {"metadata": {"annotations": {PLACEMENT_ANNOTATION: json.dumps(placement)}}}
        )
        await writes.patch(web, {"status": {"observedGeneration": 1}})
        await writes.create(deployment("barrier"))
        await event_log.wait_for("ResourceAnalyzed", key("barrier"))
        assert len(event_log.of("ResourceObserved", key("web"))) == 1
        assert len(event_log.of("ResourceAnalyzed", key("web"))) == 1

        # A user's annotation is intent: it is analysed again, with the user's entry
        # first and kept as written.
        mine = [{"apiVersion": "db.example.com/v1", "kind": "Database", "name": "orders"}]
        await writes.patch(
            web, {"metadata": {"annotations": {DEPENDENCIES_ANNOTATION: json.dumps(mine)}}}
        )
        again = await event_log.wait_for(
            "ResourceAnalyzed",
            key("web"),
            where=lambda e: len(e.payload.dependencies) == 6,  # type: ignore[union-attr]
        )
        assert isinstance(again.payload, events.ResourceAnalyzed)
        first = again.payload.dependencies[0]
        assert (first.kind, first.name, first.detected) == ("Database", "orders", False)


@pytest.mark.parametrize(
    "watch_window",
    [pytest.param(1000, id="resumes-watch"), pytest.param(3, id="relists-after-410")],
)
async def test_restarted_watcher_loses_no_change_made_while_it_was_down(
    hub_factory: HubFactory,
    event_log: EventLog,
    settings_for: Callable[[str], Settings],
    watch_window: int,
) -> None:
    hub = await hub_factory(watch_window=watch_window)
    settings = settings_for("watcher")
    kept, changed, removed = deployment("kept"), deployment("changed"), deployment("removed")
    async with hub_writer(hub) as writes:
        await writes.create(cluster_policy("shop", "apps/v1", "Deployment"))
        async with running_watcher(settings, hub):
            for obj in (kept, changed, removed):
                await writes.create(obj)
            for obj in (kept, changed, removed):
                await event_log.wait_for("ResourceObserved", key(obj["metadata"]["name"]))

        # Down: one create, one spec change, one delete, and enough churn on the
        # type to push the watcher's position out of a small watch window.
        await writes.patch(changed, {"spec": {"replicas": 5}})
        await writes.delete(removed)
        await writes.create(deployment("added"))
        for index in range(4):
            churn = deployment(f"churn-{index}")
            await writes.create(churn)
            await writes.delete(churn)
        observed_before = len(event_log.of("ResourceObserved"))

        async with running_watcher(settings, hub):
            await event_log.wait_for("ResourceObserved", key("added"))
            grown = await event_log.wait_for(
                "ResourceObserved", key("changed"), where=lambda e: e.generation == 2
            )
            assert grown.payload.object["spec"]["replicas"] == 5  # type: ignore[union-attr]
            gone = await event_log.wait_for(
                "ResourceObserved",
                key("removed"),
                where=lambda e: e.payload.deleted,  # type: ignore[union-attr]
            )
            assert gone.payload.object["metadata"]["name"] == "removed"  # type: ignore[union-attr]

            # What did not change while it was down is not published again.
            await writes.create(deployment("barrier"))
            await event_log.wait_for("ResourceObserved", key("barrier"))
            assert len(event_log.of("ResourceObserved", key("kept"))) == 1
            churned = [e for e in event_log.of("ResourceObserved") if "churn" in e.key]
            if watch_window > 100:
                # Resumed from its position: even short-lived objects are seen.
                assert sum(e.payload.deleted for e in churned) == 4  # type: ignore[union-attr]
            else:
                # Re-listed: the churn is invisible, which is fine for a level-triggered
                # pipeline.
                assert churned == []
            assert len(event_log.of("ResourceObserved")) > observed_before


async def test_policy_for_a_crd_created_after_start_is_honoured_without_restart(
    hub: KubeSim, event_log: EventLog, settings_for: Callable[[str], Settings]
) -> None:
    async with hub_writer(hub) as writes, running_watcher(settings_for("watcher"), hub) as service:
        assert service.watched_types == []
        await writes.create(WIDGET_CRD)
        first = widget("first")
        await writes.create(first)
        policy = await writes.create(cluster_policy("widgets", "example.com/v1", "Widget"))
        await event_log.wait_for(
            "ConfigChanged", "flotilla.io/v1alpha1/ClusterPlacementPolicy/_/widgets"
        )

        observed = await event_log.wait_for(
            "ResourceObserved", key("first", "Widget", "example.com/v1")
        )
        assert observed.payload.policy is not None  # type: ignore[union-attr]
        await writes.create(widget("second"))
        await event_log.wait_for("ResourceObserved", key("second", "Widget", "example.com/v1"))
        assert [gvk.kind for gvk in service.watched_types] == ["Widget"]

        # The last policy for the type goes: its objects are released, its watch stops.
        await writes.delete(policy)
        for name in ("first", "second"):
            await event_log.wait_for(
                "ResourceObserved",
                key(name, "Widget", "example.com/v1"),
                where=lambda e: e.payload.policy is None,  # type: ignore[union-attr]
            )
        await eventually(lambda: service.watched_types == [], what="the Widget watch to stop")


async def test_an_interpreter_change_reanalyses_the_objects_it_governs(
    hub: KubeSim, event_log: EventLog, settings_for: Callable[[str], Settings]
) -> None:
    def interpreter(replicas_path: str) -> Any:
        return {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "ResourceInterpreter",
            "metadata": {"name": "widgets"},
            "spec": {
                "target": {"apiVersion": "example.com/v1", "kind": "Widget"},
                "strategy": "split",
                "replicas": {"path": replicas_path},
            },
        }

    widget_key = key("w1", "Widget", "example.com/v1")

    def analysed_with(replicas: int) -> Callable[[events.Envelope], bool]:
        return lambda e: getattr(e.payload, "replicas", None) == replicas

    async with (
        hub_writer(hub) as writes,
        running_watcher(settings_for("watcher"), hub),
        running_detector(settings_for("depdetector"), hub),
    ):
        await writes.create(WIDGET_CRD)
        rule = await writes.create(interpreter(".spec.size"))
        await writes.create(cluster_policy("widgets", "example.com/v1", "Widget"))
        item = widget("w1")
        item["spec"]["count"] = 5
        await writes.create(item)
        first = await event_log.wait_for("ResourceAnalyzed", widget_key, where=analysed_with(1))
        assert first.payload.strategy == "split"  # type: ignore[union-attr]

        # Only the interpreter changes, not the object: the object is analysed again.
        await writes.patch(rule, {"spec": {"replicas": {"path": ".spec.count"}}})
        await event_log.wait_for("ResourceAnalyzed", widget_key, where=analysed_with(5))


@contextlib.asynccontextmanager
async def service_process(module: str, settings: Settings, log_path: Path) -> AsyncIterator[Any]:
    """``python -m <module>`` as a real process; the block may kill it."""
    env = {
        **os.environ,
        "FLOTILLA_NATS_URL": settings.nats_url,
        "FLOTILLA_STREAM_PREFIX": settings.stream_prefix,
        "FLOTILLA_PARTITIONS": str(settings.partitions),
        "FLOTILLA_HUB_KUBECONFIG": str(settings.hub_kubeconfig),
        "FLOTILLA_HEALTH_HOST": "127.0.0.1",
        "FLOTILLA_HEALTH_PORT": "0",
        "FLOTILLA_INSTANCE": f"{settings.service}-process",
    }
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, env=env, stdout=log, stderr=log
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()


@pytest.mark.slow  # three Python process start-ups: 4-7 s
async def test_a_killed_watcher_process_loses_nothing_and_the_processes_stop_cleanly(
    hub: KubeSim,
    event_log: EventLog,
    settings_for: Callable[[str], Settings],
    tmp_path: Path,
) -> None:
    settings = settings_for("watcher")
    log_path = tmp_path / "watcher.log"
    kept, changed, removed = deployment("kept"), deployment("changed"), deployment("removed")
    async with hub_writer(hub) as writes:
        await writes.create(cluster_policy("shop", "apps/v1", "Deployment"))
        async with service_process("flotilla.watcher", settings, log_path) as process:
            for obj in (kept, changed, removed):
                await writes.create(obj)
            for obj in (kept, changed, removed):
                # A process start-up on a loaded 2-core machine can take several seconds.
                name = obj["metadata"]["name"]
                await event_log.wait_for("ResourceObserved", key(name), timeout=45)
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL

        await writes.patch(changed, {"spec": {"replicas": 4}})
        await writes.delete(removed)
        await writes.create(deployment("added"))

        async with (
            service_process("flotilla.watcher", settings, log_path) as process,
            service_process("flotilla.depdetector", settings_for("depdetector"), log_path) as det,
        ):
            await event_log.wait_for("ResourceObserved", key("added"), timeout=45)
            await event_log.wait_for("ResourceAnalyzed", key("added"), timeout=45)
            await event_log.wait_for(
                "ResourceObserved", key("changed"), where=lambda e: e.generation == 2
            )
            await event_log.wait_for(
                "ResourceObserved",
                key("removed"),
                where=lambda e: e.payload.deleted,  # type: ignore[union-attr]
            )
            for running in (process, det):
                running.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(running.wait(), 15) == 0, log_path.read_text()
        assert len(event_log.of("ResourceObserved", key("kept"))) == 1
