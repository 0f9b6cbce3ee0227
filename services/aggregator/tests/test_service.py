"""The aggregator on a real nats-server and a kubesim hub, fed by hand-made
`PlacementDecided`, `MemberStatusObserved` and `ClusterObserved` events, as the
scheduler, the syncer and the watcher publish them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.aggregator import service
from flotilla.common import builders, events, kube
from flotilla.common.api import CLUSTER_STATUS_ANNOTATION, PLACEMENT_ANNOTATION, PlacementState
from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.common.dispatch import EventBus
from flotilla.common.infra import NatsServer
from flotilla.common.service import started
from flotilla.common.testing import CRD_DIR, eventually, kubeconfig_file, service_settings
from flotilla.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

NS = "shop"
FULL = {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3}


class Setup:
    def __init__(self, dyn: DynamicClient) -> None:
        self.dyn = dyn
        self.bus: EventBus
        self.app: service.Aggregator
        self._n = 0

    async def resource(self, obj: Any) -> Any:
        return await kube.resource_for(self.dyn, obj["apiVersion"], obj["kind"])

    def count_hub_reads(self) -> list[int]:
        """From now on, count the aggregator's reads of the hub (in the one element)."""
        counted = [0]
        real_get = self.app.dyn.get

        async def counted_get(*args: Any, **kwargs: Any) -> Any:
            counted[0] += 1
            return await real_get(*args, **kwargs)

        self.app.dyn.get = counted_get  # type: ignore[method-assign]
        return counted

    async def create(self, obj: Any) -> dict[str, Any]:
        return kube.checked(await self.dyn.create(await self.resource(obj), body=obj))

    async def get(self, obj: Any) -> dict[str, Any]:
        meta = obj["metadata"]
        return kube.checked(
            await self.dyn.get(
                await self.resource(obj), name=meta["name"], namespace=meta.get("namespace")
            )
        )

    async def publish(
        self,
        payload: events.AnyPayload,
        key: str,
        revision: int = 0,
        produced_at: datetime | None = None,
    ) -> None:
        self._n += 1
        await self.bus.publish(
            events.envelope(
                payload,
                key=key,
                producer="test",
                revision=revision,
                dedupe=(self._n,),
                produced_at=produced_at,
            )
        )

    async def placed(self, obj: Any, *clusters: tuple[str, int, PlacementState]) -> None:
        decision = builders.decided(obj, *clusters, decision_id=f"d{self._n}", reason="split")
        await self.publish(decision, decision.ref.key)

    async def member(self, obj: Any, cluster: str, hub_generation: int = 1, **status: Any) -> None:
        await self.member_sent(obj, cluster, None, status, hub_generation)

    async def member_sent(
        self,
        obj: Any,
        cluster: str,
        produced_at: datetime | None,
        status: dict[str, Any],
        hub_generation: int = 1,
    ) -> None:
        """A member report the syncer sent at `produced_at`."""
        ref = events.ObjectRef.of(obj)
        observed = events.MemberStatusObserved(
            ref=ref,
            cluster=cluster,
            status=status,
            observed_generation=1,
            generation=1,
            hub_generation=hub_generation,
            ready=status.get("availableReplicas") == status.get("replicas"),
        )
        await self.publish(observed, ref.key, produced_at=produced_at)

    async def cluster(self, name: str, ready: bool, revision: int) -> None:
        obj = {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
        await self.publish(
            events.ClusterObserved(cluster=name, object=obj), f"cluster/{name}", revision
        )


@contextlib.asynccontextmanager
async def aggregator(
    kubesim_factory: Any, nats_server: NatsServer, prefix: str, *, window: float = 0.2
) -> AsyncIterator[Setup]:
    hub: KubeSim = await kubesim_factory("hub", hub=True)
    settings = service_settings(
        "aggregator",
        nats_server,
        prefix,
        service.AggregatorSettings,
        coalesce_window=window,
    )
    api = await config.new_client_from_config_dict(hub.kubeconfig())
    async with api, DynamicClient(api) as dyn:
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        namespace: Any = {"metadata": {"name": NS}}
        with contextlib.suppress(Exception):
            await k8s.CoreV1Api(api).create_namespace(namespace)
        with kubeconfig_file(hub.kubeconfig()) as kubeconfig:
            settings = settings.model_copy(update={"hub_kubeconfig": kubeconfig})
            setup = Setup(dyn)
            async with started(settings, service.setup) as running:
                setup.bus = running.runtime.bus
                setup.app = running.app
                yield setup


def web(replicas: int = 9) -> dict[str, Any]:
    return manifest(
        "apps/v1",
        "Deployment",
        {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template(pod_spec(container())),
        },
        name="web",
        namespace=NS,
    )


A, R = PlacementState.ACTIVE, PlacementState.RETIRING


async def test_nine_replicas_three_ways_one_write_and_a_dead_member_goes_stale(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}", window=1.0) as s:
        obj = await s.create(web())
        await s.placed(obj, ("a", 3, A), ("b", 3, A), ("c", 3, A))
        for cluster in "abc":  # several reports per member inside one window
            await s.member(obj, cluster, replicas=3, readyReplicas=1)
            await s.member(obj, cluster, replicas=3, readyReplicas=2)
            await s.member(obj, cluster, **FULL)

        async def aggregated() -> dict[str, Any] | None:
            hub = await s.get(obj)
            written = CLUSTER_STATUS_ANNOTATION in (hub["metadata"].get("annotations") or {})
            return hub if written and hub.get("status", {}).get("readyReplicas") == 9 else None

        hub = await eventually(aggregated, what="readyReplicas 9 on the hub")
        assert hub["status"]["availableReplicas"] == 9
        assert hub["status"]["observedGeneration"] == 1
        annotations = hub["metadata"]["annotations"]
        placement = json.loads(annotations[PLACEMENT_ANNOTATION])
        assert [c["cluster"] for c in placement["clusters"]] == ["a", "b", "c"]
        breakdown = json.loads(annotations[CLUSTER_STATUS_ANNOTATION])
        assert [(e["cluster"], e["status"]["readyReplicas"]) for e in breakdown] == [
            ("a", 3),
            ("b", 3),
            ("c", 3),
        ]
        # Ten events (a placement and nine reports) became one write of each kind.
        await eventually(lambda: not s.app._pending, what="no flush pending")
        assert (s.app.status_writes, s.app.annotation_writes) == (1, 1)

        # Every version of the hub object from here on is watched: a reader must never
        # find the new sums beside the old breakdown (the annotations are written first).
        versions: list[dict[str, Any]] = []

        async def record_versions() -> None:
            since = hub["metadata"]["resourceVersion"]
            resource = await s.resource(obj)
            async for event in s.dyn.watch(
                resource, namespace=NS, name="web", resource_version=since, timeout=30
            ):
                versions.append(event["raw_object"])

        recording = asyncio.create_task(record_versions())
        await s.cluster("b", ready=False, revision=5)

        async def stale() -> dict[str, Any] | None:
            hub = await s.get(obj)
            entries = json.loads(hub["metadata"]["annotations"][CLUSTER_STATUS_ANNOTATION])
            marked = {e["cluster"]: e["stale"] for e in entries}.get("b")
            return hub if marked and hub["status"].get("availableReplicas") == 6 else None

        hub = await eventually(stale, what="availableReplicas 6 with b down")
        entries = json.loads(hub["metadata"]["annotations"][CLUSTER_STATUS_ANNOTATION])
        assert {e["cluster"]: e["stale"] for e in entries} == {"a": False, "b": True, "c": False}
        seen = hub["metadata"]["resourceVersion"]
        await eventually(
            lambda: any(v["metadata"]["resourceVersion"] == seen for v in versions),
            what="the watch caught up",
        )
        recording.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recording
        six = [v for v in versions if (v.get("status") or {}).get("availableReplicas") == 6]
        assert six, versions
        for version in six:
            shown = json.loads(version["metadata"]["annotations"][CLUSTER_STATUS_ANNOTATION])
            assert {e["cluster"]: e["stale"] for e in shown}["b"] is True, version

        # A report identical to what the hub shows writes nothing.
        writes = s.app.status_writes
        await s.member(obj, "a", **FULL)
        await eventually(lambda: not s.app._pending, what="no flush pending")
        assert s.app.status_writes == writes


async def test_a_conflicting_hub_write_is_retried_from_the_latest_object(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}", window=0.3) as s:
        obj = await s.create(web(3))
        resource = await s.resource(obj)
        real_write = s.app._write_status
        raced = False

        async def racing_write(*args: Any, **kwargs: Any) -> Any:
            nonlocal raced
            if not raced:  # someone else changes the object between read and write
                raced = True
                patch = {"metadata": {"labels": {"touched": "yes"}}}
                await s.dyn.patch(
                    resource,
                    patch,
                    name="web",
                    namespace=NS,
                    content_type="application/merge-patch+json",
                )
            return await real_write(*args, **kwargs)

        s.app._write_status = racing_write  # type: ignore[method-assign]
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", **FULL)

        async def written() -> dict[str, Any] | None:
            hub = await s.get(obj)
            return hub if hub.get("status", {}).get("readyReplicas") == 3 else None

        hub = await eventually(written, what="status written after the conflict")
        assert s.app.conflicts >= 1
        assert hub["metadata"]["labels"]["touched"] == "yes"


async def test_a_slow_flush_is_not_overtaken_by_a_newer_one(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """A report arriving while a flush of the same object is still writing (a slow hub)
    is folded after that flush, never beside it: the older fold, retried after the
    newer one landed, would otherwise leave the hub showing the older reports."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}", window=0.3) as s:
        obj = await s.create(web(3))
        real_write = s.app._write_status
        entered, gate = asyncio.Event(), asyncio.Event()

        async def slow_first_write(*args: Any, **kwargs: Any) -> Any:
            if not entered.is_set():  # the first status write hangs until released
                entered.set()
                await gate.wait()
            return await real_write(*args, **kwargs)

        s.app._write_status = slow_first_write  # type: ignore[method-assign]
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", replicas=3, readyReplicas=1, availableReplicas=1)
        await asyncio.wait_for(entered.wait(), 30)
        await s.member(obj, "a", **FULL)
        await asyncio.sleep(1.5)  # several windows: room for a second flush to run
        gate.set()

        async def quiet() -> bool:
            return not s.app._flushes

        await eventually(quiet, what="every flush done")
        hub = await s.get(obj)
        assert hub["status"]["readyReplicas"] == 3, hub["status"]


async def test_a_member_report_older_than_the_one_kept_is_not_shown(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """A copy's report handed over after a newer one of the same copy (as a redelivery
    after a partition moved is) does not replace it: the hub keeps the newer state."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}") as s:
        obj = await s.create(web(6))
        await s.placed(obj, ("a", 3, A), ("b", 3, A))
        sent = datetime.now(UTC)
        earlier = sent - timedelta(seconds=1)
        await s.member_sent(obj, "a", sent, FULL)
        await s.member_sent(obj, "a", earlier, {**FULL, "readyReplicas": 1, "availableReplicas": 1})
        await s.member_sent(obj, "b", sent, FULL)  # handled after the older one

        async def folded() -> dict[str, Any] | None:
            # The breakdown is written before the sums: wait for a version whose
            # status is the fold of both members' entries.
            hub = await s.get(obj)
            annotations = hub["metadata"].get("annotations") or {}
            entries = json.loads(annotations.get(CLUSTER_STATUS_ANNOTATION) or "[]")
            if {e["cluster"] for e in entries if e.get("status")} != {"a", "b"}:
                return None
            shown = sum(e["status"].get("readyReplicas") or 0 for e in entries)
            return hub if (hub.get("status") or {}).get("readyReplicas") == shown else None

        hub = await eventually(folded, what="both members' reports on the hub")
        assert hub["status"]["readyReplicas"] == 6, hub["status"]


async def test_a_restarted_aggregator_still_knows_every_member(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    prefix = f"ag{unique}"
    async with aggregator(kubesim_factory, nats_server, prefix) as s:
        obj = await s.create(web(6))
        await s.placed(obj, ("a", 3, A), ("b", 3, R))
        await s.member(obj, "a", **FULL)
        await s.member(obj, "b", **FULL)
        await eventually(lambda: s.app.status_writes == 1, what="first write")
    async with aggregator(kubesim_factory, nats_server, prefix) as s:
        obj = await s.create(web(6))  # a fresh hub: only the durable records remember
        await s.member(obj, "a", replicas=3, readyReplicas=2, availableReplicas=2)

        async def folded() -> dict[str, Any] | None:
            hub = await s.get(obj)
            return hub if hub.get("status", {}).get("readyReplicas") == 5 else None

        await eventually(folded, what="a's new report folded with b's remembered one")


async def test_a_changed_fold_is_written_without_reading_the_hub_first(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """The object this replica last wrote stands in for a read: its resourceVersion
    is the write's precondition, so a flush that changes something costs the writes only."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}") as s:
        obj = await s.create(web(3))
        reads = s.count_hub_reads()
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", replicas=3, readyReplicas=1, availableReplicas=1)
        await eventually(lambda: s.app.status_writes == 1, what="first write")
        first = reads[0]
        await s.member(obj, "a", **FULL)

        async def written() -> dict[str, Any] | None:
            hub = await s.get(obj)
            return hub if hub.get("status", {}).get("readyReplicas") == 3 else None

        await eventually(written, what="the second report on the hub")
        await eventually(lambda: not s.app._flushes, what="every flush done")
        assert (first, reads[0], s.app.status_writes) == (1, 1, 2)


async def test_a_report_of_a_cluster_the_placement_does_not_name_flushes_nothing(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """A released cluster's copy reports its removal after the decision that dropped
    it: no fold reads it, so it costs no flush (nor its confirming read of the hub);
    it is folded once a placement names its cluster."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}") as s:
        obj = await s.create(web(3))
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", **FULL)
        await eventually(lambda: s.app.status_writes == 1, what="first write")
        await eventually(lambda: not s.app._flushes, what="every flush done")
        reads = s.count_hub_reads()
        await s.member(obj, "b", replicas=2, readyReplicas=2, availableReplicas=2)

        async def recorded() -> bool:
            entry = await s.app.reports.get(events.ObjectRef.of(obj).key)
            return entry is not None and "b" in entry.value.members

        await eventually(recorded, what="b's report recorded")
        await asyncio.sleep(0.5)  # past the coalesce window
        assert (reads[0], s.app._flushes, s.app.status_writes) == (0, set(), 1)

        await s.placed(obj, ("a", 3, A), ("b", 2, A))

        async def folded() -> dict[str, Any] | None:
            hub = await s.get(obj)
            return hub if hub.get("status", {}).get("readyReplicas") == 5 else None

        await eventually(folded, what="b's report folded once b is placed")


async def test_a_fold_the_remembered_object_shows_is_checked_against_the_hub(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """Another writer (a replica that held the partition meanwhile) may have changed
    the status since this replica wrote it: the hub, not the memory, decides that
    nothing needs writing."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}") as s:
        obj = await s.create(web(3))
        await s.placed(obj, ("a", 3, A))
        await s.member(obj, "a", **FULL)

        async def shown(ready: int) -> dict[str, Any] | None:
            hub = await s.get(obj)
            return hub if hub.get("status", {}).get("readyReplicas") == ready else None

        await eventually(lambda: shown(3), what="the report on the hub")
        await eventually(lambda: not s.app._flushes, what="every flush done")
        hub = await s.get(obj)
        resource = await s.resource(obj)
        other = {**hub, "status": {**hub["status"], "readyReplicas": 1}}
        kube.checked(await s.dyn.replace(resource.subresources["status"], body=other, namespace=NS))
        await s.member(obj, "a", **FULL)  # folds to what this replica wrote before
        await eventually(lambda: shown(3), what="the fold written over the other writer's")


async def test_a_status_with_a_null_is_written_whole(
    kubesim_factory: Any, nats_server: NatsServer, unique: str
) -> None:
    """A status is written as a merge patch of what changed, except when it holds a
    null (a merge patch would remove that field): then the object is written whole."""
    async with aggregator(kubesim_factory, nats_server, f"ag{unique}") as s:
        pod = await s.create(manifest("v1", "Pod", pod_spec(container()), name="one", namespace=NS))
        await s.placed(pod, ("a", 1, A))
        await s.member(pod, "a", phase="Pending", message="scheduling")

        async def phase(wanted: str) -> dict[str, Any] | None:
            hub = await s.get(pod)
            return hub if hub.get("status", {}).get("phase") == wanted else None

        await eventually(lambda: phase("Pending"), what="the Pod's first status")
        await s.member(pod, "a", phase="Running", message=None)
        hub = await eventually(lambda: phase("Running"), what="a status holding a null")
        assert "message" in hub["status"] and hub["status"]["message"] is None
