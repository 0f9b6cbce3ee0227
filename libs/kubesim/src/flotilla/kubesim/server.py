"""The kubesim HTTP API server: Kubernetes REST semantics over the in-memory store.

`KubeSim` is one simulated cluster: a `Store`, an aiohttp app speaking the
Kubernetes API (discovery with categories, CRUD, list/watch, patch, apply, status
and scale subresources, CRDs, dry run, field validation, Tables for `kubectl get`,
OpenAPI v2/v3, access reviews, service-account tokens, pod logs), served over https
with a CA of its own and bearer-token auth, fault injection under `/sim/v1`, and —
unless it is a hub — the cluster simulator from `flotilla.kubesim.sim`. Several can
run in one event loop; `flotilla-kubesim` runs one per process. It follows
Kubernetes v1.34 (see `KUBERNETES_VERSION`).

Routing is a single catch-all handler that parses the path itself, because the
served kinds change at runtime (CRDs) and aiohttp's router is frozen once the app
starts.

Deliberately absent (a request for them gets a 4xx Status, never a silent success):
CBOR request bodies (415; protobuf bodies are decoded for the built-in kinds
kubectl sends them for: see `protobuf`), pods' `binding`, `exec`, `attach` and
`portforward`, `kubectl logs -f` streaming (the log is returned whole), protobuf
watch streams, aggregated discovery (kubectl falls back to the per-group
documents), HTTP/2, authorization (one token may do everything), service-account
tokens as credentials, admission webhooks and API priority and fairness.
`limit`/`continue` pages are one consistent snapshot (see `pagination`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from flotilla.kubesim import access, errors, events, eviction, openapi, pagination, protobuf, tables
from flotilla.kubesim import apply as ssa
from flotilla.kubesim import patch as patches
from flotilla.kubesim import schema as crd_schema
from flotilla.kubesim import tls as tls_certs
from flotilla.kubesim.errors import ApiError, bad_request, reason_for
from flotilla.kubesim.resources import NAMESPACE, ResourceType
from flotilla.kubesim.selectors import (
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector,
)
from flotilla.kubesim.store import Store, now_rfc3339
from flotilla.kubesim.watch import Watcher, WatchHub, encode_event, encode_record

if TYPE_CHECKING:
    from flotilla.kubesim.sim import SimOptions, Simulator

log = logging.getLogger(__name__)

BODY_LIMIT = 3 * 1024 * 1024
_DRAIN_LIMIT = 64 * 1024 * 1024
# The minor whose behaviour kubesim follows (defaults, field validation, Table columns,
# discovery) and the kubectl its test suite drives; a client more than one minor away
# gets kubectl's version-skew warning, as it would against a real server.
KUBERNETES_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_JSON_TYPES = ("application/json", "*/*")
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
_BODY_TYPES = (*_JSON_TYPES, *_YAML_TYPES, protobuf.MEDIA_TYPE)
# Upstream returns the deleted object for these; a Status for everything else.
_RETURNS_DELETED = frozenset({("", "Pod"), ("", "Namespace")})
_UNAUTHENTICATED = frozenset({"/healthz", "/livez", "/readyz"})
_FIELD_VALIDATION = ("Ignore", "Warn", "Strict")
# Deeper JSON is refused with 400 before anything recursive (schema walks, copies) sees it.
MAX_JSON_DEPTH = 500
_WARNINGS: web.RequestKey[list[str]] = web.RequestKey("kubesim.warnings", list)
_BODY_DRY_RUN: web.RequestKey[bool] = web.RequestKey("kubesim.dry_run", bool)
# How often an idle watch checks whether its client went away.
_WATCH_POLL_SECONDS = 2.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_BaseYamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlLoader(_BaseYamlLoader):  # type: ignore[misc]
    """Safe YAML as Kubernetes reads it: timestamps stay strings (they become JSON)."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseYamlLoader.yaml_implicit_resolvers.items()
}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(obj), status=status, content_type="application/json")


def _status_response(error: ApiError) -> web.Response:
    return _json(error.status(), error.code)


def _success(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata", {})
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": meta.get("name"),
            "group": rt.group,
            "kind": rt.plural,
            "uid": meta.get("uid"),
        },
    }


def _versioned(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    if rt.custom and obj.get("apiVersion") != rt.api_version:
        return {**obj, "apiVersion": rt.api_version}
    return obj


def _bool_param(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether JSON data nests deeper than `limit` (iterative: no recursion to run out of)."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _duplicate_keys(raw: bytes) -> list[str]:
    """Keys repeated within one JSON object of `raw` (which already decoded cleanly)."""
    found: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                found.append(key)
            seen.add(key)
        return dict(pairs)

    json.loads(raw, object_pairs_hook=hook)
    return found


def _go_type(value: Any) -> str:
    """The JSON type name Go's decoder uses in "cannot unmarshal <type>" messages."""
    kind = crd_schema.json_type(value)
    return {"boolean": "bool", "integer": "number"}.get(kind, kind)


def _warn(request: web.Request, message: str) -> None:
    request.setdefault(_WARNINGS, []).append(message)


def _dry_run(request: web.Request) -> bool:
    """`dryRun=All` in the query (writes) or in the DeleteOptions body (deletes)."""
    if request.get(_BODY_DRY_RUN):
        return True
    values = request.query.getall("dryRun", [])
    for value in values:
        if value != "All":
            raise bad_request(f'Invalid dryRun value: {value!r}: only "All" is supported')
    return bool(values)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def _get_path(obj: Any, path: str) -> Any:
    """The value at a `.spec.replicas`-style path, or None."""
    current = obj
    for part in (p for p in path.split(".") if p):
        if not isinstance(current, dict):
            return None
        current = current.get(part)
    return current


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    current = obj
    for part in parts[:-1]:
        current = current.setdefault(part, {})
    current[parts[-1]] = value


def default_field_manager(request: web.Request) -> str:
    """Upstream's default: the user agent's program name (`kubectl`, `OpenAPI-Generator`)."""
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0].strip() or "unknown"


async def _pod_log(
    kubesim: KubeSim, request: web.Request, rt: ResourceType, namespace: str, name: str
) -> web.StreamResponse:
    pod = kubesim.store.get_frozen(rt, namespace, name)
    tail = pagination.int_param(request.query, "tailLines")
    text = access.pod_log(pod, request.query.get("container"), tail)
    return web.Response(text=text, content_type="text/plain")


async def _service_account_token(
    kubesim: KubeSim, request: web.Request, rt: ResourceType, namespace: str, name: str
) -> web.StreamResponse:
    account = kubesim.store.get_frozen(rt, namespace, name)
    body = await kubesim._answer_body(request)
    answer = access.token_request(kubesim.name, namespace, account, body)
    return _json(answer, 201)


Action = Callable[["KubeSim", web.Request, ResourceType, str, str], Awaitable[web.StreamResponse]]
# Subresources that are verbs rather than stored state: (group, plural, subresource, method).
_ACTIONS: dict[tuple[str, str, str | None, str], Action] = {
    ("", "pods", "log", "GET"): _pod_log,
    ("", "serviceaccounts", "token", "POST"): _service_account_token,
}
_ACTION_DISCOVERY: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("", "pods"): [{"name": "pods/log", "kind": "Pod", "verbs": ["get"]}],
    ("", "serviceaccounts"): [
        {
            "name": "serviceaccounts/token",
            "kind": "TokenRequest",
            "group": "authentication.k8s.io",
            "version": "v1",
            "verbs": ["create"],
        }
    ],
}


def listen_backlog() -> int:
    """The listen queue a real API server gets: Go's ``net.Listen`` asks for the
    system's ``somaxconn`` (4096 on current Linux), where aiohttp asks for 128. With
    128, a burst of clients opening connections while the server is busy (a hundred
    objects' status writes at once) overflows the queue, and the kernel drops their
    SYNs: each such connect then takes a retransmission (1 s, 3 s …) and clients
    with a 5 s connect timeout fail against a server that is merely busy."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text().strip())
    except (OSError, ValueError):
        return socket.SOMAXCONN


class KubeSim:
    """One simulated Kubernetes cluster (or a bare API server when `hub=True`)."""

    def __init__(
        self,
        name: str,
        *,
        port: int = 0,
        token: str | None = None,
        hub: bool = False,
        sim: SimOptions | None = None,
        watch_window: int = 1000,
        host: str = "127.0.0.1",
        bookmark_interval: float = 60.0,
        event_ttl: float = events.DEFAULT_TTL_SECONDS,
        tls: bool = True,
        tls_dir: str | Path | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.host = host
        self.hub = hub
        self.token = token or secrets.token_urlsafe(24)
        self.store = Store(watch_window=watch_window)
        self.event_expiry = events.Expiry(self.store, event_ttl)
        self.url = ""
        self.bookmark_interval = bookmark_interval
        self.simulator: Simulator | None = None
        self._sim_options = sim
        self._down = False
        self._latency_ms = 0
        self._watches = WatchHub()
        self._runner: web.AppRunner | None = None
        self._requests = 0
        self._documents = openapi.Documents(
            lambda: list(self.store.registry), self.store.crd_schema
        )
        self._tls = tls
        self._tls_dir = tls_dir
        # The CA, from the first start on (made, or loaded from `tls_dir`, then).
        self.authority: tls_certs.Authority | None = None

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> str:
        if self._runner is not None:
            return self.url
        if not self.hub and self.simulator is None:
            # Imported here so a hub never loads the simulator.
            from flotilla.kubesim.sim import SimOptions, Simulator

            self.simulator = Simulator(self.store, self._sim_options or SimOptions(), self.name)
        app = self._build_app()
        # No lingering: a body refused unread (413) closes the connection right away
        # instead of being drained for seconds by a task that outlives `stop()`.
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=5.0, lingering_time=0.0
        )
        await runner.setup()
        try:
            context = None
            if self._tls:
                self.authority, serving = await tls_certs.provision(
                    self.name,
                    [self.host, "127.0.0.1", "localhost"],
                    self.authority,
                    self._tls_dir,
                )
                context = tls_certs.server_context(serving)
            site = web.TCPSite(
                runner, self.host, self.port, ssl_context=context, backlog=listen_backlog()
            )
            await site.start()
            self.port = int(runner.addresses[0][1])
            scheme = "https" if context is not None else "http"
            self.url = f"{scheme}://{self.host}:{self.port}"
            self._runner = runner
            self.event_expiry.start()
            if self.simulator is not None:
                await self.simulator.start()
        except BaseException:
            self._runner = None
            await runner.cleanup()
            raise
        log.info("kubesim %s serving on %s (hub=%s)", self.name, self.url, self.hub)
        return self.url

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._watches.close_all("server stopping")
        await self.event_expiry.stop()
        if self.simulator is not None:
            await self.simulator.stop()
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> KubeSim:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- kubeconfig and fault injection --------------------------------------------

    def kubeconfig(self) -> dict[str, Any]:
        if not self.url:
            raise RuntimeError("kubesim is not started; the kubeconfig needs its URL")
        cluster: dict[str, Any] = {"server": self.url}
        if self.authority is not None:
            cluster["certificate-authority-data"] = self.authority.cert_data
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": cluster}],
            "users": [{"name": self.name, "user": {"token": self.token}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": self.name}}],
            "current-context": self.name,
            "preferences": {},
        }

    def client_ssl(self) -> ssl.SSLContext | bool:
        """The `ssl=` argument for a raw aiohttp client of this server (False over http)."""
        return self.authority.client_context() if self.authority is not None else False

    def write_kubeconfig(self, path: str | Path) -> None:
        """Write atomically, so a reader polling for the file never sees half of it."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as handle:
                yaml.safe_dump(self.kubeconfig(), handle, sort_keys=False)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def set_outage(self, down: bool) -> None:
        self._down = down
        if down:
            self._watches.close_all("outage")

    def set_latency(self, ms: int) -> None:
        self._latency_ms = max(0, int(ms))

    @property
    def down(self) -> bool:
        return self._down

    def stats(self) -> dict[str, Any]:
        pods_by_phase: dict[str, int] = {}
        pods = self.store.resource_type("v1", "Pod")
        for pod in self.store.iter_frozen(pods):
            phase = (pod.get("status") or {}).get("phase") or "Unknown"
            pods_by_phase[phase] = pods_by_phase.get(phase, 0) + 1
        out: dict[str, Any] = {
            "name": self.name,
            "hub": self.hub,
            "down": self._down,
            "latencyMs": self._latency_ms,
            "resourceVersion": self.store.resource_version,
            "objects": self.store.counts(),
            "podsByPhase": pods_by_phase,
            "watches": len(self._watches),
            "requests": self._requests,
        }
        if self.simulator is not None:
            out.update(self.simulator.stats())
        return out

    # -- app -------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        # Bodies are read and capped by `_read_body`, which answers with a Status.
        app = web.Application(middlewares=[self._middleware], client_max_size=BODY_LIMIT * 4)
        app.router.add_get("/sim/v1/stats", self._handle_stats)
        app.router.add_post("/sim/v1/outage", self._handle_outage)
        app.router.add_post("/sim/v1/latency", self._handle_latency)
        if self.simulator is not None:
            app.add_routes(self.simulator.routes())
        app.router.add_route("*", "/{tail:.*}", self._handle_api)
        return app

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            credential.strip().encode(), self.token.encode()
        )

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path in _UNAUTHENTICATED:
                return web.Response(text="ok")
            if not self._authorized(request):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if not request.path.startswith("/sim/"):
                self._requests += 1
                if self._latency_ms:
                    await asyncio.sleep(self._latency_ms / 1000)
                if self._down:
                    raise ApiError(
                        503,
                        "ServiceUnavailable",
                        f"kubesim {self.name} is in a simulated outage",
                    )
            response = protobuf.negotiated(request.headers.get("Accept"), await handler(request))
            if not response.prepared:
                for message in request.get(_WARNINGS, ()):
                    response.headers.add("Warning", f"299 - {json.dumps(message)}")
            return response
        except ApiError as error:
            return _status_response(error)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _status_response(ApiError(exc.status, reason_for(exc.status), exc.reason))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("kubesim %s: %s %s failed", self.name, request.method, request.path)
            return _status_response(ApiError(500, "InternalError", f"internal error: {exc}"))

    # -- /sim/v1 --------------------------------------------------------------------

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return _json(self.stats())

    async def _handle_outage(self, request: web.Request) -> web.Response:
        body = self._decode(await self._read_body(request), "application/json")
        if not isinstance(body, dict) or not isinstance(body.get("down"), bool):
            raise bad_request('expected {"down": true|false}')
        await self.set_outage(body["down"])
        return _json({"down": self._down})

    async def _handle_latency(self, request: web.Request) -> web.Response:
        body = self._decode(await self._read_body(request), "application/json")
        ms = body.get("ms") if isinstance(body, dict) else None
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
            raise bad_request('expected {"ms": <non-negative integer>}')
        self.set_latency(ms)
        return _json({"ms": self._latency_ms})

    # -- bodies ------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, or 413 once it passes BODY_LIMIT.

        An oversized body is still drained (up to _DRAIN_LIMIT) before answering, so the
        client, which is usually still sending, reads a 413 Status instead of a reset.
        """
        too_large = ApiError(
            413, "RequestEntityTooLarge", f"the request body exceeds {BODY_LIMIT} bytes"
        )
        length = request.content_length
        if length is not None and length > _DRAIN_LIMIT:
            raise too_large
        data = bytearray()
        received = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            received += len(chunk)
            if received > _DRAIN_LIMIT:
                raise too_large
            if received <= BODY_LIMIT:
                data += chunk
        if received > BODY_LIMIT:
            raise too_large
        return bytes(data)

    @staticmethod
    def _content_type(request: web.Request) -> str:
        if "Content-Type" not in request.headers:
            return "application/json"
        return request.content_type.lower()

    @staticmethod
    def _decode(raw: bytes, content_type: str) -> Any:
        if not raw.strip():
            raise bad_request("the request body is empty")
        try:
            if content_type in _YAML_TYPES or content_type == patches.APPLY_PATCH:
                decoded = yaml.load(raw, Loader=_YamlLoader)  # noqa: S506 - a safe loader
            elif content_type == protobuf.MEDIA_TYPE:
                decoded = protobuf.decode(raw)
            else:
                decoded = json.loads(raw)
        except RecursionError:
            raise bad_request(
                f"the request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
            ) from None
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"the request body could not be decoded: {exc}") from exc
        if _depth_exceeds(decoded, MAX_JSON_DEPTH):
            raise bad_request(
                f"the request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
            )
        return decoded

    async def _answer_body(self, request: web.Request) -> Any:
        """The body of a request that is answered rather than stored (reviews, tokens):
        decoded JSON/YAML/protobuf, or None for an empty body or a message kubesim has
        no protobuf table for (kubectl's access reviews), whose answer then uses defaults."""
        raw = await self._read_body(request)
        content_type = self._content_type(request)
        if not raw.strip() or content_type not in _BODY_TYPES:
            return None
        if content_type == protobuf.MEDIA_TYPE and not protobuf.readable(raw):
            return None
        return self._decode(raw, content_type)

    async def _read_object(self, request: web.Request, rt: ResourceType) -> dict[str, Any]:
        content_type = self._content_type(request)
        if content_type not in _BODY_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json, application/yaml, {protobuf.MEDIA_TYPE} "
                f"(got {content_type!r})",
            )
        raw = await self._read_body(request)
        obj = self._check_object(self._decode(raw, content_type), rt)
        self._check_fields(request, rt, obj, raw if content_type in _JSON_TYPES else None)
        return obj

    @staticmethod
    def _check_object(obj: Any, rt: ResourceType) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, "", rt.kind) or api_version not in (None, "", rt.api_version):
            raise bad_request(
                f"the API version in the data ({api_version}) and kind ({kind}) do not match "
                f"the endpoint ({rt.api_version} {rt.kind})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        return obj

    @staticmethod
    def _place(
        obj: dict[str, Any], rt: ResourceType, namespace: str | None, name: str | None
    ) -> None:
        """Reconcile the body's name/namespace with the URL's, like upstream."""
        meta = obj["metadata"]
        if rt.namespaced and namespace is not None:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        if name is not None:
            if meta.get("name") and meta["name"] != name:
                raise bad_request("the name of the object does not match the name on the URL")
            meta["name"] = name

    # -- routing -------------------------------------------------------------------------

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        segments = [s for s in request.path.split("/") if s]
        if segments == ["version"]:
            return _json(KUBERNETES_VERSION)
        if segments and segments[0] == "openapi":
            return self._openapi(request, segments[1:])
        if not segments or segments[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if segments[0] == "api":
            if len(segments) == 1:
                return _json(self._core_versions(request))
            group, version, rest = "", segments[1], segments[2:]
        else:
            if len(segments) == 1:
                return _json(self._group_list())
            if len(segments) == 2:
                return _json(self._group(segments[1]))
            group, version, rest = segments[1], segments[2], segments[3:]
        if not rest:
            if request.method != "GET":
                raise ApiError(405, "MethodNotAllowed", "discovery is read-only")
            return _json(self._resource_list(group, version))
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = self.store.registry.by_plural(group, version, rest[0])
        if namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        method = request.method
        if rt.create_only:
            if method != "POST" or name is not None:
                raise ApiError(405, "MethodNotAllowed", f"{rt.group_resource} only accept create")
            body = await self._answer_body(request)
            return _json(access.review(rt.kind, rt.api_version, body), 201)
        action = _ACTIONS.get((rt.group, rt.plural, subresource, method))
        if action is not None and name is not None and namespace is not None:
            return await action(self, request, rt, namespace, name)
        if subresource is not None and subresource not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        query = request.query
        if name is None:
            if method == "GET":
                if watch_path or _bool_param(query.get("watch")):
                    return await self._watch(request, rt, namespace)
                return self._list(request, rt, namespace)
            if method == "POST" and (namespace is not None or not rt.namespaced):
                return await self._create(request, rt, namespace)
            if method == "DELETE":
                return await self._delete_collection(request, rt, namespace)
        elif rt.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        elif watch_path and method == "GET" and subresource is None:
            request = request.clone(
                rel_url=request.rel_url.update_query({"fieldSelector": f"metadata.name={name}"})
            )
            return await self._watch(request, rt, namespace)
        elif subresource == "scale" and method in ("GET", "PUT", "PATCH"):
            return await self._scale(request, rt, namespace, name)
        elif subresource == "eviction" and namespace is not None:
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on evictions")
            body = self._decode(await self._read_body(request), self._content_type(request))
            pdb_rt = self.store.resource_type("policy/v1", "PodDisruptionBudget")
            return _json(eviction.evict(self.store, rt, pdb_rt, namespace, name, body), 201)
        elif method == "GET":
            obj = _versioned(rt, self.store.get_frozen(rt, namespace, name))
            if self._wants_table(request):
                return _json(self._table(request, rt, [obj], {"resourceVersion": ""}))
            return _json(obj)
        elif method == "PUT":
            return await self._update(request, rt, namespace, name, subresource)
        elif method == "PATCH":
            return await self._patch(request, rt, namespace, name, subresource)
        elif method == "DELETE" and subresource is None:
            return await self._delete(request, rt, namespace, name)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.path}")

    # -- discovery -------------------------------------------------------------------------

    def _core_versions(self, request: web.Request) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
            ],
        }

    def _group_doc(self, group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _group_list(self) -> dict[str, Any]:
        groups = [
            self._group_doc(group, versions)
            for group, versions in self.store.registry.group_versions().items()
            if group
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _group(self, group: str) -> dict[str, Any]:
        versions = self.store.registry.group_versions().get(group)
        if not group or not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        if not self.store.registry.has_group_version(group, version):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        entries: list[dict[str, Any]] = []
        for rt in self.store.registry:
            if rt.group != group or rt.version != version:
                continue
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["create"] if rt.create_only else _VERBS,
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            entries.append(entry)
            for extra in _ACTION_DISCOVERY.get((rt.group, rt.plural), []):
                entries.append({"singularName": "", "namespaced": rt.namespaced, **extra})
            if rt.has_status:
                entries.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if "eviction" in rt.subresources:
                entries.append(eviction.DISCOVERY)
            if "scale" in rt.subresources:
                entries.append(
                    {
                        "name": f"{rt.plural}/scale",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    # -- list and watch ------------------------------------------------------------------

    def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        items, metadata = pagination.page(self.store, rt, namespace, request.query)
        if self._wants_table(request):
            return _json(self._table(request, rt, [_versioned(rt, o) for o in items], metadata))
        body = {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": metadata,
            "items": [_versioned(rt, obj) for obj in items],
        }
        return _json(body)

    # -- server-side printing ----------------------------------------------------------------

    @staticmethod
    def _wants_table(request: web.Request) -> bool:
        accept = request.headers.get("Accept", "")
        return "as=Table" in accept and tables.media_wants_table(accept)

    def _printer(self, rt: ResourceType) -> tables.Printer:
        columns = self.store.printer_columns(rt) if rt.custom else None
        return tables.printer_for(rt, columns)

    def _table(
        self,
        request: web.Request,
        rt: ResourceType,
        items: list[dict[str, Any]],
        metadata: Mapping[str, Any],
        *,
        with_columns: bool = True,
    ) -> dict[str, Any]:
        include = request.query.get("includeObject") or "Metadata"
        if include not in ("None", "Metadata", "Object"):
            raise bad_request(f"includeObject must be None, Metadata or Object, got {include!r}")
        return tables.table(
            self._printer(rt),
            items,
            include=include,
            metadata=metadata,
            with_columns=with_columns,
        )

    def _table_encoder(
        self, request: web.Request, rt: ResourceType
    ) -> Callable[[str, Mapping[str, Any]], bytes]:
        """Watch events as one-row Tables; column definitions only in the first, as upstream."""
        first = [True]

        def encode(kind: str, obj: Mapping[str, Any]) -> bytes:
            body = self._table(
                request,
                rt,
                [_versioned(rt, dict(obj))],
                {"resourceVersion": str((obj.get("metadata") or {}).get("resourceVersion", ""))},
                with_columns=first[0],
            )
            first[0] = False
            return encode_event(kind, body)

        return encode

    # -- OpenAPI -----------------------------------------------------------------------------

    def _openapi(self, request: web.Request, rest: list[str]) -> web.Response:
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "OpenAPI documents are read-only")
        if rest == ["v2"]:
            return _json(self._documents.v2())
        if rest == ["v3"]:
            return _json(self._documents.v3_root())
        doc = None
        if len(rest) == 3 and rest[:2] == ["v3", "api"]:
            doc = self._documents.v3_group_version("", rest[2])
        elif len(rest) == 4 and rest[:2] == ["v3", "apis"]:
            doc = self._documents.v3_group_version(rest[2], rest[3])
        if doc is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json(doc)

    # -- field validation ---------------------------------------------------------------------

    def _check_fields(
        self, request: web.Request, rt: ResourceType, obj: dict[str, Any], raw: bytes | None
    ) -> None:
        """`fieldValidation` as upstream: unknown (and duplicate) fields are an error
        (Strict), a `Warning` header (Warn, the default) or nothing (Ignore). Unknown
        fields of built-in kinds are dropped, as decoding into typed structs drops them;
        a value of the wrong JSON type for a built-in field is 400, as it fails to decode.
        Duplicate fields are looked for only when the client names a directive (kubectl
        always does): finding them costs a second parse of the body.
        """
        directive = request.query.get("fieldValidation") or "Warn"
        if directive not in _FIELD_VALIDATION:
            raise bad_request(
                f"fieldValidation must be one of {', '.join(_FIELD_VALIDATION)}, got {directive!r}"
            )
        problems: list[str] = []
        if raw is not None and directive != "Ignore" and "fieldValidation" in request.query:
            problems += [f'duplicate field "{key}"' for key in _duplicate_keys(raw)]
        if rt.custom:
            schema = self.store.crd_schema(rt)
            if schema is not None:
                unknown, _ = openapi.unknown_fields(obj, schema, {}, prune=False)
                problems += [f'unknown field "{path}"' for path in unknown]
        else:
            found = self._documents.schema_for(rt)
            if found is not None:
                unknown, mismatched = openapi.unknown_fields(obj, found[0], found[1], prune=True)
                if mismatched:
                    path, expected, value = mismatched[0]
                    raise bad_request(
                        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                        f"json: cannot unmarshal {_go_type(value)} into Go struct field "
                        f"{rt.kind}.{path} of type {expected}"
                    )
                problems += [f'unknown field "{path}"' for path in unknown]
        if not problems or directive == "Ignore":
            return
        if directive == "Strict":
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {', '.join(problems)}"
            )
        for problem in problems:
            _warn(request, problem)

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        label_selector, field_selector = query.get("labelSelector"), query.get("fieldSelector")
        encode = self._table_encoder(request, rt) if self._wants_table(request) else None
        watcher = Watcher(
            rt,
            namespace,
            parse_label_selector(label_selector),
            parse_field_selector(events.field_selector(rt.api_version, rt.kind, field_selector)),
            encode,
        )
        timeout = pagination.int_param(query, "timeoutSeconds")
        bookmarks = _bool_param(query.get("allowWatchBookmarks"))
        since = query.get("resourceVersion")
        api_version = rt.api_version if rt.custom else None
        initial: list[bytes] = []
        expired: ApiError | None = None
        if since in (None, "", "0"):
            items, _ = self.store.list_frozen(rt, namespace, label_selector, field_selector)
            if encode is not None:
                initial = [encode("ADDED", obj) for obj in items]
            else:
                initial = [encode_event("ADDED", obj, api_version) for obj in items]
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise bad_request(f"invalid resourceVersion {since!r}") from None
            try:
                for record in self.store.history_since(rt, since_rv):
                    kind = watcher.event_type(record)
                    if kind is not None and encode is not None:
                        initial.append(encode(kind, record.object))
                    elif kind is not None:
                        initial.append(encode_record(record, kind, rt))
            except ApiError as error:
                expired = error
        # Registered in the same synchronous step as the snapshot above: no gap, no dupes.
        unsubscribe = self.store.add_record_listener(rt, watcher.offer)
        self._watches.add(watcher)
        response = web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if expired is not None:
                await response.write(encode_event("ERROR", expired.status()))
                return response
            if initial:
                await response.write(b"".join(initial))
            await self._pump(request, response, watcher, rt, timeout, bookmarks)
            return response
        except ConnectionError:
            # The client went away; there is nobody left to answer.
            return response
        finally:
            unsubscribe()
            self._watches.discard(watcher)

    async def _pump(
        self,
        request: web.Request,
        response: web.StreamResponse,
        watcher: Watcher,
        rt: ResourceType,
        timeout_seconds: int | None,
        bookmarks: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds if timeout_seconds else None
        next_bookmark = loop.time() + self.bookmark_interval if bookmarks else None
        while not watcher.closed:
            wake = loop.time() + _WATCH_POLL_SECONDS
            for moment in (deadline, next_bookmark):
                if moment is not None:
                    wake = min(wake, moment)
            await watcher.wait(max(0.0, wake - loop.time()))
            lines = watcher.take()
            if watcher.closed:
                break
            if lines:
                await response.write(b"".join(lines))
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_bookmark is not None and now >= next_bookmark:
                bookmark = {
                    "kind": rt.kind,
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(self.store.resource_version)},
                }
                await response.write(encode_event("BOOKMARK", bookmark))
                next_bookmark = now + self.bookmark_interval
            transport = request.transport
            if transport is None or transport.is_closing():
                break

    # -- writes ----------------------------------------------------------------------------

    def _manager(self, request: web.Request) -> str:
        return request.query.get("fieldManager") or default_field_manager(request)

    async def _create(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.Response:
        obj = await self._read_object(request, rt)
        self._place(obj, rt, namespace, None)
        if obj["metadata"].get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if rt.has_status and (rt.group, rt.kind) != ("", "Node"):
            obj.pop("status", None)
        obj["metadata"].pop("managedFields", None)
        ssa.record_update(None, obj, rt=rt, manager=self._manager(request), now=now_rfc3339())
        created = self.store.create(rt, obj, dry_run=_dry_run(request))
        return _json(created, 201)

    async def _update(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        subresource: str | None,
    ) -> web.Response:
        obj = await self._read_object(request, rt)
        self._place(obj, rt, namespace, name)
        current = self.store.get_frozen(rt, namespace, name)
        self._track(request, rt, current, obj, subresource)
        updated = self.store.update(rt, obj, subresource=subresource, dry_run=_dry_run(request))
        return _json(updated)

    def _track(
        self,
        request: web.Request,
        rt: ResourceType,
        current: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
    ) -> None:
        """Record in new.metadata.managedFields what this write changes."""
        if subresource == "status":
            effective = {**current, "status": new.get("status")}
        elif rt.has_status:
            effective = {**new, "status": current.get("status")}
        else:
            effective = new
        effective["metadata"] = dict(new.get("metadata") or {})
        ssa.record_update(
            current,
            effective,
            rt=rt,
            manager=self._manager(request),
            now=now_rfc3339(),
            subresource=subresource or "",
        )
        new["metadata"] = {**(new.get("metadata") or {})}
        new["metadata"]["managedFields"] = effective["metadata"]["managedFields"]

    async def _patch(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        subresource: str | None,
    ) -> web.Response:
        content_type = self._content_type(request)
        if content_type not in patches.PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(patches.PATCH_TYPES)} (got {content_type!r})",
            )
        if content_type == patches.STRATEGIC_PATCH and rt.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources; use "
                "application/merge-patch+json or application/json-patch+json",
            )
        raw = await self._read_body(request)
        body = self._decode(raw, content_type)
        if content_type == patches.APPLY_PATCH:
            return self._apply(request, rt, namespace, name, subresource, body)
        if content_type != patches.JSON_PATCH and "fieldValidation" in request.query:
            duplicates = _duplicate_keys(raw)
            if duplicates:
                problems = ", ".join(f'duplicate field "{key}"' for key in duplicates)
                if request.query["fieldValidation"] == "Strict":
                    raise bad_request(f"strict decoding error: {problems}")
                if request.query["fieldValidation"] == "Warn":
                    _warn(request, problems)
        current = self.store.get_frozen(rt, namespace, name)
        if content_type == patches.MERGE_PATCH:
            if not isinstance(body, dict):
                raise bad_request("a merge patch must be a JSON object")
            new = patches.merge_patch(current, body)
        elif content_type == patches.JSON_PATCH:
            new = patches.json_patch(current, body)
        else:
            if not isinstance(body, dict):
                raise bad_request("a strategic merge patch must be a JSON object")
            new = patches.strategic_merge_patch(current, body)
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            raise ApiError(422, "Invalid", "the patch removed the object's metadata")
        meta = new["metadata"]
        for key, value in (("name", name), ("namespace", current["metadata"].get("namespace"))):
            if meta.get(key) != value:
                raise ApiError(422, "Invalid", f"metadata.{key}: Invalid value: field is immutable")
        self._check_fields(request, rt, new, None)
        self._track(request, rt, current, new, subresource)
        updated = self.store.update(rt, new, subresource=subresource, dry_run=_dry_run(request))
        return _json(updated)

    def _apply(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        subresource: str | None,
        body: Any,
    ) -> web.Response:
        applied = self._check_object(body, rt)
        self._check_fields(request, rt, applied, None)
        if not applied.get("apiVersion") or not applied.get("kind"):
            raise bad_request("apply requires apiVersion and kind in the applied configuration")
        self._place(applied, rt, namespace, name)
        manager = request.query.get("fieldManager")
        if not manager:
            raise ApiError(
                422, "Invalid", "fieldManager: Required value: is required for apply patch"
            )
        force = _bool_param(request.query.get("force"))
        try:
            live: dict[str, Any] | None = self.store.get_frozen(rt, namespace, name)
        except ApiError as error:
            if error.code != 404 or subresource is not None:
                raise
            live = None
        result = ssa.apply(
            live,
            applied,
            rt=rt,
            manager=manager,
            force=force,
            now=now_rfc3339(),
            subresource=subresource or "",
        )
        dry_run = _dry_run(request)
        if live is None:
            return _json(self.store.create(rt, result, dry_run=dry_run), 201)
        return _json(self.store.update(rt, result, subresource=subresource, dry_run=dry_run))

    # -- scale -----------------------------------------------------------------------------

    def _scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of a scalable object."""
        paths = self.store.scale_paths(rt)
        meta = obj["metadata"]
        selector = ""
        if rt.custom:
            found = _get_path(obj, paths.get("labelSelectorPath", ""))
            selector = found if isinstance(found, str) else ""
        else:
            selector = selector_from_label_selector((obj.get("spec") or {}).get("selector"))
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": _get_path(obj, paths.get("specReplicasPath", "")) or 0},
            "status": {
                "replicas": _get_path(obj, paths.get("statusReplicasPath", "")) or 0,
                "selector": selector,
            },
        }

    async def _scale(
        self, request: web.Request, rt: ResourceType, namespace: str | None, name: str
    ) -> web.Response:
        current = self.store.get_frozen(rt, namespace, name)
        scale = self._scale_of(rt, current)
        if request.method == "GET":
            return _json(scale)
        content_type = self._content_type(request)
        body = self._decode(await self._read_body(request), content_type)
        if request.method == "PUT":
            if content_type not in _BODY_TYPES:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported {content_type!r}")
            wanted = body
        elif content_type == patches.MERGE_PATCH and isinstance(body, dict):
            wanted = patches.merge_patch(scale, body)
        elif content_type == patches.STRATEGIC_PATCH and isinstance(body, dict):
            wanted = patches.strategic_merge_patch(scale, body)
        elif content_type == patches.JSON_PATCH:
            wanted = patches.json_patch(scale, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch {content_type!r}")
        replicas = (wanted.get("spec") or {}).get("replicas") if isinstance(wanted, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422, "Invalid", "spec.replicas: Invalid value: must be a non-negative integer"
            )
        path = self.store.scale_paths(rt).get("specReplicasPath", "")
        if not path:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        new = json.loads(json.dumps(current))
        _set_path(new, path, replicas)
        want_rv = (wanted.get("metadata") or {}).get("resourceVersion")
        if want_rv:
            new["metadata"]["resourceVersion"] = want_rv
        self._track(request, rt, current, new, None)
        return _json(self._scale_of(rt, self.store.update(rt, new)))

    # -- deletes ---------------------------------------------------------------------------

    async def _delete_options(self, request: web.Request) -> tuple[str, dict[str, Any] | None]:
        options: dict[str, Any] = {}
        raw = await self._read_body(request)
        if raw.strip():
            content_type = self._content_type(request)
            if content_type != protobuf.MEDIA_TYPE:
                content_type = "application/json"
            decoded = self._decode(raw, content_type)
            if not isinstance(decoded, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            options = decoded
        query = request.query
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy")
        orphan = query.get("orphanDependents")
        orphan_flag = _bool_param(orphan) if orphan is not None else options.get("orphanDependents")
        if propagation is None:
            propagation = "Orphan" if orphan_flag else "Background"
        preconditions = options.get("preconditions")
        dry_run = options.get("dryRun")
        if dry_run:
            if dry_run != ["All"]:
                raise bad_request(f'Invalid dryRun value: {dry_run!r}: only ["All"] is supported')
            request[_BODY_DRY_RUN] = True
        return str(propagation), preconditions if isinstance(preconditions, dict) else None

    async def _delete(
        self, request: web.Request, rt: ResourceType, namespace: str | None, name: str
    ) -> web.Response:
        propagation, preconditions = await self._delete_options(request)
        before = self.store.get_frozen(rt, namespace, name)
        if _dry_run(request):
            return self._dry_run_delete(rt, before, preconditions)
        result = self.store.delete(
            rt, namespace, name, propagation=propagation, preconditions=preconditions
        )
        try:
            still = self.store.get_frozen(rt, namespace, name)
        except ApiError:
            still = None
        if still is not None and still["metadata"]["uid"] == before["metadata"]["uid"]:
            return _json(_versioned(rt, still))
        if rt.custom or (rt.group, rt.kind) in _RETURNS_DELETED:
            return _json(result)
        return _json(_success(rt, before))

    @staticmethod
    def _dry_run_delete(
        rt: ResourceType, current: dict[str, Any], preconditions: dict[str, Any] | None
    ) -> web.Response:
        """What a delete would answer, changing nothing: the object as it would be
        (terminating when finalizers hold it), or the Success status."""
        meta = current["metadata"]
        for key in ("uid", "resourceVersion"):
            want = (preconditions or {}).get(key)
            if want and str(want) != meta.get(key):
                raise errors.conflict(
                    rt.plural,
                    meta["name"],
                    f"Precondition failed: {key} in precondition: {want}, "
                    f"{key} in object meta: {meta.get(key)}",
                    rt.group,
                )
        if meta.get("finalizers") or rt == NAMESPACE:
            shown = {**current, "metadata": {**meta, "deletionTimestamp": now_rfc3339()}}
            return _json(_versioned(rt, shown))
        if rt.custom or (rt.group, rt.kind) in _RETURNS_DELETED:
            return _json(_versioned(rt, current))
        return _json(_success(rt, current))

    async def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.Response:
        propagation, _ = await self._delete_options(request)
        query = request.query
        items, _ = self.store.list_frozen(
            rt, namespace, query.get("labelSelector"), query.get("fieldSelector")
        )
        dry_run = _dry_run(request)
        deleted = [_versioned(rt, obj) for obj in items] if dry_run else []
        for obj in [] if dry_run else items:
            meta = obj["metadata"]
            try:
                deleted.append(
                    self.store.delete(
                        rt, meta.get("namespace"), meta["name"], propagation=propagation
                    )
                )
            except ApiError as error:
                if error.code != 404:
                    raise
        body = {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.store.resource_version)},
            "items": deleted,
        }
        return _json(body)
