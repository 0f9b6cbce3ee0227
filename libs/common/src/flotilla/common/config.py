"""Service configuration from `FLOTILLA_*` environment variables, checked at start-up.

Every service builds one `Settings` (or a subclass adding its own fields) through
`load`, which turns pydantic's validation errors into one readable `ConfigError`
naming each bad variable. Secrets (`redis_url` may carry a password, NATS
credentials) are `SecretStr`, so they never appear in logs or reprs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from flotilla.common.errors import ConfigError

ENV_PREFIX = "FLOTILLA_"
DEFAULT_CAPACITY_PREFIX = "flotilla:capacity:"


DEFAULT_SYSTEM_NAMESPACE = "flotilla-system"

HEALTH_PORTS = {
    "watcher": 8081,
    "depdetector": 8082,
    "scheduler": 8083,
    "transformer": 8084,
    "syncer": 8085,
    "aggregator": 8086,
    "drain": 8087,
}
"""Each service's default health port, so all seven run side by side on one machine
without configuration (``FLOTILLA_HEALTH_PORT`` still overrides)."""


def service_defaults(service: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """Overrides `load` applies for a named service: its own health port, unless the
    environment sets one."""
    if f"{ENV_PREFIX}HEALTH_PORT" in environ or service not in HEALTH_PORTS:
        return {}
    return {"health_port": HEALTH_PORTS[service]}


class Settings(BaseSettings):
    """What every Flotilla service needs to know."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    service: str = Field(default="flotilla", pattern=r"^[a-z][a-z0-9-]*$")
    instance: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="unique per replica; used for partition leases",
    )
    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: Path | None = Field(default=None, description="NATS .creds file (user JWT + nkey)")
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    partitions: int = Field(default=16, ge=1, le=1024)
    stream_prefix: str = Field(default="flotilla", pattern=r"^[a-z][a-z0-9_-]*$")
    max_concurrency: int = Field(default=64, ge=1)
    handler_deadline: float = Field(
        default=60.0,
        gt=0,
        description="seconds one event's handler may run before it is cancelled and retried",
    )
    hub_kubeconfig: Path | None = None
    kube_connect_timeout: float = Field(
        default=5.0, gt=0, description="seconds to open a connection (TCP + TLS) to an API server"
    )
    kube_request_timeout: float = Field(
        default=30.0, gt=0, description="seconds an API server may stay silent during a request"
    )
    kube_watch_timeout: int = Field(
        default=300, ge=1, description="server-side timeoutSeconds of a watch that sets none"
    )
    capacity_prefix: str = Field(
        default=DEFAULT_CAPACITY_PREFIX,
        min_length=1,
        description="Redis key prefix of the capacity cache (every service that reads or "
        "writes capacity uses the same one)",
    )
    system_namespace: str = Field(
        default=DEFAULT_SYSTEM_NAMESPACE,
        min_length=1,
        description="Flotilla's own hub namespace (member kubeconfigs); never a dependency",
    )
    health_host: str = "0.0.0.0"
    health_port: int = Field(default=8080, ge=0, le=65535)
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    tombstone_retention: float = Field(
        default=600.0,
        gt=0,
        description="seconds a deleted object's durable record is kept before it is forgotten",
    )


SettingsT = TypeVar("SettingsT", bound=Settings)


def load(settings_type: type[SettingsT], **overrides: Any) -> SettingsT:
    """Build settings from the environment (and explicit overrides) or fail readably."""
    try:
        return settings_type(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {ENV_PREFIX}{field.upper()}: {err['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from exc
