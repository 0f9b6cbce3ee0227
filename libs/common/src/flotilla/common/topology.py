"""The JetStream layout in one declarative table: streams, consumers, KV buckets.

Everything Flotilla creates on NATS is described here and created idempotently by
`flotilla.common.bus.Bus.ensure`. Subjects are partitioned so that per-key order
survives several replicas of a service::

    <prefix>.events.<EventType>.<partition>      every event; partition = hash(key) % P
    <prefix>.dlq.<EventType>                     dead letters, with the reason in headers

A service owns one durable pull consumer per partition (`<service>-p<n>`), and at
any moment exactly one replica holds the lease on a partition
(`flotilla.common.leases`), so all events of one key go to one replica, in order.

Message size: events carry whole Kubernetes objects (``ResourceObserved`` and
``ResourceAnalyzed``, and the placement record keeps the analysis), and an API
server stores objects of up to about 1.5 MiB, which is more again as an event's
JSON. So every stream accepts messages of up to `MAX_MESSAGE` (8 MiB), and the
NATS server must allow that much: ``max_payload: 8MB`` in its configuration
(NATS' own default is 1 MiB; `flotilla.common.infra.NatsServer` sets it). An
event that still does not fit is refused by `flotilla.common.bus.Bus.publish` as
a permanent ``ObjectTooLarge`` error, which its producer reports and skips.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from flotilla.common.events import EVENT_TYPES

Retention = Literal["limits", "workqueue", "interest"]

MAX_MESSAGE = 8 * 2**20
"""Largest event (and NATS payload) Flotilla is sized for (see the module docstring)."""


def partition_of(key: str, partitions: int) -> int:
    """Stable across processes and versions (never Python's randomized `hash`)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Retention = "limits"
    max_age: float = 7 * 24 * 3600.0
    max_bytes: int = -1  # -1: bounded by age only; set a limit per installation
    max_msg_size: int = MAX_MESSAGE
    duplicate_window: float = 120.0
    replicas: int = 1


@dataclass(frozen=True)
class BucketSpec:
    name: str
    history: int = 1
    ttl: float | None = None
    replicas: int = 1


@dataclass(frozen=True)
class BucketDeclaration:
    """A KV bucket a service keeps its durable state in (named ``<prefix>-<name>``)."""

    service: str
    name: str
    purpose: str
    history: int = 1


BUCKETS: tuple[BucketDeclaration, ...] = (
    BucketDeclaration(
        "scheduler", "placements", "placement record per object, by compare-and-set", history=5
    ),
    BucketDeclaration(
        "scheduler", "scheduler-clusters", "the fleet's clusters as the scheduler last saw them"
    ),
    BucketDeclaration("watcher", "positions", "watch resume positions per watched type"),
    BucketDeclaration("watcher", "watcher-records", "what the watcher last published per object"),
    BucketDeclaration(
        "transformer",
        "transformer-objects",
        "per placed object: its last analysis and decision, and the works it holds",
    ),
    BucketDeclaration(
        "transformer",
        "transformer-dependents",
        "per as-needed dependency: the objects needing it on each cluster, by compare-and-set",
    ),
    BucketDeclaration(
        "aggregator", "aggregator-reports", "each object's placement and latest member reports"
    ),
    BucketDeclaration("aggregator", "aggregator-clusters", "which clusters are Ready"),
    BucketDeclaration(
        "drain", "drain-objects", "each object's placement, availability and move progress"
    ),
    BucketDeclaration("drain", "drain-clusters", "each cluster's cordon, drain and readiness"),
    BucketDeclaration(
        "syncer", "syncer-works", "the last manifest applied per work (drift repair, restarts)"
    ),
)
"""Every service's buckets, created by `flotilla.common.bus.Bus.ensure`."""


@dataclass(frozen=True)
class ConsumerSpec:
    """How one service consumes: which event types, and the redelivery policy."""

    service: str
    event_types: tuple[str, ...]
    ack_wait: float = 10.0
    """Seconds before an unacknowledged event is redelivered: how long the work a dead
    replica had in flight waits. Handlers running longer stay alive through the
    consumer's ``in_progress`` heartbeats (every third of this)."""
    max_deliver: int = 10
    max_ack_pending: int = 2000

    def __post_init__(self) -> None:
        unknown = set(self.event_types) - set(EVENT_TYPES)
        if unknown:
            raise ValueError(f"{self.service}: unknown event types {sorted(unknown)}")
        if not self.event_types:
            raise ValueError(f"{self.service}: consumes no event types")

    def durable(self, partition: int) -> str:
        return f"{self.service}-p{partition}"


@dataclass(frozen=True)
class Topology:
    """Names of everything on the bus for one Flotilla installation (`prefix`)."""

    prefix: str = "flotilla"
    partitions: int = 16
    lease_ttl: float = 10.0
    """Seconds a dead replica's partitions stay held; with `ConsumerSpec.ack_wait` this
    bounds how long its work in flight waits for another replica (or its restart)."""
    replicas: int = 1
    event_max_age: float = 7 * 24 * 3600.0
    extra_buckets: tuple[BucketSpec, ...] = field(default_factory=tuple)

    @property
    def events_stream(self) -> StreamSpec:
        return StreamSpec(
            name=f"{self.prefix.upper()}_EVENTS",
            subjects=(f"{self.prefix}.events.>",),
            max_age=self.event_max_age,
            replicas=self.replicas,
        )

    @property
    def dead_letter_stream(self) -> StreamSpec:
        return StreamSpec(
            name=f"{self.prefix.upper()}_DLQ",
            subjects=(f"{self.prefix}.dlq.>",),
            max_age=30 * 24 * 3600.0,
            replicas=self.replicas,
        )

    @property
    def leases_bucket(self) -> BucketSpec:
        return BucketSpec(name=f"{self.prefix}-leases", ttl=self.lease_ttl, replicas=self.replicas)

    def bucket(self, name: str) -> BucketSpec:
        """The declared bucket `name` (see `BUCKETS`) of this installation."""
        for declared in BUCKETS:
            if declared.name == name:
                return BucketSpec(
                    name=f"{self.prefix}-{name}", history=declared.history, replicas=self.replicas
                )
        raise KeyError(f"no bucket {name!r} is declared")

    def service_buckets(self, service: str) -> tuple[BucketSpec, ...]:
        return tuple(self.bucket(d.name) for d in BUCKETS if d.service == service)

    @property
    def placements_bucket(self) -> BucketSpec:
        """Durable placement record per object, updated by compare-and-set."""
        return self.bucket("placements")

    @property
    def positions_bucket(self) -> BucketSpec:
        """Watch resume positions (resourceVersions) per watched type."""
        return self.bucket("positions")

    @property
    def streams(self) -> tuple[StreamSpec, ...]:
        return (self.events_stream, self.dead_letter_stream)

    @property
    def buckets(self) -> tuple[BucketSpec, ...]:
        return (
            self.leases_bucket,
            *(self.bucket(declared.name) for declared in BUCKETS),
            *self.extra_buckets,
        )

    def event_subject(self, event_type: str, key: str) -> str:
        return f"{self.prefix}.events.{event_type}.{partition_of(key, self.partitions)}"

    def dead_letter_subject(self, event_type: str) -> str:
        return f"{self.prefix}.dlq.{event_type}"

    def partition_subjects(self, consumer: ConsumerSpec, partition: int) -> list[str]:
        return [f"{self.prefix}.events.{t}.{partition}" for t in consumer.event_types]
