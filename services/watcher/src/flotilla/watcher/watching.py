"""List and watch one resource type of the hub, resumably: the watcher's adapter.

`TypeWatch.run` is a small informer for one type: it resumes the watch from the
durable position when it has one, re-lists when it has none or the server says
410 Expired, re-watches from the last resourceVersion when a watch ends (server
timeout, connection loss), and asks for bookmarks so that a quiet type's position
still moves forward. Every event goes to a `Sink` in order; the position is saved
only after the sink returned, so an event is never skipped by a crash — at worst
it is seen again, which the sink's fingerprints make harmless. Only a *permanent*
sink error (`flotilla.common.errors.PermanentError`: this event can never be
handled) skips the event, logged; retrying it from the same position would replay
the poison forever and lose every later change of the type. Transient errors are
retried from the saved position with backoff.

Watch events are read line by line up to `MAX_EVENT_LINE`: an object may be as
large as the API server stores (~1.5 MiB, more as JSON), far beyond aiohttp's
default line limit.

It talks to the API server through kubernetes_asyncio's `ApiClient.call_api`
rather than its `Watch` helper or the DynamicClient: `Watch` answers the first 410
by re-watching from the same expired version and builds a second `ApiClient` of
its own, and the DynamicClient (which requests without preloading) hands back
error ``Status`` bodies as if they were objects. An informer needs to see 410
itself and to check every status, which the raw call gives in a few lines.
Hand-written because no maintained asyncio informer fits: kubernetes_asyncio has
none, kopf's watch loop is bound to its operator framework, and neither keeps
resume positions durably across restarts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient

from flotilla.common import kube
from flotilla.common.api import GroupVersionKind
from flotilla.common.errors import FlotillaError, PermanentError

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

LIST_PAGE = 500
WATCH_SECONDS = 300
"""Server-side watch timeout; a watch is re-opened from its position after it."""
MAX_BACKOFF = 10.0
MAX_EVENT_LINE = 64 * 2**20
"""Longest watch event line read (an object the API server stores is far smaller)."""


class Expired(Exception):
    """410 Gone: the position is older than the server's watch history."""


@dataclass(frozen=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: JsonObject

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


class Sink(Protocol):
    """Where a `TypeWatch` delivers what it sees, in order."""

    async def relisted(self, gvk: GroupVersionKind, items: list[JsonObject], revision: int) -> None:
        """A complete list at `revision`: anything known of `gvk` and absent is gone."""

    async def changed(self, gvk: GroupVersionKind, obj: JsonObject) -> None:
        """ADDED or MODIFIED."""

    async def deleted(self, gvk: GroupVersionKind, obj: JsonObject) -> None: ...


class Positions(Protocol):
    async def get(self, gvk: GroupVersionKind) -> str | None: ...

    async def put(self, gvk: GroupVersionKind, resource_version: str) -> None: ...


class TypeClient:
    """Raw list and watch of one type, cluster-wide, as plain dicts."""

    def __init__(self, api: ApiClient, path: str, gvk: GroupVersionKind) -> None:
        self.api = api
        self.path = path
        self.gvk = gvk

    @classmethod
    async def discover(
        cls, api: ApiClient, dyn: DynamicClient, gvk: GroupVersionKind
    ) -> TypeClient:
        resource = await kube.resource_for(dyn, gvk.api_version, gvk.kind)
        return cls(api, str(resource.path()), gvk)

    async def _get(self, query: list[tuple[str, Any]], timeout: Any = None) -> Any:
        return await self.api.call_api(
            self.path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )

    async def list(self) -> tuple[list[JsonObject], str]:
        """Every object (paged), with the list's resourceVersion."""
        items: list[JsonObject] = []
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", LIST_PAGE)]
            if token:
                query.append(("continue", token))
            response = await self._get(query, timeout=60)
            async with response:
                if response.status == 410:
                    token = None  # the continue token expired: start the list over
                    items.clear()
                    continue
                if response.status >= 300:
                    raise _error(response.status, await response.text())
                body = await response.json()
            for item in body.get("items") or []:
                # Lists omit each item's apiVersion/kind; watch events carry them.
                item.setdefault("apiVersion", self.gvk.api_version)
                item.setdefault("kind", self.gvk.kind)
                items.append(item)
            metadata = body.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion") or "")

    async def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch.

        Raises `Expired` on 410 (as a status or as an ERROR event).
        """
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=WATCH_SECONDS + 30)
        response = await self._get(query, timeout=timeout)
        async with response:
            if response.status == 410:
                raise Expired(await response.text())
            if response.status >= 300:
                raise _error(response.status, await response.text())
            while True:
                try:
                    line = await response.content.readline(max_line_length=MAX_EVENT_LINE)
                except RuntimeError as exc:
                    # aiohttp's word for a connection that went away under a read
                    # with neither an end nor an error fed to the stream (seen on a
                    # busy hub): a broken watch like any other, resumed from its position.
                    if "Connection closed" not in str(exc):
                        raise
                    raise aiohttp.ClientConnectionError(f"watch connection closed: {exc}") from exc
                if not line:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired(str(obj.get("message")))
                    raise _error(int(obj.get("code") or 500), json.dumps(obj))
                yield WatchEvent(str(event.get("type")), obj)


def _error(status: int, body: str) -> FlotillaError:
    exc = ApiException(status=status, reason=body[:500])
    exc.body = body.encode()
    return kube.translate(exc)


class TypeWatch:
    """The informer loop for one type (see the module docstring)."""

    def __init__(
        self,
        client: TypeClient,
        sink: Sink,
        positions: Positions,
        *,
        resume: bool,
    ) -> None:
        self.client = client
        self.sink = sink
        self.positions = positions
        self.resume = resume
        self.synced = asyncio.Event()
        """Set once the sink has seen the current state (a list, or a resumed watch)."""

    @property
    def gvk(self) -> GroupVersionKind:
        return self.client.gvk

    async def run(self) -> None:
        """Until cancelled; transient failures are retried with backoff."""
        position = await self.positions.get(self.gvk) if self.resume else None
        backoff = 0.2
        while True:
            try:
                if not position:
                    items, position = await self.client.list()
                    await self.sink.relisted(self.gvk, items, _int(position))
                    await self.positions.put(self.gvk, position)
                self.synced.set()
                async for event in self.client.watch(position):
                    try:
                        await self._deliver(event)
                    except PermanentError as exc:
                        log.error(
                            "skipping %s event of %s %s: %s",
                            event.type,
                            self.gvk,
                            (event.object.get("metadata") or {}).get("name"),
                            exc,
                        )
                    if event.resource_version:
                        position = event.resource_version
                        await self.positions.put(self.gvk, position)
                    backoff = 0.2
            except Expired:
                log.info("watch of %s expired at %s; re-listing", self.gvk, position)
                position = None
            except asyncio.CancelledError:
                raise
            except (FlotillaError, aiohttp.ClientError, OSError, ValueError) as exc:
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.gvk, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _deliver(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            await self.sink.deleted(self.gvk, event.object)
        elif event.type in ("ADDED", "MODIFIED"):
            await self.sink.changed(self.gvk, event.object)


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
