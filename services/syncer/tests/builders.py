"""Builders for the syncer's tests: rendered manifests and the works carrying them."""

from __future__ import annotations

import copy
from typing import Any

from flotilla.common import events
from flotilla.common.events import ObjectRef, WorkRendered
from flotilla.syncer.observation import (
    DECISION_ANNOTATION,
    HUB_GENERATION_ANNOTATION,
    ORIGIN_ANNOTATION,
    ORIGIN_LABEL,
)

JsonObject = dict[str, Any]


def marked(obj: JsonObject, *, decision: str = "d1", hub_generation: int = 1) -> JsonObject:
    """`obj` as the transformer renders it: origin label and annotations set."""
    ref = ObjectRef.of(obj)
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    meta.setdefault("labels", {})[ORIGIN_LABEL] = f"{ref.kind.lower()}-{ref.name}"
    meta.setdefault("annotations", {}).update(
        {
            ORIGIN_ANNOTATION: ref.key,
            DECISION_ANNOTATION: decision,
            HUB_GENERATION_ANNOTATION: str(hub_generation),
        }
    )
    return out


def deployment(
    name: str = "web", namespace: str = "shop", *, replicas: int = 3, image: str = "nginx:1.27"
) -> JsonObject:
    return marked(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "containers": [
                            {
                                "name": "web",
                                "image": image,
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                            }
                        ]
                    },
                },
            },
        }
    )


def config_map(name: str = "settings", namespace: str = "shop") -> JsonObject:
    return marked(
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
