"""kubesim serves https with a CA of its own, which its kubeconfig carries."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

from flotilla.kubesim.server import KubeSim, listen_backlog
from flotilla.kubesim.testing import api_client, auth_session


async def test_kubeconfig_carries_the_ca_that_signs_the_serving_certificate(
    kubesim_factory: object,
) -> None:
    assert callable(kubesim_factory)
    hub: KubeSim = await kubesim_factory("hub", hub=True)
    assert hub.url.startswith("https://127.0.0.1:")
    cluster = hub.kubeconfig()["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    context = ssl.create_default_context(cadata=ca)
    connector = aiohttp.TCPConnector(ssl=context)
    headers = {"Authorization": f"Bearer {hub.token}"}
    async with (
        aiohttp.ClientSession(connector=connector, headers=headers) as http,
        http.get(f"{hub.url}/api/v1/namespaces") as response,
    ):
        assert response.status == 200
    # A client that trusts only the system CAs refuses the certificate.
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with aiohttp.ClientSession() as http, http.get(f"{hub.url}/version"):
            pass
    async with api_client(hub) as api:
        names = await client.CoreV1Api(api).list_namespace()
    assert "default" in {ns.metadata.name for ns in names.items}


async def test_plain_http_when_asked(kubesim_factory: object) -> None:
    assert callable(kubesim_factory)
    hub: KubeSim = await kubesim_factory("hub", hub=True, tls=False)
    assert hub.url.startswith("http://")
    assert "certificate-authority-data" not in hub.kubeconfig()["clusters"][0]["cluster"]
    async with auth_session(hub) as http, http.get(f"{hub.url}/api/v1/namespaces") as response:
        assert response.status == 200


async def test_a_tls_dir_keeps_the_ca_across_restarts(tmp_path: Path) -> None:
    async with KubeSim("one", hub=True, tls_dir=tmp_path) as first:
        ca_first = first.kubeconfig()["clusters"][0]["cluster"]["certificate-authority-data"]
    async with KubeSim("one", hub=True, tls_dir=tmp_path) as second:
        ca_second = second.kubeconfig()["clusters"][0]["cluster"]["certificate-authority-data"]
    assert ca_first == ca_second
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600


async def test_the_official_client_connects_with_the_kubeconfig_alone(hub: KubeSim) -> None:
    import kubernetes

    def list_namespaces() -> list[str]:
        api = kubernetes.config.new_client_from_config_dict(hub.kubeconfig())
        try:
            listed = kubernetes.client.CoreV1Api(api).list_namespace()
            return [ns.metadata.name for ns in listed.items]
        finally:
            api.close()

    assert "kube-system" in await asyncio.to_thread(list_namespaces)


async def test_a_burst_of_connections_to_a_busy_server_is_queued_not_dropped(
    hub: KubeSim,
) -> None:
    """Like a real API server (Go listens with the system's somaxconn), kubesim keeps
    a burst of new connections queued while it is busy, rather than letting the
    kernel drop them: with aiohttp's 128 each connect past the queue waited for a SYN
    retransmission, and a client's 5 s connect timeout failed against a hub that
    was only busy. The event loop is held here (nothing is accepted meanwhile)."""
    burst = 300
    assert listen_backlog() > burst  # this machine's somaxconn
    host, port = "127.0.0.1", int(hub.url.rsplit(":", 1)[1])
    sockets: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(burst):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(0.2)
            sockets.append(sock)
            try:
                sock.connect((host, port))  # blocks the loop: the server accepts nothing
            except OSError:
                refused += 1
    finally:
        for sock in sockets:
            sock.close()
    assert refused == 0
