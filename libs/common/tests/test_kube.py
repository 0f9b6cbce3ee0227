"""kube helpers against a kubesim hub, through kubernetes_asyncio."""

from __future__ import annotations

import base64
import re
import shutil
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.common import kube
from flotilla.common.config import Settings
from flotilla.common.errors import ConfigError, InvalidObject, Unavailable
from flotilla.common.testing import CRD_DIR, token_kubeconfig


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ApiException(status=503, reason="down"), Unavailable),
        (ApiException(status=429, reason="slow down"), Unavailable),
        (ApiException(status=409, reason="Conflict"), Unavailable),
        (ApiException(status=422, reason="Invalid"), InvalidObject),
        (ApiException(status=403, reason="Forbidden"), InvalidObject),
        (aiohttp.ClientConnectionError("refused"), Unavailable),
        (TimeoutError(), Unavailable),
    ],
    ids=["503", "429", "409", "422", "403", "connection", "timeout"],
)
def test_translate(error: BaseException, expected: type[Exception]) -> None:
    assert isinstance(kube.translate(error), expected)


def test_gvk_of() -> None:
    assert kube.gvk_of({"apiVersion": "apps/v1", "kind": "Deployment"}) == (
        "apps",
        "v1",
        "Deployment",
    )
    assert kube.gvk_of({"apiVersion": "v1", "kind": "Pod"}) == ("", "v1", "Pod")


@pytest.mark.integration
async def test_events_are_recorded_once_and_counted(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        core = client.CoreV1Api(api)
        cm = await core.create_namespaced_config_map(
            "default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}}
        )
        obj = api.sanitize_for_serialization(cm)
        obj.update(apiVersion="v1", kind="ConfigMap")
        recorder = kube.EventRecorder(api, "flotilla-test")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        await recorder.normal(obj, "Analyzed", "3 dependencies")
        listed = await core.list_namespaced_event("default")
        by_reason = {e.reason: e for e in listed.items}
        assert by_reason["DependencyMissing"].count == 2
        assert by_reason["DependencyMissing"].type == "Warning"
        assert by_reason["DependencyMissing"].involved_object.name == "cfg"
        assert by_reason["Analyzed"].count == 1
        dyn = await DynamicClient(api)
        with pytest.raises(InvalidObject, match="does not serve"):
            await kube.resource_for(dyn, "example.com/v1", "Nope")


@pytest.mark.parametrize(
    "object_name",
    ["web", "a" * 253, "a" * 236 + "." + "b" * 16, "Mixed_Case:name"],
    ids=["short", "longest", "dot-at-cut", "not-a-subdomain"],
)
def test_event_names_are_always_valid_dns_subdomains(object_name: str) -> None:
    name = kube.event_name(object_name, "0123456789abcdef")
    assert len(name) <= kube.MAX_NAME
    assert DNS_SUBDOMAIN.match(name), name
    assert name.endswith(".0123456789abcdef")


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.integration
async def test_a_long_name_gets_its_event_and_a_refused_event_does_not_raise(
    kubesim_factory: Any,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        core = client.CoreV1Api(api)
        long_name = "x" * 253
        cm = await core.create_namespaced_config_map(
            "default", {"metadata": {"name": long_name}, "data": {}}
        )
        obj = api.sanitize_for_serialization(cm)
        obj.update(apiVersion="v1", kind="ConfigMap")
        recorder = kube.EventRecorder(api, "flotilla-test")
        await recorder.warning(obj, "DependencyMissing", "Secret default/db does not exist")
        listed = await core.list_namespaced_event("default")
        assert [e.involved_object.name for e in listed.items] == [long_name]
        # The hub refuses (no such namespace): logged, not raised.
        elsewhere = {**obj, "metadata": {**obj["metadata"], "namespace": "nowhere"}}
        await recorder.warning(elsewhere, "DependencyMissing", "Secret nowhere/db does not exist")


@pytest.mark.integration
async def test_install_crds_is_idempotent(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        first = await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        again = await kube.install_crds(api, CRD_DIR.glob("*.yaml"))
        served = await client.ApiextensionsV1Api(api).list_custom_resource_definition()
    assert first == again
    assert "clusters.flotilla.io" in first
    assert {c.metadata.name for c in served.items} >= set(first)


@pytest.mark.parametrize(
    ("query", "expected_query", "read_timeout"),
    [
        (None, [], 30.0),
        ([("limit", 5)], [("limit", 5)], 30.0),
        ([("watch", True)], [("watch", True), ("timeoutSeconds", 300)], 330.0),
        ([("watch", "true")], [("watch", "true"), ("timeoutSeconds", 300)], 330.0),
        (
            [("watch", "true"), ("timeoutSeconds", 10)],
            [("watch", "true"), ("timeoutSeconds", 10)],
            40.0,
        ),
        ([("watch", False)], [("watch", False)], 30.0),
    ],
    ids=["no-query", "list", "watch", "watch-string", "watch-own-timeout", "not-a-watch"],
)
def test_timeouts_bound_every_request(
    query: list[tuple[str, Any]] | None, expected_query: list[tuple[str, Any]], read_timeout: float
) -> None:
    applied, timeout = kube.Timeouts(connect=5.0, request=30.0, watch=300).apply(query)
    assert applied == expected_query
    assert timeout.sock_read == read_timeout
    assert timeout.sock_connect == 5.0


def test_timeouts_come_from_settings() -> None:
    settings = Settings(kube_connect_timeout=1.5, kube_request_timeout=7, kube_watch_timeout=60)
    assert kube.Timeouts.of(settings) == kube.Timeouts(connect=1.5, request=7.0, watch=60)


@pytest.mark.integration
async def test_a_hung_server_fails_within_the_request_timeout(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    timeouts = kube.Timeouts(connect=1.0, request=0.3)
    async with await kube.client_from_kubeconfig(
        kubeconfig=hub.kubeconfig(), timeouts=timeouts
    ) as api:
        core = client.CoreV1Api(api)
        await core.list_namespace()
        hub.set_latency(2000)
        started = time.monotonic()
        with pytest.raises(aiohttp.ServerTimeoutError) as caught:
            await core.list_namespace()
        elapsed = time.monotonic() - started
        hub.set_latency(0)
    assert elapsed < 1.5, f"the request took {elapsed:.2f}s, the timeout is 0.3s"
    assert isinstance(kube.translate(caught.value), Unavailable)


@pytest.mark.integration
async def test_a_watch_may_stay_quiet_until_its_server_timeout_but_not_hang(
    kubesim_factory: Any,
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    timeouts = kube.Timeouts(connect=1.0, request=0.3, watch=1)
    async with await kube.client_from_kubeconfig(
        kubeconfig=hub.kubeconfig(), timeouts=timeouts
    ) as api:
        core = client.CoreV1Api(api)
        listed = await core.list_namespace()
        # Quiet for longer than the request timeout, then ended by the server
        # (the added timeoutSeconds): a healthy watch is not cut by the client.
        started = time.monotonic()
        response = await core.list_namespace(
            watch=True, resource_version=listed.metadata.resource_version, _preload_content=False
        )
        async with response:
            assert await response.content.read() == b""
        assert 0.9 < time.monotonic() - started < 3.0
        hub.set_latency(3000)
        started = time.monotonic()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await core.list_namespace(watch=True, _preload_content=False)
        elapsed = time.monotonic() - started
        hub.set_latency(0)
    # Unbounded, it would answer after the 3 s latency and end 1 s later.
    assert 1.0 < elapsed < 2.8, f"a hung watch took {elapsed:.2f}s to fail"


def _openssl(*args: str | Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "these tests make their certificates with the openssl command"
    subprocess.run([openssl, *map(str, args)], check=True, capture_output=True)


def _certificate(directory: Path, name: str, *extra: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", key, "-out", cert, *extra,
    )  # fmt: skip
    return cert, key


@pytest.mark.integration
async def test_inline_tls_material_is_used_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CA data, client certificate and key, and the token all reach the server, and
    nothing is written where kubernetes_asyncio's loader would put them."""
    ca_cert, ca_key = _certificate(tmp_path, "ca")
    ca = ("-CA", str(ca_cert), "-CAkey", str(ca_key))
    server_cert, server_key = _certificate(
        tmp_path, "server", *ca, "-addext", "subjectAltName=IP:127.0.0.1"
    )
    client_cert, client_key = _certificate(tmp_path, "client", *ca)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca_cert))
    server_tls.load_cert_chain(server_cert, server_key)
    server_tls.verify_mode = ssl.CERT_REQUIRED
    seen: list[tuple[str, str]] = []

    async def version(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item[0] for item in (peer or {}).get("subject", ()))
        seen.append((request.headers.get("Authorization", ""), subject.get("commonName", "")))
        fields = ("buildDate", "compiler", "gitCommit", "gitTreeState", "goVersion", "platform")
        return web.json_response(
            {"major": "1", "minor": "31", "gitVersion": "v1.31.0"} | dict.fromkeys(fields, "-")
        )

    app = web.Application()
    app.router.add_get("/version/", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    port = runner.addresses[0][1]
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))

    def inline(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tls",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": inline(ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": "tls",
                "user": {
                    "token": "s3cret-token",
                    "client-certificate-data": inline(client_cert),
                    "client-key-data": inline(client_key),
                },
            }
        ],
        "contexts": [{"name": "tls", "context": {"cluster": "tls", "user": "tls"}}],
        "current-context": "tls",
    }
    try:
        async with await kube.client_from_kubeconfig(kubeconfig=kubeconfig) as api:
            answered = await client.VersionApi(api).get_code()
    finally:
        await runner.cleanup()
    assert answered.git_version == "v1.31.0"
    assert seen == [("Bearer s3cret-token", "client")]
    assert list(spill.iterdir()) == []


@pytest.mark.integration
async def test_the_proxy_is_read_from_the_environment_once_when_the_client_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiohttp's ``trust_env`` would look the proxy (and ``~/.netrc``) up in a worker
    thread for every request; a client reads the environment once, when built."""
    seen: list[tuple[str, str, str]] = []
    runners: list[web.AppRunner] = []

    async def serve(name: str) -> int:
        async def version(request: web.Request) -> web.Response:
            seen.append((name, request.path, request.headers.get("Proxy-Authorization", "")))
            fields = ("buildDate", "compiler", "gitCommit", "gitTreeState", "goVersion")
            return web.json_response(
                {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": name}
                | dict.fromkeys(fields, "-")
            )

        app = web.Application()
        app.router.add_get("/version/", version)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return int(runner.addresses[0][1])

    server, proxy = await serve("server"), await serve("proxy")
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(variable.lower(), raising=False)
    kubeconfig = token_kubeconfig(f"http://127.0.0.1:{server}", "t")
    answered = []
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://someone:pw@127.0.0.1:{proxy}")
        async with await kube.client_from_kubeconfig(kubeconfig=kubeconfig) as proxied:
            monkeypatch.delenv("HTTP_PROXY")
            answered.append((await client.VersionApi(proxied).get_code()).platform)
        async with await kube.client_from_kubeconfig(kubeconfig=kubeconfig) as direct:
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy}")
            answered.append((await client.VersionApi(direct).get_code()).platform)
    finally:
        for runner in runners:
            await runner.cleanup()
    credentials = "Basic " + base64.b64encode(b"someone:pw").decode()
    assert answered == ["proxy", "server"]
    assert seen == [("proxy", "/version/", credentials), ("server", "/version/", "")]


async def test_an_unusable_kubeconfig_is_a_config_error_without_its_secrets() -> None:
    kubeconfig = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "missing",
    }
    with pytest.raises(ConfigError) as caught:
        await kube.client_from_kubeconfig(kubeconfig=kubeconfig)
    assert "s3cret-token" not in str(caught.value)
    bad_ca = {
        **kubeconfig,
        "current-context": "x",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://127.0.0.1:1", "certificate-authority-data": "%%"},
            }
        ],
    }
    with pytest.raises(ConfigError, match="ca data is not base64"):
        await kube.client_from_kubeconfig(kubeconfig=bad_ca)


@pytest.mark.integration
async def test_the_hub_client_follows_the_settings(kubesim_factory: Any, tmp_path: Path) -> None:
    hub = await kubesim_factory("hub", hub=True)
    hub.write_kubeconfig(tmp_path / "hub.yaml")
    settings = Settings(hub_kubeconfig=tmp_path / "hub.yaml", kube_request_timeout=0.3)
    async with await kube.hub_client(settings) as api:
        core = client.CoreV1Api(api)
        await core.list_namespace()
        hub.set_latency(1500)
        started = time.monotonic()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await core.list_namespace()
        hub.set_latency(0)
    assert time.monotonic() - started < 1.2


@pytest.mark.integration
async def test_the_proxy_environment_is_read_once_not_per_request(
    kubesim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp with ``trust_env`` looks up the proxy variables and ``.netrc`` in a
    worker thread for every request; the client resolves them once, when built."""
    import aiohttp.client as aiohttp_client

    hub = await kubesim_factory("hub", hub=True)
    lookups = 0

    def counted(original: Any) -> Any:
        def lookup(*args: Any) -> Any:
            nonlocal lookups
            lookups += 1
            return original(*args)

        return lookup

    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        monkeypatch.setattr(
            aiohttp_client, "get_env_proxy_for_url", counted(aiohttp_client.get_env_proxy_for_url)
        )
        monkeypatch.setattr(
            aiohttp_client, "netrc_from_env", counted(aiohttp_client.netrc_from_env)
        )
        core = client.CoreV1Api(api)
        for _ in range(3):
            await core.list_namespace()
    assert lookups == 0


@pytest.mark.integration
async def test_a_proxy_from_the_environment_is_still_honoured(
    kubesim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = await kubesim_factory("hub", hub=True)
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        with pytest.raises(aiohttp.ClientProxyConnectionError):
            await client.CoreV1Api(api).list_namespace()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # ... unless the server is exempt
    async with await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api:
        await client.CoreV1Api(api).list_namespace()


@pytest.mark.integration
async def test_plain_json_answers_and_their_failures(kubesim_factory: Any) -> None:
    hub = await kubesim_factory("hub", hub=True)
    async with (
        await kube.client_from_kubeconfig(kubeconfig=hub.kubeconfig()) as api,
        DynamicClient(api) as dyn,
    ):
        resource = await kube.resource_for(dyn, "v1", "ConfigMap")
        assert await kube.get_or_none(dyn, resource, "cfg", "default") is None
        await client.CoreV1Api(api).create_namespaced_config_map(
            "default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}}
        )
        found = await kube.get_or_none(dyn, resource, "cfg", "default")
        assert type(found) is dict and found["data"] == {"a": "1"}
        patched = await kube.merge_patch(dyn, resource, {"data": {"b": "2"}}, "cfg", "default")
        assert patched["data"] == {"a": "1", "b": "2"}
        stale = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]}}
        with pytest.raises(ApiException) as conflict:
            await kube.merge_patch(dyn, resource, stale, "cfg", "default")
        assert conflict.value.status == 409
        with pytest.raises(ApiException) as missing:
            await kube.merge_patch(dyn, resource, {"data": {}}, "nothing", "default")
        assert missing.value.status == 404


class _Answer:
    """An aiohttp response as `kube.as_json` reads it."""

    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.reason, self.data = status, "Bad Gateway", data
        self.released = False

    async def read(self) -> bytes:
        return self.data

    def release(self) -> None:
        self.released = True


async def test_an_answer_that_is_not_json_raises_its_http_status() -> None:
    answer = _Answer(502, b"<html>proxy error</html>")
    with pytest.raises(ApiException) as caught:
        await kube.as_json(answer)
    assert caught.value.status == 502 and answer.released
    with pytest.raises(ApiException) as caught:
        await kube.as_json(_Answer(503, b'{"error": "down"}'))
    assert caught.value.status == 503
    assert await kube.as_json(_Answer(200, b'{"kind": "ConfigMap"}')) == {"kind": "ConfigMap"}
