"""The hub as the command sees it: manifests in, objects and clusters out.

Everything goes through the hub's kubeconfig with kubernetes_asyncio (never a
hand-built URL: the hub may speak TLS). Manifests are read here too, so a YAML
mistake is reported with its file and line before anything is sent.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic.resource import ResourceList

from flotilla.cli.errors import CliError
from flotilla.common import kube
from flotilla.common.errors import FlotillaError, InvalidObject

JsonObject = dict[str, Any]
FIELD_MANAGER = "flotilla-cli"
CLUSTER_API = "flotilla.io/v1alpha1"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
SHORT_NAMES = {
    "deploy": "deployment",
    "sts": "statefulset",
    "ds": "daemonset",
    "cm": "configmap",
    "svc": "service",
    "ns": "namespace",
    "cj": "cronjob",
    "po": "pod",
    "pp": "placementpolicy",
    "cpp": "clusterplacementpolicy",
}
"""kubectl's short names, for an API server that does not announce them."""


@dataclass(frozen=True)
class Manifest:
    source: str
    """``file`` or ``file#n`` for the n-th document."""
    body: JsonObject


def manifests(path: Path) -> list[Manifest]:
    """Every object in a file, or in a directory's YAML/JSON files (sorted), in order."""
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    files = (
        sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES)
        if path.is_dir()
        else [path]
    )
    found: list[Manifest] = []
    for file in files:
        found.extend(_documents(file))
    if not found:
        raise CliError(f"{path}: no objects found")
    return found


def _documents(file: Path) -> Iterator[Manifest]:
    try:
        documents = list(yaml.safe_load_all(file.read_text()))
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise CliError(f"{file}:{line}: invalid YAML: {exc.problem}") from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{file}: cannot read: {exc}") from None
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        source = f"{file}#{index}" if len(documents) > 1 else str(file)
        if not isinstance(document, dict) or not document.get("apiVersion"):
            raise CliError(f"{source}: not a Kubernetes object (no apiVersion)")
        if not document.get("kind") or not (document.get("metadata") or {}).get("name"):
            raise CliError(f"{source}: a Kubernetes object needs kind and metadata.name")
        yield Manifest(source, document)


def display_name(obj: JsonObject) -> str:
    """``deployment.apps/web`` as kubectl says it."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    kind = str(obj.get("kind", "")).lower()
    name = (obj.get("metadata") or {}).get("name")
    return f"{kind}.{group}/{name}" if group else f"{kind}/{name}"


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or b"").get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


class Hub:
    """One connection to the hub API server."""

    def __init__(self, api: ApiClient, dyn: DynamicClient) -> None:
        self.api = api
        self.dyn = dyn

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, kubeconfig: str) -> AsyncIterator[Hub]:
        try:
            api = await kube.client_from_kubeconfig(kubeconfig)
        except FlotillaError as exc:
            raise CliError(f"cannot use the hub kubeconfig: {exc}") from None
        try:
            async with api, DynamicClient(api) as dyn:
                yield cls(api, dyn)
        except (OSError, TimeoutError) as exc:
            raise CliError(f"the hub does not answer: {exc}") from None

    async def resource(self, api_version: str, kind: str) -> Any:
        try:
            return await kube.resource_for(self.dyn, api_version, kind)
        except InvalidObject as exc:
            raise CliError(str(exc)) from None

    async def resolve(self, kind: str) -> Any:
        """A resource by the names kubectl accepts: ``deployment``, ``deployments``,
        ``deploy``, ``Deployment``, ``deployment.apps``."""
        name, _, group = kind.lower().partition(".")
        name = SHORT_NAMES.get(name, name)
        resources = [
            r
            for r in await self.dyn.resources.search()
            if not isinstance(r, ResourceList) and "/" not in (r.name or "")
        ]
        for resource in resources:
            names = {str(resource.kind).lower(), resource.name, resource.singular_name}
            names.update(resource.short_names or [])
            if name in names and (not group or resource.group == group):
                return resource
        raise CliError(f"the hub serves no resource type {kind!r}")

    async def apply(self, obj: JsonObject) -> str:
        """Server-side apply; ``<name> created|configured``."""
        resource = await self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        namespace = (meta.get("namespace") or "default") if resource.namespaced else None
        body = {**obj, "metadata": {**meta, **({"namespace": namespace} if namespace else {})}}
        existed = await self.get(resource, meta["name"], namespace) is not None
        try:
            kube.checked(
                await self.dyn.server_side_apply(
                    resource,
                    body=body,
                    name=meta["name"],
                    namespace=namespace,
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                )
            )
        except ApiException as exc:
            raise CliError(f"{display_name(obj)}: {_api_message(exc)}") from None
        return f"{display_name(obj)} {'configured' if existed else 'created'}"

    async def delete(self, obj: JsonObject) -> str:
        resource = await self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        namespace = (meta.get("namespace") or "default") if resource.namespaced else None
        try:
            kube.checked(await self.dyn.delete(resource, name=meta["name"], namespace=namespace))
        except ApiException as exc:
            if exc.status == 404:
                return f"{display_name(obj)} not found"
            raise CliError(f"{display_name(obj)}: {_api_message(exc)}") from None
        return f"{display_name(obj)} deleted"

    async def get(self, resource: Any, name: str, namespace: str | None) -> JsonObject | None:
        try:
            return kube.checked(await self.dyn.get(resource, name=name, namespace=namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CliError(f"{resource.kind} {name}: {_api_message(exc)}") from None

    async def list(self, api_version: str, kind: str) -> list[JsonObject]:
        resource = await self.resource(api_version, kind)
        try:
            listed = kube.checked(await self.dyn.get(resource))
        except ApiException as exc:
            raise CliError(f"listing {kind}: {_api_message(exc)}") from None
        items: list[JsonObject] = listed.get("items") or []
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return sorted(
            items,
            key=lambda o: ((o["metadata"].get("namespace") or ""), o["metadata"]["name"]),
        )

    async def cluster(self, name: str) -> JsonObject:
        resource = await self.resource(CLUSTER_API, "Cluster")
        found = await self.get(resource, name, None)
        if found is None:
            known = [c["metadata"]["name"] for c in await self.list(CLUSTER_API, "Cluster")]
            raise CliError(f"unknown cluster {name!r} (clusters: {', '.join(known) or 'none'})")
        return found

    async def patch_cluster(self, name: str, spec: JsonObject) -> JsonObject:
        await self.cluster(name)
        resource = await self.resource(CLUSTER_API, "Cluster")
        try:
            return kube.checked(
                await self.dyn.patch(
                    resource,
                    body={"spec": spec},
                    name=name,
                    content_type="application/merge-patch+json",
                )
            )
        except ApiException as exc:
            raise CliError(f"cluster {name}: {_api_message(exc)}") from None


def condition(obj: JsonObject, type_: str) -> JsonObject | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == type_:
            return dict(found)
    return None


def is_true(obj: JsonObject, type_: str) -> bool:
    found = condition(obj, type_)
    return bool(found and found.get("status") == "True")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = int((datetime.now(UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
