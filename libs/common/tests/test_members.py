"""The member-cluster client pool against a real kubesim hub and members."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient

from flotilla.common import kube, members
from flotilla.common.errors import InvalidObject, Unavailable
from flotilla.common.testing import CRD_DIR, eventually

NAMESPACE = "flotilla-system"
FAST = kube.Timeouts(connect=1.0, request=0.5)
QUICK_BACKOFF = members.Backoff(initial=0.05, maximum=0.2)


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)],
    ids=["none", "first", "second", "third", "capped"],
)
def test_backoff_doubles_up_to_its_maximum(failures: int, delay: float) -> None:
    assert members.Backoff(initial=0.5, factor=2.0, maximum=30.0).delay(failures) == delay


@dataclass
class Fleet:
    hub: Any
    api: ApiClient
    factory: Any

    async def member(self, name: str, *, key: str = "kubeconfig") -> Any:
        """A member kubesim registered on the hub: Secret + Cluster. A bare API server
        (hub=True) is all the pool needs, and costs no simulator."""
        kubesim = await self.factory(name, hub=True)
        await self.write_secret(name, kubesim.kubeconfig(), key=key)
        await self.write_cluster(name, secret=f"{name}-kubeconfig")
        return kubesim

    async def write_secret(self, name: str, kubeconfig: Any, *, key: str = "kubeconfig") -> None:
        raw = kubeconfig if isinstance(kubeconfig, bytes) else yaml.safe_dump(kubeconfig).encode()
        body = {
            "metadata": {"name": f"{name}-kubeconfig", "namespace": NAMESPACE},
            "data": {key: base64.b64encode(raw).decode()},
        }
        core = client.CoreV1Api(self.api)
        try:
            await core.replace_namespaced_secret(f"{name}-kubeconfig", NAMESPACE, body)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            await core.create_namespaced_secret(NAMESPACE, body)

    async def write_cluster(self, name: str, *, secret: str) -> None:
        await client.CustomObjectsApi(self.api).create_cluster_custom_object(
            "flotilla.io",
            "v1alpha1",
            "clusters",
            {
                "apiVersion": "flotilla.io/v1alpha1",
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": {"kubeconfigSecretRef": {"namespace": NAMESPACE, "name": secret}},
            },
        )


@pytest.fixture
async def fleet(kubesim_factory: Any) -> AsyncIterator[Fleet]:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        yield Fleet(hub, api, kubesim_factory)


@pytest.fixture
async def pool(fleet: Fleet) -> AsyncIterator[members.MemberClients]:
    clients = members.MemberClients(
        fleet.api, timeouts=FAST, backoff=QUICK_BACKOFF, revalidate_after=0.1
    )
    yield clients
    await clients.close()


async def usable(pool: members.MemberClients, cluster: str) -> bool:
    """Whether a request through the pool reaches `cluster` now."""
    try:
        async with pool.connection(cluster) as api:
            await client.CoreV1Api(api).list_namespace()
    except Unavailable:
        return False
    return True


async def _config_maps(api: ApiClient) -> set[str]:
    listed = await client.CoreV1Api(api).list_namespaced_config_map("default")
    return {item.metadata.name for item in listed.items}


@pytest.mark.integration
async def test_the_pool_reaches_a_member_through_its_secret(
    fleet: Fleet, pool: members.MemberClients
) -> None:
    member = await fleet.member("m1")
    async with pool.connection("m1") as api:
        await client.CoreV1Api(api).create_namespaced_config_map(
            "default", {"metadata": {"name": "written-through-the-pool"}}
        )
    async with await kube.client_from_kubeconfig(kubeconfig=member.kubeconfig()) as direct:
        assert "written-through-the-pool" in await _config_maps(direct)
    first = await pool.client("m1")
    assert await pool.client("m1") is first, "an unchanged cluster keeps its client"


@pytest.mark.integration
async def test_a_rotated_token_is_picked_up(fleet: Fleet, pool: members.MemberClients) -> None:
    member = await fleet.member("m1")
    before = await pool.client("m1")
    await client.VersionApi(before).get_code()

    member.token = "rotated-token-value"
    with pytest.raises(Unavailable) as refused:
        async with pool.connection("m1") as api:
            await client.VersionApi(api).get_code()
    assert "refused the credentials" in str(refused.value)
    assert "rotated-token-value" not in str(refused.value)
    await fleet.write_secret("m1", member.kubeconfig())

    await eventually(lambda: usable(pool, "m1"), what="the pool to use the rotated token")
    assert await pool.client("m1") is not before


@pytest.mark.integration
async def test_a_changed_secret_rebuilds_the_client_without_a_failure(
    fleet: Fleet, pool: members.MemberClients
) -> None:
    member = await fleet.member("m1")
    before = await pool.client("m1")
    member.token = "second-token"
    await fleet.write_secret("m1", member.kubeconfig())

    async def rebuilt() -> ApiClient | None:
        current = await pool.client("m1")
        return current if current is not before else None

    after = await eventually(rebuilt, what="a new client after the Secret changed")
    await client.VersionApi(after).get_code()


@pytest.mark.integration
async def test_a_cluster_status_write_keeps_the_client(fleet: Fleet) -> None:
    """The syncer writes every Cluster's status each heartbeat: that must not cost a
    new client (and every watch open on the old one); a spec change does."""
    now = [0.0]
    pool = members.MemberClients(
        fleet.api, timeouts=FAST, revalidate_after=1.0, clock=lambda: now[0]
    )
    try:
        await fleet.member("m1")
        before = await pool.client("m1")
        custom = client.CustomObjectsApi(fleet.api)
        for beat in range(3):
            cluster = await custom.get_cluster_custom_object(
                "flotilla.io", "v1alpha1", "clusters", "m1"
            )
            cluster["status"] = {"lastHeartbeatTime": f"2026-01-01T00:00:0{beat}Z"}
            await custom.replace_cluster_custom_object_status(
                "flotilla.io", "v1alpha1", "clusters", "m1", cluster
            )
            now[0] += 2.0  # past revalidate_after: the pool reads the hub again
            assert await pool.client("m1") is before
        cluster = await custom.get_cluster_custom_object(
            "flotilla.io", "v1alpha1", "clusters", "m1"
        )
        cluster["spec"]["unschedulable"] = True
        await custom.replace_cluster_custom_object(
            "flotilla.io", "v1alpha1", "clusters", "m1", cluster
        )
        now[0] += 2.0
        assert await pool.client("m1") is not before
    finally:
        await pool.close()


@pytest.mark.integration
async def test_a_down_member_fails_fast_and_recovers(
    fleet: Fleet, pool: members.MemberClients
) -> None:
    member = await fleet.member("m1")
    await pool.client("m1")
    await member.set_outage(True)
    started = time.monotonic()
    with pytest.raises(Unavailable):
        async with pool.connection("m1") as api:
            await client.CoreV1Api(api).list_namespace()
    # Backing off: refused at once, without another request to the member.
    requests = member.stats()["requests"]
    with pytest.raises(Unavailable, match="backing off"):
        await pool.client("m1")
    assert member.stats()["requests"] == requests
    assert time.monotonic() - started < 2.0, "an outage is seen at once, not after timeouts"

    await member.set_outage(False)

    await eventually(lambda: usable(pool, "m1"), what="the member to be usable again")


@pytest.mark.integration
async def test_a_hung_member_does_not_slow_the_others(fleet: Fleet) -> None:
    hung = await fleet.member("hung")
    await fleet.member("healthy")
    hung.set_latency(2500)
    # A roomier timeout than FAST: the healthy member's client must be ready well
    # before the hung one's probe times out, even on a loaded machine.
    pool = members.MemberClients(fleet.api, timeouts=kube.Timeouts(connect=1.0, request=1.0))
    try:
        waiting = asyncio.create_task(pool.client("hung"))
        await eventually(lambda: hung.stats()["requests"] > 0, what="the hung member's probe")
        await client.VersionApi(await pool.client("healthy")).get_code()
        assert not waiting.done(), "the healthy member waited for the hung one"
        with pytest.raises(Unavailable, match="member cluster hung"):
            await waiting
    finally:
        hung.set_latency(0)
        await pool.close()


@pytest.mark.integration
async def test_each_cluster_has_its_own_bound_on_concurrent_work(fleet: Fleet) -> None:
    await fleet.member("busy")
    await fleet.member("other")
    pool = members.MemberClients(fleet.api, timeouts=FAST, per_cluster=2)
    release = asyncio.Event()
    inside: list[str] = []

    async def work(cluster: str) -> None:
        async with pool.connection(cluster):
            inside.append(cluster)
            await release.wait()

    busy = [asyncio.create_task(work("busy")) for _ in range(5)]
    try:
        await eventually(lambda: inside.count("busy") == 2, what="two busy slots taken")
        other = asyncio.create_task(work("other"))
        await eventually(lambda: "other" in inside, what="the other cluster not to queue")
        assert inside.count("busy") == 2, "a third block entered a full cluster"
        release.set()
        await asyncio.gather(*busy, other)
        assert inside.count("busy") == 5
    finally:
        release.set()
        await asyncio.gather(*busy, return_exceptions=True)
        await pool.close()


@pytest.mark.integration
async def test_missing_or_unusable_credentials_are_permanent_and_say_where(
    fleet: Fleet, pool: members.MemberClients, caplog: pytest.LogCaptureFixture
) -> None:
    await fleet.write_cluster("nosecret", secret="absent")
    await fleet.member("wrongkey", key="config")
    await fleet.write_secret("garbled", b"token: leaked-token\nusers: [unbalanced")
    await fleet.write_cluster("garbled", secret="garbled-kubeconfig")
    unusable = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "leaked-token"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "missing",
    }
    await fleet.write_secret("unusable", unusable)
    await fleet.write_cluster("unusable", secret="unusable-kubeconfig")
    caplog.set_level(logging.DEBUG)  # from here on, only the pool's own reads are logged

    with pytest.raises(InvalidObject, match="Cluster nowhere does not exist"):
        await pool.client("nowhere")
    with pytest.raises(InvalidObject) as missing:
        await pool.client("nosecret")
    assert missing.value.reason == "InvalidCluster"
    assert "Cluster nosecret" in str(missing.value)
    assert f"{NAMESPACE}/absent" in str(missing.value)
    with pytest.raises(InvalidObject, match="has no key 'kubeconfig'"):
        await pool.client("wrongkey")
    with pytest.raises(InvalidObject, match="is not valid YAML") as garbled:
        await pool.client("garbled")
    with pytest.raises(InvalidObject, match="Cluster unusable: kubeconfig Secret") as bad:
        await pool.client("unusable")

    for error in (garbled.value, bad.value):
        assert "leaked-token" not in str(error)
    assert "leaked-token" not in caplog.text
    secret = base64.b64encode(yaml.safe_dump(unusable).encode()).decode()
    assert secret not in caplog.text, "the Secret's content reached a log"


@pytest.mark.integration
async def test_close_closes_every_client(fleet: Fleet) -> None:
    await fleet.member("m1")
    pool = members.MemberClients(fleet.api, timeouts=FAST)
    api = await pool.client("m1")
    await pool.close()
    assert api.rest_client.pool_manager.closed
    with pytest.raises(RuntimeError, match="closed"):
        await pool.client("m1")
