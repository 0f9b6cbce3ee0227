"""Rendering throughput of the transformer's pure core (no bus, no hub).

Renders N realistic Deployments (two containers, env, probes, volumes, a
hub-only annotation, status) each placed on C clusters, through the whole sync
pipeline: replicas, stripping, two Transformations (a strategic patch targeted by
label selector and a JSON patch targeted by name), origin labels, namespace
mapping and security defaults on half of the clusters. Prints one JSON object:

    .venv/bin/python bench/transformer.py [--objects 2000] [--clusters 3]

"objects_per_s" counts placed objects (each rendered on every cluster of its
decision); "works_per_s" counts the manifests. On a shared machine the wall clock
depends on the neighbours: "objects_per_cpu_s" is the figure per CPU second.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from flotilla.common.api import PlacementState, Strategy, TransformationSpec
from flotilla.common.events import ClusterPlacement, ObjectRef, PlacementDecided, ResourceAnalyzed
from flotilla.common.interpreters import Registry
from flotilla.transformer import rendering, steps
from flotilla.transformer.steps import ClusterFacts
from flotilla.transformer.transformations import CLUSTER_TRANSFORMATION, NamedTransformation

REGISTRY = Registry.with_builtins()


def deployment(index: int) -> dict[str, Any]:
    app = {
        "name": "app",
        "image": f"registry.example.com/app:{index % 7}",
        "env": [{"name": f"VAR{i}", "value": str(i)} for i in range(8)],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
    }
    sidecar = {"name": "proxy", "image": "envoy:1.30", "ports": [{"containerPort": 15001}]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"web-{index}",
            "namespace": "shop",
            "uid": f"uid-{index}",
            "resourceVersion": str(index),
            "generation": 3,
            "labels": {"app": f"web-{index}", "tier": "frontend"},
            "annotations": {"flotilla.io/placement": "{}", "team": "shop"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {
            "replicas": 9,
            "selector": {"matchLabels": {"app": f"web-{index}"}},
            "template": {
                "metadata": {"labels": {"app": f"web-{index}"}},
                "spec": {
                    "serviceAccountName": "runner",
                    "containers": [app, sidecar],
                    "volumes": [{"name": "config", "configMap": {"name": "settings"}}],
                },
            },
        },
        "status": {"replicas": 9, "readyReplicas": 9},
    }


CHOSEN = (
    NamedTransformation(
        CLUSTER_TRANSFORMATION,
        "bench",
        TransformationSpec.model_validate(
            {
                "transformations": [
                    {
                        "targetSelector": {"matchLabels": {"region": "eu"}},
                        "patchType": "strategic",
                        "patch": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "containers": [
                                            {
                                                "name": "app",
                                                "env": [{"name": "VAR1", "value": "eu"}],
                                            }
                                        ]
                                    }
                                }
                            }
                        },
                    },
                    {
                        "targetClusters": ["c0"],
                        "patchType": "json",
                        "patch": [
                            {
                                "op": "replace",
                                "path": "/spec/template/spec/containers/1/image",
                                "value": "mirror/envoy:1.30",
                            }
                        ],
                    },
                ]
            }
        ),
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--clusters", type=int, default=3)
    args = parser.parse_args()
    names = [f"c{i}" for i in range(args.clusters)]
    clusters = {
        name: ClusterFacts(
            name,
            {
                "region": "eu" if i % 2 else "us",
                steps.SECURITY_DEFAULTS_LABEL: "restricted" if i % 2 else "",
                steps.NAMESPACE_PREFIX_LABEL: "eu-" if i % 2 else "",
            },
        )
        for i, name in enumerate(names)
    }
    interpreter = REGISTRY.lookup(REGISTRY.for_object(deployment(0)).gvk).spec
    inputs = []
    for index in range(args.objects):
        obj = deployment(index)
        ref = ObjectRef.of(obj)
        analyzed = ResourceAnalyzed(
            ref=ref, object=obj, strategy=Strategy.SPLIT, replicas=9, interpreter=interpreter
        )
        decision = PlacementDecided(
            ref=ref,
            decision_id=f"d-{index}",
            clusters=[
                ClusterPlacement(cluster=n, replicas=9 // len(names), state=PlacementState.ACTIVE)
                for n in names
            ],
        )
        inputs.append((analyzed, decision))
    started, cpu = time.perf_counter(), time.process_time()
    works = 0
    for analyzed, decision in inputs:
        rendered, failed = rendering.render_placement(analyzed, decision, clusters, CHOSEN)
        assert not failed, failed
        works += len(rendered)
        for work in rendered:
            work.digest  # noqa: B018 - the event id digest is part of every work's cost
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        json.dumps(
            {
                "objects": args.objects,
                "clusters": args.clusters,
                "seconds": round(elapsed, 3),
                "objects_per_s": round(args.objects / elapsed, 1),
                "works_per_s": round(works / elapsed, 1),
                "cpu_seconds": round(cpu, 3),
                "objects_per_cpu_s": round(args.objects / cpu, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
