"""Clients for the member clusters, built from each Cluster's kubeconfig Secret on the hub.

A service that writes to or reads from members (the syncer first) asks
``MemberClients.client(name)`` for a kubernetes_asyncio ``ApiClient``, or better
``async with pool.connection(name) as api:``, which also reports failures back.
The pool reads the ``Cluster`` (flotilla.io/v1alpha1, cluster-scoped), follows
``spec.kubeconfigSecretRef`` to the Secret on the hub and builds the client with
`kube.client_from_kubeconfig`: timeouts on every request, bearer tokens and TLS
material honoured and kept in memory.

- A client is cached per cluster and revalidated after `revalidate_after`
  seconds: a new generation of the Cluster (its spec; status writes, which
  happen every heartbeat, do not count) or resourceVersion of the Secret (a moved
  endpoint, a rotated token) builds a new client; otherwise the check costs two
  small reads on the hub. While the hub cannot be read, the cached client keeps
  serving.
- A connection failure (unreachable, timeout, 5xx, credentials refused) retires
  the client and backs that cluster off exponentially. Meanwhile ``client()``
  fails at once with `Unavailable` whose delay is the time left, so a down
  member costs its callers nothing; the next attempt re-reads the Secret and
  probes the member before handing a client out.
- Each cluster has its own lock, held only while that cluster's client is
  checked or built, and its own bound on concurrent ``connection()`` blocks
  (`per_cluster`): a slow member never delays another nor takes every worker.
- A replaced client is closed after a grace period (connect + request timeout)
  long enough for the requests already using it to end; a watch still open on it
  ends then and is re-opened by its loop. ``close()`` closes everything.

Errors use the project's vocabulary. A missing or invalid Cluster, a missing
Secret or key, or a kubeconfig that cannot be used is `InvalidObject` (reason
``InvalidCluster``) naming the Cluster and the Secret reference: retrying cannot
help until someone fixes them. An unreachable member or hub is `Unavailable`.
Credentials stay inside the clients: no message or log line quotes them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from flotilla.common import api, kube
from flotilla.common.errors import ConfigError, InvalidObject, PermanentError, Unavailable

log = logging.getLogger(__name__)

INVALID_CLUSTER = "InvalidCluster"


@dataclass(frozen=True)
class Backoff:
    """Exponential delays between attempts to reach a failing member."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after `failures` consecutive failures (the first is 1)."""
        if failures < 1:
            return 0.0
        return float(min(self.maximum, self.initial * self.factor ** (failures - 1)))


@dataclass
class _Member:
    """What the pool knows of one member cluster."""

    slots: asyncio.Semaphore
    """Bounds the `connection()` blocks open on this member at once."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    client: ApiClient | None = None
    secret_ref: api.SecretKeyRef | None = None
    versions: tuple[str, str] = ("", "")
    """The Cluster's generation and the Secret's resourceVersion the client was built from."""
    checked_at: float = float("-inf")
    failures: int = 0
    retry_at: float = float("-inf")
    last_error: str = ""


class MemberClients:
    """A pool of member-cluster clients (see the module docstring)."""

    def __init__(
        self,
        hub: ApiClient,
        *,
        timeouts: kube.Timeouts | None = None,
        backoff: Backoff | None = None,
        revalidate_after: float = 10.0,
        per_cluster: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_cluster < 1:
            raise ValueError("per_cluster must be at least 1")
        self._hub = hub
        self._per_cluster = per_cluster
        self._timeouts = timeouts or kube.Timeouts()
        self._backoff = backoff or Backoff()
        self._revalidate_after = revalidate_after
        self._clock = clock
        self._members: dict[str, _Member] = {}
        self._retired: list[tuple[float, ApiClient]] = []
        self._closed = False

    async def client(self, cluster: str) -> ApiClient:
        """A client for `cluster`, valid until a later call replaces it.

        Raises `Unavailable` (the member or the hub cannot be reached, or the
        cluster is backing off) or `InvalidObject` (the Cluster or its Secret
        cannot be used as written).
        """
        if self._closed:
            raise RuntimeError("the member client pool is closed")
        member = self._member(cluster)
        if member.client is not None and self._clock() < member.checked_at + self._revalidate_after:
            return member.client  # the common case: no lock, no I/O
        async with member.lock:
            await self._reap()
            now = self._clock()
            if member.client is not None and now < member.checked_at + self._revalidate_after:
                return member.client
            if now < member.retry_at:
                raise Unavailable(
                    f"member cluster {cluster} is backing off after: {member.last_error}",
                    delay=member.retry_at - now,
                )
            try:
                return await self._refresh(cluster, member)
            except Unavailable as error:
                self._back_off(cluster, member, error)
                raise
            except PermanentError:
                self._retire(member)
                raise

    @asynccontextmanager
    async def connection(self, cluster: str) -> AsyncIterator[ApiClient]:
        """``client(cluster)`` for one piece of work, once one of the cluster's
        `per_cluster` slots is free; failures inside the block are translated into
        Flotilla's errors, and connection failures retire the client and back the
        cluster off (callers queued behind them are then refused at once)."""
        member = self._member(cluster)
        async with member.slots:
            api_client = await self.client(cluster)
            try:
                yield api_client
            except Exception as exc:
                error = kube.translate(exc)
                if _is_connection_failure(exc):
                    error = self._connection_failed(cluster, member, api_client, exc)
                if error is exc:
                    raise
                raise error from exc

    async def close(self) -> None:
        """Close every client; the pool cannot be used afterwards."""
        self._closed = True
        for member in self._members.values():
            self._retire(member)
        retired, self._retired = self._retired, []
        for _, api_client in retired:
            await api_client.close()

    def _member(self, cluster: str) -> _Member:
        member = self._members.get(cluster)
        if member is None:
            member = self._members[cluster] = _Member(asyncio.Semaphore(self._per_cluster))
        return member

    # -- building ------------------------------------------------------------------

    async def _refresh(self, cluster: str, member: _Member) -> ApiClient:
        try:
            obj, ref, secret = await self._read_hub(cluster)
        except (ApiException, aiohttp.ClientError, OSError) as exc:
            error = kube.translate(exc)
            if not isinstance(error, Unavailable):
                raise error from exc
            if member.client is not None:
                # The hub cannot be read, the member may well be: keep what works.
                log.warning("member cluster %s: cannot revalidate on the hub: %s", cluster, error)
                member.checked_at = self._clock()
                return member.client
            raise Unavailable(
                f"cannot read Cluster {cluster} or its Secret on the hub: {error}",
                delay=error.delay,
            ) from exc
        versions = (
            str((obj.get("metadata") or {}).get("generation") or ""),
            str((secret.get("metadata") or {}).get("resourceVersion") or ""),
        )
        if member.client is not None and versions == member.versions:
            member.checked_at = self._clock()
            return member.client
        built = await self._build(cluster, ref, secret)
        if self._closed:
            await built.close()
            raise RuntimeError("the member client pool is closed")
        self._retire(member)
        member.client, member.secret_ref, member.versions = built, ref, versions
        member.checked_at = self._clock()
        member.failures, member.retry_at, member.last_error = 0, float("-inf"), ""
        log.info(
            "member cluster %s: client built from Secret %s/%s (resourceVersion %s)",
            cluster,
            ref.namespace,
            ref.name,
            versions[1],
        )
        return built

    async def _read_hub(
        self, cluster: str
    ) -> tuple[dict[str, Any], api.SecretKeyRef, dict[str, Any]]:
        """The Cluster, its Secret reference and the Secret; a 404 is permanent here."""
        try:
            obj = await k8s.CustomObjectsApi(self._hub).get_cluster_custom_object(
                api.GROUP, api.VERSION, "clusters", cluster
            )
        except ApiException as exc:
            if exc.status == 404:
                raise InvalidObject(
                    f"Cluster {cluster} does not exist", reason=INVALID_CLUSTER
                ) from None
            raise
        ref = _secret_ref(cluster, obj)
        secret = await self._read_secret(ref)
        if secret is None:
            raise InvalidObject(
                f"Cluster {cluster}: kubeconfig Secret {_describe(ref)} does not exist",
                reason=INVALID_CLUSTER,
            )
        return obj, ref, secret

    async def _read_secret(self, ref: api.SecretKeyRef) -> dict[str, Any] | None:
        """The Secret as a dict, or None when it does not exist.

        Read without kubernetes_asyncio's preloading, which logs every response body
        at DEBUG level: a Secret's content must never reach a log.
        """
        response: Any = await k8s.CoreV1Api(self._hub).read_namespaced_secret(
            ref.name, ref.namespace, _preload_content=False
        )
        async with response:
            if response.status == 404:
                return None
            if response.status >= 300:
                raise ApiException(status=response.status, reason=response.reason)
            body: dict[str, Any] = await response.json()
        return body

    async def _build(
        self, cluster: str, ref: api.SecretKeyRef, secret: dict[str, Any]
    ) -> ApiClient:
        """A client from the Secret's kubeconfig, probed: a member that does not answer
        is `Unavailable` now, not at the caller's first request."""
        where = f"Cluster {cluster}: kubeconfig Secret {_describe(ref)}"
        encoded = (secret.get("data") or {}).get(ref.key)
        if encoded is None:
            raise InvalidObject(f"{where} has no key {ref.key!r}", reason=INVALID_CLUSTER)
        try:
            document = yaml.safe_load(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError, yaml.YAMLError):
            # The parser's message would quote the (secret) text it choked on.
            raise InvalidObject(f"{where} is not valid YAML", reason=INVALID_CLUSTER) from None
        try:
            built = await kube.client_from_kubeconfig(kubeconfig=document, timeouts=self._timeouts)
        except ConfigError as error:
            raise InvalidObject(f"{where}: {error}", reason=INVALID_CLUSTER) from error
        try:
            await k8s.VersionApi(built).get_code()
        except Exception as exc:
            await built.close()
            raise _member_unavailable(cluster, ref, exc) from exc
        return built

    # -- failures ------------------------------------------------------------------

    def _connection_failed(
        self, cluster: str, member: _Member, api_client: ApiClient, exc: BaseException
    ) -> Unavailable:
        error = _member_unavailable(cluster, member.secret_ref, exc)
        # Requests in flight on the same client fail together: count them once.
        if member.client is api_client:
            self._retire(member)
            self._back_off(cluster, member, error)
        return Unavailable(str(error), delay=max(member.retry_at - self._clock(), 0.0))

    def _back_off(self, cluster: str, member: _Member, error: Unavailable) -> None:
        member.failures += 1
        delay = self._backoff.delay(member.failures)
        member.retry_at = self._clock() + delay
        member.last_error = str(error)
        log.warning("%s; next attempt in %.1fs", error, delay)

    def _retire(self, member: _Member) -> None:
        if member.client is None:
            return
        grace = self._timeouts.connect + self._timeouts.request
        self._retired.append((self._clock() + grace, member.client))
        member.client, member.versions, member.checked_at = None, ("", ""), float("-inf")

    async def _reap(self) -> None:
        now = self._clock()
        due = [entry for entry in self._retired if entry[0] <= now]
        self._retired = [entry for entry in self._retired if entry[0] > now]
        for _, api_client in due:
            await api_client.close()


def _secret_ref(cluster: str, obj: dict[str, Any]) -> api.SecretKeyRef:
    try:
        parsed = api.parse_as(api.Cluster, obj)
    except api.InvalidObjectError as error:
        raise InvalidObject(str(error), reason=INVALID_CLUSTER) from error
    ref = parsed.spec.kubeconfig_secret_ref
    if ref is None:
        raise InvalidObject(
            f"Cluster {cluster} has no spec.kubeconfigSecretRef", reason=INVALID_CLUSTER
        )
    return ref


def _describe(ref: api.SecretKeyRef | None) -> str:
    return f"{ref.namespace}/{ref.name} (key {ref.key!r})" if ref else "(not read yet)"


def _is_connection_failure(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status == 0 or status == 401 or status >= 500
    return isinstance(exc, aiohttp.ClientError | TimeoutError | OSError)


def _member_unavailable(
    cluster: str, ref: api.SecretKeyRef | None, exc: BaseException
) -> Unavailable:
    if isinstance(exc, ApiException) and exc.status == 401:
        return Unavailable(
            f"member cluster {cluster} refused the credentials from Secret {_describe(ref)}",
            delay=2.0,
        )
    return Unavailable(f"member cluster {cluster}: {kube.translate(exc)}", delay=2.0)
