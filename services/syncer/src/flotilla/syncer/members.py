"""How the syncer reaches its member clusters, in push mode and in pull mode.

Push mode (the default) runs on the hub side with one connection per member from
the kit's pool (`flotilla.common.members.MemberClients`: built from each
Cluster's kubeconfig Secret, per-cluster backoff and limits). Pull mode runs the
same syncer inside one member, which knows only its own cluster: `LocalMember`
hands out the client of that one cluster (from ``FLOTILLA_MEMBER_KUBECONFIG``,
or the Pod's service account when unset) behind the same two calls, so nothing
else in the syncer knows which mode it runs in.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio.client import ApiClient

from flotilla.common import kube
from flotilla.common.errors import ConfigError, InvalidObject

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Members(Protocol):
    """What the syncer needs of its member clusters."""

    async def client(self, cluster: str) -> ApiClient:
        """A client for long requests (watches) that hold no per-cluster slot."""
        ...

    def connection(self, cluster: str) -> AbstractAsyncContextManager[ApiClient]:
        """A client for one piece of work; failures inside come out as Flotilla's errors."""
        ...

    async def close(self) -> None: ...


class LocalMember:
    """The one member a pull-mode syncer runs in."""

    def __init__(self, cluster: str, api: ApiClient) -> None:
        self.cluster = cluster
        self._api = api

    @classmethod
    async def open(
        cls, cluster: str, kubeconfig: Path | None, timeouts: kube.Timeouts
    ) -> LocalMember:
        if kubeconfig is not None:
            api = await kube.client_from_kubeconfig(kubeconfig, timeouts=timeouts)
        else:
            api = await kube.client_from_kubeconfig(
                kubeconfig=in_cluster_kubeconfig(), timeouts=timeouts
            )
        return cls(cluster, api)

    async def client(self, cluster: str) -> ApiClient:
        if cluster != self.cluster:
            raise InvalidObject(
                f"this syncer runs in pull mode for cluster {self.cluster}, not {cluster}",
                reason="InvalidCluster",
            )
        return self._api

    @asynccontextmanager
    async def connection(self, cluster: str) -> AsyncIterator[ApiClient]:
        api = await self.client(cluster)
        try:
            yield api
        except Exception as exc:
            error = kube.translate(exc)
            if error is exc:
                raise
            raise error from exc

    async def close(self) -> None:
        await self._api.close()


def in_cluster_kubeconfig() -> dict[str, Any]:
    """A kubeconfig for the Pod's own service account (token file re-read on expiry)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError(
            "pull mode needs FLOTILLA_MEMBER_KUBECONFIG outside a Pod "
            "(KUBERNETES_SERVICE_HOST is not set)"
        )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "member",
                "cluster": {
                    "server": server,
                    "certificate-authority": str(SERVICE_ACCOUNT / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "member", "user": {"tokenFile": str(SERVICE_ACCOUNT / "token")}}],
        "contexts": [{"name": "member", "context": {"cluster": "member", "user": "member"}}],
        "current-context": "member",
    }
