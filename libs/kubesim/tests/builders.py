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


def crd(
    group: str,
    kind: str,
    schema: dict[str, Any],
    *,
    printer_columns: list[dict[str, Any]] | None = None,
    categories: list[str] | None = None,
) -> dict[str, Any]:
    """A namespaced single-version (v1) CustomResourceDefinition; plural = kind + "s"."""
    plural = f"{kind.lower()}s"
    names: dict[str, Any] = {"plural": plural, "kind": kind}
    if categories:
        names["categories"] = categories
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if printer_columns:
        version["additionalPrinterColumns"] = printer_columns
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": names, "versions": [version]},
    }
