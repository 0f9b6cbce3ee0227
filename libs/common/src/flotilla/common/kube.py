"""kubernetes_asyncio adapters the services share: clients, discovery, errors, Events.

Services talk to the hub and the members only through these helpers and
kubernetes_asyncio itself, never knowing whether the other side is a real API
server or kubesim. Third-party errors are translated here into the vocabulary of
`flotilla.common.errors`, so handlers decide retry vs. dead-letter in one place.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.helpers
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError
from yarl import URL

from flotilla.common.config import Settings
from flotilla.common.errors import ConfigError, FlotillaError, InvalidObject, Unavailable

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

# Event namespace for cluster-scoped objects (Cluster, ClusterPlacementPolicy…),
# as kubectl/client-go do.
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


@dataclass(frozen=True)
class Timeouts:
    """How long a Kubernetes API server may take before a request counts as failed.

    kubernetes_asyncio sends every request with an empty ``aiohttp.ClientTimeout()``
    unless the call passes ``_request_timeout``, so a hung server would block its
    caller forever. Every client built here fills in these instead:

    - `connect`: opening the connection, TLS handshake included;
    - `request`: the longest silence while waiting for or reading a response;
    - `watch`: the server-side ``timeoutSeconds`` added to a watch that sets none.
      A watch may legitimately stay silent until then, so its read timeout is
      that plus `request`: a healthy watch ends on the server's side first, a
      hung one is cut by the client.

    A call that passes its own ``_request_timeout`` keeps it.
    """

    connect: float = 5.0
    request: float = 30.0
    watch: int = 300

    @classmethod
    def of(cls, settings: Settings) -> Timeouts:
        return cls(
            connect=settings.kube_connect_timeout,
            request=settings.kube_request_timeout,
            watch=settings.kube_watch_timeout,
        )

    def apply(
        self, query_params: list[tuple[str, Any]] | None
    ) -> tuple[list[tuple[str, Any]], aiohttp.ClientTimeout]:
        """The query (with a watch's ``timeoutSeconds``) and the timeout for one request."""
        query = list(query_params or [])
        silence = self.request
        if any(name == "watch" and str(value).lower() == "true" for name, value in query):
            server_side = next((value for name, value in query if name == "timeoutSeconds"), None)
            if server_side is None:
                server_side = self.watch
                query.append(("timeoutSeconds", server_side))
            silence = float(server_side) + self.request
        # `connect` would also count the wait for a free pooled connection; that wait
        # is bounded anyway, since every connection in the pool has a read timeout.
        return query, aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=self.connect, sock_read=silence
        )


class _TimedApiClient(ApiClient):
    """An ApiClient whose requests all carry `Timeouts` unless the caller set one.

    `request` is the one funnel of kubernetes_asyncio's typed APIs, `call_api`,
    the DynamicClient and `Watch`, so overriding it covers every call site.
    """

    def __init__(self, configuration: Configuration, timeouts: Timeouts) -> None:
        super().__init__(configuration)
        self.timeouts = timeouts

    def request(
        self,
        method: str,
        url: str,
        query_params: list[tuple[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        if not _request_timeout:
            query_params, _request_timeout = self.timeouts.apply(query_params)
        return super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )


async def client_from_kubeconfig(
    path: str | Path | None = None,
    *,
    kubeconfig: JsonObject | None = None,
    context: str | None = None,
    timeouts: Timeouts | None = None,
) -> ApiClient:
    """An ApiClient for a kubeconfig file (default ``$KUBECONFIG``, then
    ``~/.kube/config``) or dict, with `timeouts` on every request; the caller closes it.

    Bearer tokens, basic auth, exec plugins, CA and client certificates are honoured
    as kubernetes_asyncio's loader reads them, except that inline
    ``*-data`` certificates and keys stay in memory (the loader would copy them to
    temporary files). A kubeconfig that cannot be used raises `ConfigError` with a
    message that never quotes a credential.
    """
    base_path: str | None = None
    if kubeconfig is None:
        kubeconfig, base_path = _read_kubeconfig(path)
    if not isinstance(kubeconfig, dict):
        raise ConfigError("a kubeconfig must be a mapping")
    configuration, material = await _configuration(kubeconfig, context, base_path)
    with _memory_files(material) as paths:
        configuration.ssl_ca_cert = paths.get("ca", configuration.ssl_ca_cert)
        configuration.cert_file = paths.get("cert", configuration.cert_file)
        configuration.key_file = paths.get("key", configuration.key_file)
        try:
            api = _TimedApiClient(configuration, timeouts or Timeouts())
            _environment_read_once(api)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"the kubeconfig's certificates cannot be loaded: {type(exc).__name__}"
            ) from None
        finally:
            # The files are gone once this block ends; the SSL context already holds them.
            for key, field in (("ca", "ssl_ca_cert"), ("cert", "cert_file"), ("key", "key_file")):
                if key in paths:
                    setattr(configuration, field, None)
    return api


READ_BUFSIZE = 2**21
"""aiohttp's read buffer as kubernetes_asyncio sizes it (a watch event may be large)."""


def _environment_read_once(api: ApiClient) -> None:
    """Resolve the API server's proxy from the environment once, not per request.

    kubernetes_asyncio opens its aiohttp session with ``trust_env=True``, and aiohttp
    then looks up ``*_PROXY``/``NO_PROXY`` and reads ``~/.netrc`` in a worker thread
    for *every* request: two thread hops per call, a fifth of a busy service's CPU.
    The proxy for the server's address is resolved here, as client-go does from the
    same variables, and the session stops looking (a kubeconfig, not ``.netrc``,
    carries the credentials)."""
    rest = api.rest_client
    session = rest.pool_manager
    if not session.trust_env:
        return
    if not rest.proxy:
        try:
            proxy, proxy_auth = aiohttp.helpers.get_env_proxy_for_url(
                URL(str(api.configuration.host))
            )
        except LookupError:
            pass  # no proxy for this server (none set, or NO_PROXY names it)
        else:
            if proxy_auth is not None:
                # In the URL, not as a header: aiohttp sends proxy_headers only when
                # it tunnels (CONNECT), but takes credentials from the URL either way.
                proxy = proxy.with_user(proxy_auth.login).with_password(proxy_auth.password)
            rest.proxy = str(proxy)
    connector = session.connector
    session.detach()  # hands the connection pool over without closing it
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )


async def hub_client(settings: Settings) -> ApiClient:
    """The hub's ApiClient as a service's settings describe it (`hub_kubeconfig`, and
    the `kube_*` timeouts); the caller closes it."""
    return await client_from_kubeconfig(settings.hub_kubeconfig, timeouts=Timeouts.of(settings))


async def hub_dynamic(settings: Settings) -> tuple[ApiClient, DynamicClient]:
    """`hub_client` and a DynamicClient over it (discovery on first use); the caller
    closes the ApiClient."""
    api = await hub_client(settings)
    return api, await DynamicClient(api)


def _read_kubeconfig(path: str | Path | None) -> tuple[Any, str]:
    """The parsed file and its directory (relative certificate paths start there).
    Read once at start-up, so reading synchronously costs nothing."""
    source = Path(path or os.environ.get("KUBECONFIG") or "~/.kube/config").expanduser()
    try:
        return yaml.safe_load(source.read_text()), str(source.parent)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {source}: {type(exc).__name__}") from None


_INLINE_MATERIAL = {
    "clusters": ("cluster", {"certificate-authority-data": "ca"}),
    "users": ("user", {"client-certificate-data": "cert", "client-key-data": "key"}),
}


async def _configuration(
    kubeconfig: JsonObject, context: str | None, base_path: str | None
) -> tuple[Configuration, dict[str, bytes]]:
    """A fresh Configuration from the kubeconfig, and the active context's inline TLS
    material (decoded) that the caller must hand to the client in memory."""
    document = copy.deepcopy(kubeconfig)
    inline: dict[tuple[str, str], dict[str, str]] = {}
    for section, (inner, fields) in _INLINE_MATERIAL.items():
        for entry in document.get(section) or []:
            body = entry.get(inner) if isinstance(entry, dict) else None
            if isinstance(body, dict):
                found = {fields[k]: body.pop(k) for k in list(body) if k in fields}
                inline[(section, str(entry.get("name")))] = found
    configuration = Configuration()
    try:
        loader = config.kube_config.KubeConfigLoader(
            document, active_context=context, config_base_path=base_path
        )
        await loader.load_and_set(configuration)
        active = (loader.current_context or {})["context"]
    except config.ConfigException as exc:
        raise ConfigError(f"unusable kubeconfig: {exc}") from exc
    except Exception as exc:
        # Other failures come from malformed input whose text may quote it.
        raise ConfigError(f"unusable kubeconfig ({type(exc).__name__})") from None
    if not str(configuration.host).startswith("https"):
        return configuration, {}
    material = {
        **inline.get(("clusters", str(active.get("cluster"))), {}),
        **inline.get(("users", str(active.get("user"))), {}),
    }
    decoded: dict[str, bytes] = {}
    for name, value in material.items():
        try:
            decoded[name] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"the kubeconfig's {name} data is not base64") from None
    return configuration, decoded


@contextmanager
def _memory_files(contents: dict[str, bytes]) -> Iterator[dict[str, str]]:
    """Paths that read back `contents` while the block runs, for APIs (``ssl``) that
    only load certificates and keys from files.

    On Linux they are anonymous memory files (``memfd``) that never reach a disk;
    elsewhere, files in a private temporary directory removed when the block ends.
    """
    with ExitStack() as stack:
        paths: dict[str, str] = {}
        directory: str | None = None
        for name, content in contents.items():
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create(f"kubeconfig-{name}", os.MFD_CLOEXEC)
                stack.callback(os.close, fd)
                os.write(fd, content)
                paths[name] = f"/proc/self/fd/{fd}"
            else:
                if directory is None:
                    directory = stack.enter_context(tempfile.TemporaryDirectory())
                target = Path(directory) / name
                target.touch(mode=0o600)
                target.write_bytes(content)
                paths[name] = str(target)
        yield paths


async def install_crds(api: ApiClient, paths: Iterable[Path]) -> list[str]:
    """Create (or replace) the CustomResourceDefinitions in `paths` (YAML, may hold
    several documents); returns their names. Used to set up a hub."""
    extensions = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(paths):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            name = document["metadata"]["name"]
            try:
                await extensions.create_custom_resource_definition(document)
            except ApiException as exc:
                if exc.status != 409:
                    raise translate(exc) from exc
                current = await extensions.read_custom_resource_definition(name)
                document["metadata"]["resourceVersion"] = current.metadata.resource_version
                await extensions.replace_custom_resource_definition(name, document)
            names.append(name)
    return names


def gvk_of(obj: JsonObject) -> tuple[str, str, str]:
    """(group, version, kind) of a raw object; group is "" for the core API."""
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    return group, version, str(obj.get("kind", ""))


async def resource_for(dyn: DynamicClient, api_version: str, kind: str) -> Any:
    """The discovered resource for a type, or `InvalidObject` when nothing serves it."""
    try:
        return await dyn.resources.get(api_version=api_version, kind=kind)
    except ResourceNotFoundError as exc:
        raise InvalidObject(
            f"the API server does not serve {kind} in {api_version}", reason="UnknownType"
        ) from exc


def checked(result: Any) -> JsonObject:
    """A DynamicClient result as a dict, or the `ApiException` it stands for.

    kubernetes_asyncio's DynamicClient requests without preloading, and its REST
    layer only raises for non-2xx answers when it preloads: a 404 or 409 comes back
    as a ``Status`` object instead of an exception. This restores the exception.
    """
    body: JsonObject = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    if body.get("kind") == "Status" and body.get("status") == "Failure":
        exc = ApiException(status=int(body.get("code") or 500), reason=str(body.get("reason")))
        exc.body = json.dumps(body).encode()
        raise exc
    return body


MERGE_PATCH = "application/merge-patch+json"


async def as_json(response: Any) -> JsonObject:
    """The body of a DynamicClient call made with ``serialize=False``, as `checked`
    returns it.

    Without that flag the DynamicClient wraps every answer in a ``ResourceInstance``
    (one object per field, built recursively) that `checked` turns back into a dict:
    most of the CPU of a small request. An answer that is not JSON raises the
    `ApiException` of its HTTP status."""
    try:
        data = await response.read()
    finally:
        response.release()
    try:
        body = json.loads(data)
    except ValueError:
        raise ApiException(status=response.status, reason=response.reason) from None
    if not isinstance(body, dict):
        raise ApiException(status=response.status, reason="the answer is not a JSON object")
    if response.status >= 400 and body.get("kind") != "Status":
        raise ApiException(status=response.status, reason=response.reason)
    return checked(body)


async def get_or_none(
    dyn: DynamicClient, resource: Any, name: str | None = None, namespace: str | None = None
) -> JsonObject | None:
    """The object (without `name`: the list), as plain JSON; None when it does not
    exist, else the failure translated."""
    try:
        return await as_json(
            await dyn.get(
                resource,
                name=name,
                namespace=namespace if resource.namespaced else None,
                serialize=False,
            )
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise translate(exc) from exc
    except Exception as exc:
        raise translate(exc) from exc


async def merge_patch(
    dyn: DynamicClient, resource: Any, patch: JsonObject, name: str, namespace: str | None = None
) -> JsonObject:
    """A JSON merge patch (RFC 7386); an API failure is raised as the `ApiException`
    it is, so the caller can tell a 404 or 409 from the rest."""
    return await as_json(
        await dyn.patch(
            resource,
            patch,
            name=name,
            namespace=namespace,
            content_type=MERGE_PATCH,
            serialize=False,
        )
    )


def translate(exc: BaseException) -> FlotillaError:
    """Map a kubernetes_asyncio / aiohttp failure onto Flotilla's error vocabulary."""
    if isinstance(exc, FlotillaError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status or 0
        if status == 429 or status >= 500 or status == 0:
            return Unavailable(f"API server answered {status}: {exc.reason}", delay=2.0)
        if status in (404, 409):
            # Not found / conflict are races with other writers: re-reading and
            # retrying converges (callers that expect a 404 check for it first).
            return Unavailable(f"API server answered {status}: {exc.reason}", delay=0.5)
        return InvalidObject(f"API server rejected the request ({status}): {_message(exc)}")
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return Unavailable(f"API server unreachable: {exc}", delay=2.0)
    return Unavailable(f"unexpected API failure: {type(exc).__name__}: {exc}")


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or b"").get("message", exc.reason))
    except (TypeError, ValueError):
        return str(exc.reason)


MAX_NAME = 253
"""Longest object name Kubernetes accepts (a DNS subdomain), Events included."""

_NOT_IN_NAME = re.compile(r"[^a-z0-9.-]+")


def event_name(object_name: str, digest: str) -> str:
    """``<object name>.<digest>``, always a valid Event name.

    Object names may be as long as Event names, so the object's part is cut to
    leave room for the digest (as Kubernetes' own name generators truncate a base
    and append a suffix); the digest then keeps two long names apart. Characters a
    DNS subdomain does not allow (some custom resources have them) become ``-``.
    """
    base = _NOT_IN_NAME.sub("-", object_name.lower())[: MAX_NAME - len(digest) - 1]
    return f"{base.strip('.-') or 'object'}.{digest}"


class EventRecorder:
    """Kubernetes Events on hub objects, deduplicated like client-go's recorder:
    the same (object, reason, message) bumps `count` instead of a new Event.

    Best effort, like client-go's: a hub that refuses or does not answer is logged
    and the call returns, never raises, so a failure to *report* never stops
    the work being reported on."""

    def __init__(self, api: ApiClient, component: str) -> None:
        self._core = client.CoreV1Api(api)
        self._component = component

    async def warning(self, obj: JsonObject, reason: str, message: str) -> None:
        await self._record(obj, "Warning", reason, message)

    async def normal(self, obj: JsonObject, reason: str, message: str) -> None:
        await self._record(obj, "Normal", reason, message)

    async def _record(self, obj: JsonObject, type_: str, reason: str, message: str) -> None:
        try:
            await self._write(obj, type_, reason, message)
        except FlotillaError as exc:
            metadata = obj.get("metadata") or {}
            log.warning(
                "could not record %s Event %s on %s %s/%s: %s",
                type_,
                reason,
                obj.get("kind"),
                metadata.get("namespace") or "",
                metadata.get("name"),
                exc,
            )

    async def _write(self, obj: JsonObject, type_: str, reason: str, message: str) -> None:
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace") or CLUSTER_SCOPED_EVENT_NAMESPACE
        object_name = str(metadata.get("name", "object"))
        identity = f"{metadata.get('uid')}/{obj.get('kind')}/{object_name}"
        digest = hashlib.sha256(f"{identity}/{type_}/{reason}/{message}".encode()).hexdigest()[:16]
        name = event_name(object_name, digest)
        now = datetime.now(UTC)
        try:
            try:
                existing = await self._core.read_namespaced_event(name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            else:
                await self._core.patch_namespaced_event(
                    name,
                    namespace,
                    {"count": (existing.count or 1) + 1, "lastTimestamp": now.isoformat()},
                )
                return
            event: Any = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion"),
                    "kind": obj.get("kind"),
                    "name": metadata.get("name"),
                    "namespace": metadata.get("namespace"),
                    "uid": metadata.get("uid"),
                    "resourceVersion": metadata.get("resourceVersion"),
                },
                "type": type_,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": self._component},
                "reportingComponent": self._component,
                "firstTimestamp": now.isoformat(),
                "lastTimestamp": now.isoformat(),
                "count": 1,
            }
            await self._core.create_namespaced_event(namespace, event)
        except Exception as exc:
            raise translate(exc) from exc
