"""Plain REST calls to a Kubernetes API server, for any kind, through kubernetes_asyncio.

The syncer applies kinds it learns from the works it receives, on up to hundreds
of clusters. kubernetes_asyncio's typed APIs cover only built-in kinds, and its
`DynamicClient` discovers every group of a cluster up front (and caches it in a
file), so this module keeps the part the syncer needs: the path of one
(apiVersion, kind) from that group version's discovery document, cached per
client, and requests through the client's REST layer (auth, TLS and the kit's
timeouts come with the client). A response of 300 or more raises the
`ApiException` kubernetes_asyncio would, so the member pool translates it into
Flotilla's errors; bodies are never preloaded, so none reaches a debug log.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.common.errors import InvalidObject

JsonObject = dict[str, Any]

APPLY_PATCH = "application/apply-patch+yaml"
"""Server-side apply; a JSON body is valid YAML."""


@dataclass(frozen=True)
class Resource:
    """Where one kind lives on one API server."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base = f"{base}/namespaces/{namespace}"
        base = f"{base}/{self.plural}"
        return f"{base}/{name}" if name else base


_DISCOVERY: weakref.WeakKeyDictionary[ApiClient, dict[str, JsonObject]] = (
    weakref.WeakKeyDictionary()
)
"""Discovery documents per client and group version (a new client rediscovers)."""


async def call(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    decode: bool = True,
) -> JsonObject:
    """One request; the decoded JSON answer (``{}`` unless `decode`: an apply's or a
    delete's answer is not read), or `ApiException` for a status >= 300."""
    response: Any = await _request(api, method, path, query or [], content_type, body)
    async with response:
        raw = await response.read()
        if response.status >= 300:
            exc = ApiException(status=response.status, reason=response.reason)
            exc.body = raw
            raise exc
    decoded: JsonObject = json.loads(raw) if raw and decode else {}
    return decoded


async def _request(
    api: ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, Any]],
    content_type: str = "application/json",
    body: Any = None,
) -> Any:
    """The response (not read yet) of one request through the client's REST layer.

    ``ApiClient.call_api`` would walk every header, parameter and body (the whole
    manifest) to make them serialisable, which they already are: the syncer sends
    plain JSON. Authentication, the client's default headers and its timeouts
    (`flotilla.common.kube`) are applied as ``call_api`` applies them."""
    headers = {**api.default_headers, "Accept": "application/json", "Content-Type": content_type}
    query = list(query)
    await api.update_params_for_auth(headers, query, ["BearerToken"])
    return await api.request(
        method,
        f"{api.configuration.host}{path}",
        query_params=query,
        headers=headers,
        body=body,
        _preload_content=False,
    )


async def stream(
    api: ApiClient, path: str, query: list[tuple[str, Any]]
) -> AsyncIterator[JsonObject]:
    """The events of one watch (``{"type", "object"}``) until the server ends it."""
    response: Any = await _request(api, "GET", path, [*query, ("watch", "true")])
    async with response:
        if response.status >= 300:
            exc = ApiException(status=response.status, reason=response.reason)
            exc.body = await response.read()
            raise exc
        async for line in response.content:
            if line.strip():
                event: JsonObject = json.loads(line)
                yield event


async def group_version(api: ApiClient, api_version: str) -> JsonObject:
    """The discovery document of one group version (cached per client)."""
    cached = _DISCOVERY.setdefault(api, {})
    found = cached.get(api_version)
    if found is None:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        found = cached[api_version] = await call(api, "GET", path)
    return found


def forget(api: ApiClient, api_version: str) -> None:
    """Drop a cached discovery document (a CRD may have been installed since)."""
    _DISCOVERY.get(api, {}).pop(api_version, None)


async def resource(api: ApiClient, api_version: str, kind: str) -> Resource:
    """Where `kind` lives, or `InvalidObject` (``UnknownType``) when nothing serves it."""
    try:
        document = await group_version(api, api_version)
    except ApiException as exc:
        if exc.status != 404:
            raise
        document = {}
    for entry in document.get("resources") or []:
        if entry.get("kind") == kind and "/" not in str(entry.get("name")):
            return Resource(api_version, kind, str(entry["name"]), bool(entry.get("namespaced")))
    forget(api, api_version)
    raise InvalidObject(
        f"the member cluster does not serve {kind} in {api_version}", reason="UnknownType"
    )


async def api_resources(api: ApiClient) -> list[JsonObject]:
    """Every (group, version, kind) the server serves, for ``Cluster.status.apiResources``."""
    found: list[JsonObject] = []
    core = await call(api, "GET", "/api/v1")
    versions: list[tuple[str, JsonObject]] = [("v1", core)]
    groups = await call(api, "GET", "/apis")
    for group in groups.get("groups") or []:
        for version in group.get("versions") or []:
            gv = str(version.get("groupVersion"))
            versions.append((gv, await call(api, "GET", f"/apis/{gv}")))
    for gv, document in versions:
        _DISCOVERY.setdefault(api, {})[gv] = document
        group, _, version = gv.rpartition("/")
        for entry in document.get("resources") or []:
            if "/" in str(entry.get("name")):
                continue  # a subresource
            found.append({"group": group, "version": version, "kind": str(entry.get("kind"))})
    found.sort(key=lambda r: (r["group"], r["version"], r["kind"]))
    return found
