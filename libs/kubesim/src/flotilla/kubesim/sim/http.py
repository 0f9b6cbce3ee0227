"""`/sim/v1/nodes`: fault injection on the simulated nodes over HTTP.

The server mounts these routes behind its bearer-token check. One POST names an
action and the nodes it applies to:

    {"action": "add", "count": 2, "cpu": "8", "memory": "32Gi", "pods": 110, "gpus": 0,
     "labels": {...}, "taints": [...], "names": [...]}        names/count: either
    {"action": "remove" | "cordon" | "uncordon" | "zero-capacity" | "restore-capacity"
               | "not-ready" | "ready",
     "names": [...]}

and gets back `{"action": ..., "nodes": [...affected names]}`. `GET /sim/v1/nodes`
lists each node's allocatable, requested and pod count, for a test or a person to
see why a pod is Pending. Errors are Kubernetes `Status` bodies.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from flotilla.common import quantity
from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.sim.nodes import NodeShape

if TYPE_CHECKING:
    from flotilla.kubesim.sim.simulator import Simulator

ACTIONS = (
    "add",
    "remove",
    "cordon",
    "uncordon",
    "zero-capacity",
    "restore-capacity",
    "not-ready",
    "ready",
)
MAX_NEW_NODES = 5000


def _bad(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _names(body: dict[str, Any], required: bool) -> list[str]:
    names = body.get("names")
    if names is None:
        if required:
            raise _bad('"names" (a list of node names) is required for this action')
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise _bad('"names" must be a list of node names')
    return list(names)


def _shape(body: dict[str, Any], default: NodeShape) -> NodeShape:
    labels = body.get("labels", default.labels)
    taints = body.get("taints", default.taints)
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise _bad('"labels" must map strings to strings')
    if not isinstance(taints, list) or not all(
        isinstance(t, dict) and t.get("key") and t.get("effect") for t in taints
    ):
        raise _bad('"taints" must be a list of {key, value?, effect}')
    try:
        shape = NodeShape(
            cpu=str(body.get("cpu", default.cpu)),
            memory=str(body.get("memory", default.memory)),
            pods=int(body.get("pods", default.pods)),
            gpus=int(body.get("gpus", default.gpus)),
            labels=dict(labels),
            taints=list(taints),
        )
        shape.capacity()
    except (ValueError, TypeError, quantity.QuantityError) as exc:
        raise _bad(f"invalid node shape: {exc}") from exc
    return shape


def apply(sim: Simulator, body: Any) -> dict[str, Any]:
    """Run one node action; raises `ApiError` for a bad request or an unknown node."""
    if not isinstance(body, dict):
        raise _bad("body must be a JSON object")
    action = body.get("action")
    if action not in ACTIONS:
        raise _bad(f'"action" must be one of {", ".join(ACTIONS)}')
    if action == "add":
        names = _names(body, required=False)
        count = body.get("count", 1 if not names else len(names))
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_NEW_NODES:
            raise _bad(f'"count" must be an integer between 1 and {MAX_NEW_NODES}')
        affected = sim.add_nodes(count, _shape(body, sim.default_shape), names or None)
    else:
        names = _names(body, required=True)
        for name in names:
            if name not in sim.state.nodes:
                raise ApiError(
                    404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"}
                )
        if action == "remove":
            affected = sim.remove_nodes(names)
        elif action in ("cordon", "uncordon"):
            affected = sim.cordon_nodes(names, action == "cordon")
        elif action in ("not-ready", "ready"):
            affected = sim.set_nodes_ready(names, action == "ready")
        else:
            affected = sim.zero_capacity(names, action == "zero-capacity")
    return {"kind": "SimNodesResult", "action": action, "nodes": affected}


def describe(sim: Simulator) -> dict[str, Any]:
    items = []
    for name in sorted(sim.state.nodes):
        node = sim.state.nodes[name]
        items.append(
            {
                "name": name,
                "ready": name not in sim.unreachable,
                "unschedulable": node.unschedulable,
                "taints": node.taints,
                "allocatable": dict(node.allocatable),
                "requested": {k: v for k, v in node.requested.items() if v},
                "pods": len(sim.state.pods_by_node.get(name, ())),
            }
        )
    return {"kind": "SimNodeList", "items": items}


def routes(sim: Simulator) -> list[web.RouteDef]:
    async def post_nodes(request: web.Request) -> web.Response:
        try:
            try:
                body = json.loads(await request.read() or b"{}")
            except ValueError as exc:
                raise _bad(f"body is not valid JSON: {exc}") from exc
            return web.json_response(apply(sim, body))
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    async def get_nodes(request: web.Request) -> web.Response:
        return web.json_response(describe(sim))

    return [web.post("/sim/v1/nodes", post_nodes), web.get("/sim/v1/nodes", get_nodes)]
