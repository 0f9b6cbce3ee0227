"""Server-side printing: the Tables kubectl asks for, for built-in kinds and CRDs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla.common.testing import eventually
from flotilla.kubesim import tables
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import auth_session

from . import builders

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (5, "5s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (40 * 86400, "40d"),
    ],
)
def test_human_age(seconds: int, shown: str) -> None:
    now = datetime(2026, 1, 10, tzinfo=UTC)
    stamp = (now - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert tables.human_age(stamp, now) == shown


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".spec.replicas", [3]),
        ('.status.conditions[?(@.type=="Ready")].status', ["True"]),
        (".status.conditions[0].type", ["Ready"]),
        (".status.conditions[*].type", ["Ready", "Synced"]),
        (".spec.missing", []),
    ],
)
def test_json_path(path: str, expected: list[Any]) -> None:
    obj = {
        "spec": {"replicas": 3},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Synced", "status": "False"},
            ]
        },
    }
    assert tables.json_path(obj, path) == expected


@pytest.mark.parametrize(
    ("accept", "wanted"),
    [
        (TABLE, True),
        ("application/json", False),
        ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", False),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", False),
    ],
)
def test_table_only_when_asked_first(accept: str, wanted: bool) -> None:
    assert tables.media_wants_table(accept) is wanted


async def test_pods_and_deployments_print_their_columns(kubesim_factory: Any) -> None:
    member: KubeSim = await kubesim_factory("m", sim=SimOptions(nodes=1, pod_ready_seconds=0.05))
    async with auth_session(member, base_url=member.url) as http:
        created = await http.post(
            "/apis/apps/v1/namespaces/default/deployments", json=builders.deployment("web", 2)
        )
        assert created.status == 201

        async def ready() -> dict[str, Any] | None:
            async with http.get(
                "/apis/apps/v1/namespaces/default/deployments/web", headers={"Accept": TABLE}
            ) as response:
                body: dict[str, Any] = await response.json()
            return body if body["rows"][0]["cells"][1] == "2/2" else None

        table = await eventually(ready, what="web 2/2 in the table")
        names = [c["name"] for c in table["columnDefinitions"]]
        assert names[:5] == ["Name", "Ready", "Up-to-date", "Available", "Age"]
        assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
        async with http.get(
            "/api/v1/namespaces/default/pods", headers={"Accept": TABLE}
        ) as response:
            pods = await response.json()
        assert pods["kind"] == "Table"
        assert [row["cells"][1:3] for row in pods["rows"]] == [["1/1", "Running"]] * 2
        wide = {c["name"]: c["priority"] for c in pods["columnDefinitions"]}
        assert wide["Node"] == 1 and wide["Status"] == 0


async def test_crd_printer_columns_and_table_watch(hub: KubeSim) -> None:
    crd = builders.crd(
        "example.com",
        "Widget",
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        categories=["toys"],
        printer_columns=[
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
            {"name": "Color", "type": "string", "jsonPath": ".spec.color", "priority": 1},
        ],
    )
    widgets = "/apis/example.com/v1/namespaces/default/widgets"
    async with auth_session(hub, base_url=hub.url) as http:
        assert (
            await http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        ).status == 201
        async with http.get("/apis/example.com/v1") as response:
            discovery = await response.json()
        assert discovery["resources"][0]["categories"] == ["toys"]
        watch = await http.get(f"{widgets}?watch=true&timeoutSeconds=5", headers={"Accept": TABLE})
        body = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 3, "color": "red"},
        }
        assert (await http.post(widgets, json=body)).status == 201
        assert (await http.post(widgets, json={**body, "metadata": {"name": "v"}})).status == 201
        first = json.loads(await watch.content.readline())
        second = json.loads(await watch.content.readline())
        watch.close()
        async with http.get(widgets, headers={"Accept": TABLE}) as response:
            table = await response.json()
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", 0),
        ("Size", 0),
        ("Color", 1),
    ]
    assert [row["cells"] for row in table["rows"]] == [["v", 3, "red"], ["w", 3, "red"]]
    assert first["type"] == "ADDED" and first["object"]["kind"] == "Table"
    assert len(first["object"]["columnDefinitions"]) == 3
    assert second["object"]["columnDefinitions"] == []
    assert second["object"]["rows"][0]["cells"][0] == "v"
