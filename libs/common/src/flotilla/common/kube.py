"""kubernetes_asyncio adapters the services share: clients, discovery, errors, Events.

Services talk to the hub and the members only through these helpers and
kubernetes_asyncio itself, never knowing whether the other side is a real API
server or kubesim. Third-party errors are translated here into the vocabulary of
`flotilla.common.errors`, so handlers decide retry vs. dead-letter in one place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError

from flotilla.common.errors import FlotillaError, InvalidObject, Unavailable

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

# Event namespace for cluster-scoped objects (Cluster, ClusterPlacementPolicy…),
# as kubectl/client-go do.
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


async def client_from_kubeconfig(
    path: str | Path | None = None, *, kubeconfig: JsonObject | None = None
) -> ApiClient:
    """An ApiClient for a kubeconfig file or dict; the caller closes it."""
    if kubeconfig is not None:
        return await config.new_client_from_config_dict(kubeconfig)
    return await config.new_client_from_config(config_file=str(path) if path else None)


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
