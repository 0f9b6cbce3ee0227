"""Paginated lists are one consistent snapshot; resourceVersion(Match) on lists."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.kubesim import pagination
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.store import Store
from flotilla.kubesim.testing import http_session

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


async def _call(hub: KubeSim, method: str, path: str, body: Any = None, **params: str) -> Any:
    async with (
        http_session(hub) as http,
        http.request(
            method,
            f"{hub.url}{path}",
            json=body,
            params=params,
            headers={"Authorization": f"Bearer {hub.token}"},
        ) as resp,
    ):
        return resp.status, await resp.json()


async def _configmap(hub: KubeSim, name: str, value: str = "1") -> dict[str, Any]:
    status, body = await _call(
        hub, "POST", CONFIGMAPS, {"metadata": {"name": name}, "data": {"v": value}}
    )
    assert status == 201, body
    return dict(body)


def _names(page: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in page["items"]]


async def test_later_pages_read_the_first_pages_snapshot(hub: KubeSim) -> None:
    for name in ("c1", "c2", "c3", "c4", "c5"):
        await _configmap(hub, name)
    status, first = await _call(hub, "GET", CONFIGMAPS, limit="2")
    assert status == 200
    assert _names(first) == ["c1", "c2"]
    assert first["metadata"]["remainingItemCount"] == 3
    snapshot_rv = first["metadata"]["resourceVersion"]

    await _configmap(hub, "c0")  # sorts before the token's key: never shown anyway
    await _configmap(hub, "c9")  # created after the snapshot
    assert (await _call(hub, "DELETE", f"{CONFIGMAPS}/c3"))[0] == 200
    _, c4 = await _call(hub, "GET", f"{CONFIGMAPS}/c4")
    c4["data"] = {"v": "changed"}
    assert (await _call(hub, "PUT", f"{CONFIGMAPS}/c4", c4))[0] == 200

    status, second = await _call(
        hub, "GET", CONFIGMAPS, limit="2", **{"continue": first["metadata"]["continue"]}
    )
    assert status == 200, second
    assert _names(second) == ["c3", "c4"]
    assert second["items"][1]["data"] == {"v": "1"}
    assert second["metadata"]["resourceVersion"] == snapshot_rv
    assert second["metadata"]["remainingItemCount"] == 1
    status, third = await _call(
        hub, "GET", CONFIGMAPS, limit="2", **{"continue": second["metadata"]["continue"]}
    )
    assert _names(third) == ["c5"]
    assert "continue" not in third["metadata"]

    _, now = await _call(hub, "GET", CONFIGMAPS)
    assert _names(now) == ["c0", "c1", "c2", "c4", "c5", "c9"]


async def test_an_expired_token_is_410_with_a_fresh_one(hub: KubeSim) -> None:
    for name in ("a", "b", "c"):
        await _configmap(hub, name)
    _, first = await _call(hub, "GET", CONFIGMAPS, limit="1")
    # The hub keeps 50 changes per type; 60 more push the snapshot out of reach.
    for i in range(60):
        await _configmap(hub, f"later-{i:02d}")
    status, expired = await _call(
        hub, "GET", CONFIGMAPS, limit="2", **{"continue": first["metadata"]["continue"]}
    )
    assert status == 410
    assert expired["reason"] == "Expired"
    assert expired["message"] == pagination.EXPIRED_CONTINUE
    fresh = expired["metadata"]["continue"]
    status, resumed = await _call(hub, "GET", CONFIGMAPS, limit="2", **{"continue": fresh})
    assert status == 200, resumed
    assert _names(resumed) == ["b", "c"]  # goes on after "a", at the current state
    assert int(resumed["metadata"]["resourceVersion"]) == hub.store.resource_version


async def test_exact_resource_version_reads_a_snapshot(hub: KubeSim) -> None:
    old = await _configmap(hub, "x", "old")
    rv = old["metadata"]["resourceVersion"]
    old["data"] = {"v": "new"}
    await _call(hub, "PUT", f"{CONFIGMAPS}/x", old)
    await _configmap(hub, "y")
    status, exact = await _call(
        hub, "GET", CONFIGMAPS, resourceVersion=rv, resourceVersionMatch="Exact"
    )
    assert status == 200, exact
    assert _names(exact) == ["x"]
    assert exact["items"][0]["data"] == {"v": "old"}
    assert exact["metadata"]["resourceVersion"] == rv
    status, latest = await _call(
        hub, "GET", CONFIGMAPS, resourceVersion=rv, resourceVersionMatch="NotOlderThan"
    )
    assert status == 200
    assert _names(latest) == ["x", "y"]
    assert latest["items"][0]["data"] == {"v": "new"}


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"resourceVersionMatch": "Exact"}, 400),
        ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, 400),
        ({"resourceVersion": "1", "resourceVersionMatch": "Sometime"}, 400),
        ({"resourceVersion": "999999"}, 504),
        ({"resourceVersion": "999999", "resourceVersionMatch": "Exact"}, 504),
        ({"resourceVersion": "1", "resourceVersionMatch": "Exact"}, 410),
        ({"resourceVersion": "5", "continue": pagination.encode_continue(5, ("", "a"))}, 400),
    ],
    ids=[
        "match-without-version",
        "exact-zero",
        "unknown-match",
        "too-large",
        "exact-too-large",
        "exact-too-old",
        "version-with-continue",
    ],
)
async def test_list_option_errors(hub: KubeSim, params: dict[str, str], code: int) -> None:
    for i in range(60):  # past the hub's 50-change window, so rv 1 is out of reach
        await _configmap(hub, f"cm-{i:02d}")
    status, body = await _call(hub, "GET", CONFIGMAPS, **params)
    assert status == code, body
    assert body["kind"] == "Status"


def test_store_rebuilds_any_past_state_its_history_covers() -> None:
    store = Store(watch_window=100)
    rt = store.resource_type("v1", "ConfigMap")
    ns_rt = store.resource_type("v1", "Namespace")
    store.create(ns_rt, {"metadata": {"name": "other"}})
    store.create(rt, {"metadata": {"name": "keep", "namespace": "other"}, "data": {"v": "1"}})
    gone = store.create(rt, {"metadata": {"name": "gone", "namespace": "default"}})
    at = store.resource_version
    store.delete(rt, "default", "gone")
    store.create(rt, {"metadata": {"name": "new", "namespace": "default"}})
    keep = store.get(rt, "other", "keep")
    keep["data"] = {"v": "2"}
    store.update(rt, keep)

    past, rv = store.list_frozen(rt, at=at)
    assert rv == at
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in past] == [
        ("default", "gone"),
        ("other", "keep"),
    ]
    assert past[0]["metadata"]["uid"] == gone["metadata"]["uid"]
    assert past[1]["data"] == {"v": "1"}
    assert [o["metadata"]["name"] for o in store.list_frozen(rt, "other", at=at)[0]] == ["keep"]
    now, _ = store.list_frozen(rt)
    assert [o["metadata"]["name"] for o in now] == ["new", "keep"]
