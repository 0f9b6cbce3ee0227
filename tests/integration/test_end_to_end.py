"""The built services end to end: the hub, member clusters, NATS, Redis and every
service as a real process (`fleet.running_fleet`)."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.common import events

from .fleet import Fleet, fleet_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

NS = "shop"


fleet = fleet_fixture()
"""The end-to-end fleet: the default three members, every service."""


def web(replicas: int) -> dict[str, Any]:
    container = {
        "name": "web",
        "image": "nginx:1.27",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container]},
            },
        },
    }


async def test_a_deployment_created_on_the_hub_is_placed_over_the_members(fleet: Fleet) -> None:
    await fleet.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await fleet.create(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "ClusterPlacementPolicy",
            "metadata": {"name": "web"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]},
        }
    )
    await fleet.create(web(replicas=9))

    key = events.ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace=NS).key
    decided = await fleet.wait_for("PlacementDecided", key)
    payload = decided.payload
    assert isinstance(payload, events.PlacementDecided)
    placed = {p.cluster: p.replicas for p in payload.clusters}
    assert placed == {"us-east": 3, "us-west": 3, "eu-central": 3}, payload
    assert decided.traceparent, "the decision carries the trace of the hub change"
    observed = fleet.of("ResourceObserved", key)[0]
    assert observed.traceparent is not None and decided.traceparent is not None
    assert observed.traceparent.split("-")[1] == decided.traceparent.split("-")[1], (
        "one trace from the hub change to the decision"
    )
