"""The syncer as a real process in the end-to-end fixture: works applied to kubesim
members, status and capacity back, crash recovery, member outages.

The tests publish the `WorkRendered` events themselves, marked as the transformer
marks every rendered object, for objects that are not on the hub: the fleet's own
transformer renders nothing for them, so the syncer gets exactly the works a test
gives it (the whole pipeline is `test_transformer.py`'s)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.cli.environment import MEMBERS
from flotilla.common import builders, events
from flotilla.common.api import ORIGIN_LABEL
from flotilla.common.bus import Bus
from flotilla.common.events import ObjectRef, WorkRendered
from flotilla.common.rediscapacity import RedisCapacityCache
from flotilla.common.testing import eventually
from flotilla.common.topology import Topology
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.testing import api_client

from .fleet import HEARTBEAT, STARTUP, Fleet
from .test_end_to_end import fleet

__all__ = ["fleet"]  # the end-to-end fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

NS = "shop"


def deployment(name: str, replicas: int = 3) -> dict[str, Any]:
    return builders.rendered(
        builders.deployment(name, NS, replicas=replicas, requests={"cpu": "250m"})
    )


def config_map(name: str) -> dict[str, Any]:
    return builders.rendered(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NS},
            "data": {"mode": "production"},
        }
    )


class Transformer:
    """Publishes works as the transformer would."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.sent = 0

    async def send(
        self, cluster: str, manifest: dict[str, Any] | None, ref: ObjectRef | None = None
    ) -> None:
        ref = ref or ObjectRef.of(manifest or {})
        self.sent += 1
        payload = WorkRendered(
            ref=ref, cluster=cluster, decision_id=f"d{self.sent}", manifest=manifest
        )
        await self.bus.publish(
            events.envelope(
                payload,
                key=events.work_key(ref, cluster),
                producer="transformer-test",
                dedupe=(self.sent,),
            )
        )


@contextlib.asynccontextmanager
async def transformer(fleet: Fleet) -> AsyncIterator[Transformer]:
    bus = await Bus.connect(
        fleet.nats_server.url,
        topology=Topology(prefix=fleet.prefix, partitions=4),
        producer="transformer-test",
    )
    try:
        yield Transformer(bus)
    finally:
        await bus.close()


async def get(member: KubeSim, path: str) -> dict[str, Any] | None:
    async with api_client(member) as api:
        try:
            response = await api.call_api(
                path,
                "GET",
                auth_settings=["BearerToken"],
                response_types_map={200: "object"},
                _return_http_data_only=True,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
    found: dict[str, Any] = response
    return found


async def ours(member: KubeSim, plural_path: str) -> list[str]:
    """Names of the objects carrying Flotilla's origin label on a member."""
    async with api_client(member) as api:
        listed: dict[str, Any] = await api.call_api(
            plural_path,
            "GET",
            query_params=[("labelSelector", ORIGIN_LABEL)],
            auth_settings=["BearerToken"],
            response_types_map={200: "object"},
            _return_http_data_only=True,
        )
    return sorted(item["metadata"]["name"] for item in listed["items"])


def deployment_path(name: str) -> str:
    return f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"


def config_map_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/configmaps/{name}"


async def test_registering_a_member_is_all_it_takes(fleet: Fleet) -> None:
    cache = RedisCapacityCache.from_url(fleet.redis_server.url, prefix=f"{fleet.prefix}:capacity:")
    try:

        async def recorded() -> bool:
            snapshot = await cache.snapshot(list(MEMBERS))
            return set(snapshot.clusters) == set(MEMBERS)

        await eventually(recorded, timeout=STARTUP, what="capacity records of every member")
        snapshot = await cache.snapshot(list(MEMBERS))
        for record in snapshot.clusters.values():
            assert record.allocatable["cpu"] == 3 * 8000
            assert len(record.nodes) == 3
        for name in MEMBERS:
            await eventually(
                lambda name=name: _equals(fleet.ready(name), "True"),  # type: ignore[misc]
                timeout=30,
                what=f"{name} Ready",
            )
        assert fleet.of("CapacityChanged")
    finally:
        await cache.aclose()


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_a_deployment_work_runs_on_the_member_and_its_removal_deletes_it(
    fleet: Fleet,
) -> None:
    member = fleet.members["us-east"]
    async with transformer(fleet) as works:
        manifest = deployment("web", replicas=3)
        ref = ObjectRef.of(manifest)
        await works.send("us-east", manifest)

        def ready_report() -> bool:
            return any(
                isinstance(e.payload, events.MemberStatusObserved)
                and e.payload.cluster == "us-east"
                and e.payload.ready
                for e in fleet.of("MemberStatusObserved", ref.key)
            )

        await fleet.wait_for(
            "MemberStatusObserved", ref.key, where=lambda e: ready_report(), timeout=STARTUP
        )
        assert member.stats()["podsByPhase"].get("Running") == 3
        assert await get(fleet.members["us-west"], deployment_path("web")) is None

        await works.send("us-east", None, ref=ref)

        async def gone() -> bool:
            return await get(member, deployment_path("web")) is None and not member.stats()[
                "podsByPhase"
            ].get("Running")

        await eventually(gone, timeout=30, what="the Deployment and its pods gone")
        await fleet.wait_for(
            "MemberStatusObserved",
            ref.key,
            where=lambda e: (
                isinstance(e.payload, events.MemberStatusObserved) and not e.payload.exists
            ),
        )


async def test_a_syncer_killed_mid_apply_converges_without_duplicates_or_leftovers(
    fleet: Fleet,
) -> None:
    member = fleet.members["us-west"]
    names = [f"app{i}" for i in range(12)]
    async with transformer(fleet) as works:
        for name in names:
            await works.send("us-west", deployment(name, replicas=2))
            await works.send("us-west", config_map(f"{name}-settings"))

        async def some_applied() -> bool:
            return bool(await ours(member, f"/apis/apps/v1/namespaces/{NS}/deployments"))

        await eventually(some_applied, timeout=STARTUP, what="the first works applied")
        assert await fleet.stop_service("syncer", kill=True) == -9
        await fleet.start_service("syncer")

        async def all_applied() -> bool:
            deployed = await ours(member, f"/apis/apps/v1/namespaces/{NS}/deployments")
            settings = await ours(member, f"/api/v1/namespaces/{NS}/configmaps")
            return deployed == sorted(names) and len(settings) == len(names)

        await eventually(all_applied, timeout=STARTUP, what="every work applied after the restart")

        # One ReplicaSet per Deployment and exactly its pods: nothing applied twice.
        async def pods_settled() -> bool:
            return bool(member.stats()["podsByPhase"].get("Running") == 2 * len(names))

        await eventually(pods_settled, timeout=60, what="two pods per Deployment")
        replica_sets = await ours(member, f"/apis/apps/v1/namespaces/{NS}/replicasets")
        assert len(replica_sets) <= len(names)

        # Remove half, kill it in the middle of that, restart: nothing left behind.
        removed, kept = names[:6], names[6:]
        for name in removed:
            for manifest in (deployment(name, replicas=2), config_map(f"{name}-settings")):
                await works.send("us-west", None, ref=ObjectRef.of(manifest))

        async def some_removed() -> bool:
            deployed = await ours(member, f"/apis/apps/v1/namespaces/{NS}/deployments")
            return len(deployed) < len(names)

        await eventually(some_removed, timeout=30, what="the first removals")
        assert await fleet.stop_service("syncer", kill=True) == -9
        await fleet.start_service("syncer")

        async def only_kept() -> bool:
            deployed = await ours(member, f"/apis/apps/v1/namespaces/{NS}/deployments")
            settings = await ours(member, f"/api/v1/namespaces/{NS}/configmaps")
            return deployed == sorted(kept) and settings == sorted(f"{n}-settings" for n in kept)

        await eventually(only_kept, timeout=STARTUP, what="exactly the kept works on the member")

        async def pods_of_kept() -> bool:
            return bool(member.stats()["podsByPhase"].get("Running") == 2 * len(kept))

        await eventually(pods_of_kept, timeout=60, what="no pods left behind")


async def test_a_member_outage_marks_it_not_ready_and_drift_is_repaired_on_return(
    fleet: Fleet,
) -> None:
    member = fleet.members["eu-central"]
    async with transformer(fleet) as works:
        await works.send("eu-central", deployment("api", replicas=2))
        await works.send("eu-central", config_map("api-settings"))

        async def applied() -> bool:
            return (
                await get(member, deployment_path("api")) is not None
                and await get(member, config_map_path("api-settings")) is not None
            )

        await eventually(applied, timeout=STARTUP, what="the works applied")
        await eventually(lambda: _equals(fleet.ready("eu-central"), "True"), timeout=30)

        await member.set_outage(True)
        down_at = time.monotonic()
        await eventually(
            lambda: _equals(fleet.ready("eu-central"), "False"),
            timeout=3 * HEARTBEAT + 10,
            what="eu-central not Ready",
        )
        # Three missed heartbeats, plus the beat in flight and the hub write.
        assert time.monotonic() - down_at <= 3 * HEARTBEAT + 3
        assert await fleet.ready("us-east") == "True"  # the others are untouched

        # While nobody can reach it, someone edits one object and deletes another.
        deployments = member.store.resource_type("apps/v1", "Deployment")
        edited = member.store.get(deployments, NS, "api")
        edited["spec"]["replicas"] = 5
        member.store.update(deployments, edited)
        member.store.delete(member.store.resource_type("v1", "ConfigMap"), NS, "api-settings")

        await member.set_outage(False)
        await eventually(
            lambda: _equals(fleet.ready("eu-central"), "True"), timeout=45, what="Ready again"
        )

        async def repaired() -> bool:
            found = await get(member, deployment_path("api"))
            return (
                found is not None
                and found["spec"]["replicas"] == 2
                and await get(member, config_map_path("api-settings")) is not None
            )

        await eventually(repaired, timeout=60, what="the edit set back, the deletion undone")
