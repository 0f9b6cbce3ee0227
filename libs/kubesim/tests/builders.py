"""Builders for the manifests kubesim's API tests send."""

from __future__ import annotations

from typing import Any


def container(name: str = "main", image: str = "nginx:1", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **fields}


def deployment(
    name: str = "web",
    replicas: int = 1,
    *,
    containers: list[dict[str, Any]] | None = None,
    **pod_spec: Any,
) -> dict[str, Any]:
    """An apps/v1 Deployment in `default` whose pods carry the label app=<name>."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": containers or [container()], **pod_spec},
            },
        },
    }
