"""Builders for the syncer's tests: rendered manifests and the works carrying them."""

from __future__ import annotations

from typing import Any

from flotilla.common import builders, events
from flotilla.common.events import ObjectRef, WorkRendered

JsonObject = dict[str, Any]


def deployment(name: str = "web", namespace: str = "shop", *, replicas: int = 3) -> JsonObject:
    return builders.rendered(
        builders.deployment(
            name, namespace, replicas=replicas, requests={"cpu": "100m", "memory": "64Mi"}
        )
    )


def config_map(name: str = "settings", namespace: str = "shop") -> JsonObject:
    return builders.rendered(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"mode": "production"},
        }
    )


def work(
    manifest: JsonObject | None,
    cluster: str,
    *,
    ref: ObjectRef | None = None,
    decision: str = "d1",
    dependency_of: list[ObjectRef] | None = None,
    seq: int = 0,
) -> events.Envelope:
    """The `WorkRendered` event the transformer would publish for `manifest` (None:
    remove `ref` from `cluster`)."""
    if ref is None:
        assert manifest is not None
        ref = ObjectRef.of(manifest)
    payload = WorkRendered(
        ref=ref,
        cluster=cluster,
        decision_id=decision,
        manifest=manifest,
        dependency_of=dependency_of or [],
    )
    return events.envelope(
        payload, key=events.work_key(ref, cluster), producer="test", dedupe=(decision, seq)
    )
