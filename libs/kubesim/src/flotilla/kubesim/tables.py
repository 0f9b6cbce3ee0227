"""Server-side printing: `meta.k8s.io/v1` Tables for `kubectl get`.

kubectl asks every list, get and watch for `application/json;as=Table;g=meta.k8s.io;v=v1`
and prints whatever columns the server sends, so the columns users know (pods'
READY/STATUS/RESTARTS, deployments' UP-TO-DATE/AVAILABLE, a CRD's
`additionalPrinterColumns`) come from here. One small function per kind, registered in
`PRINTERS`; any other kind gets NAME and AGE, like upstream's default table convertor.
Columns with `priority: 1` are the ones `-o wide` adds.

Cells follow upstream's printers (`pkg/printers/internalversion/printers.go`) for the
common cases only: no pod readiness gates, no init-container progress in STATUS, no
per-container restart times.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flotilla.kubesim.resources import ResourceType

Obj = Mapping[str, Any]
Column = tuple[str, str, int]  # name, type, priority
Row = list[Any]

_NAME: Column = ("Name", "string", 0)
_AGE: Column = ("Age", "date", 0)
NONE = "<none>"


def media_wants_table(accept: str) -> bool:
    """True when `Accept` names a meta.k8s.io/v1 Table before any plain JSON."""
    for part in accept.split(","):
        params = {
            k.strip(): v.strip() for k, _, v in (p.partition("=") for p in part.split(";")[1:])
        }
        if params.get("as") == "Table" and params.get("v") == "v1":
            return params.get("g") == "meta.k8s.io"
        if part.split(";")[0].strip() in ("application/json", "*/*"):
            return False
    return False


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """`5s`, `3m12s`, `4h`, `2d5h`: upstream's `duration.HumanDuration`."""
    if not timestamp:
        return NONE
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return NONE
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    return f"{years}y{days % 365}d" if years < 8 and days % 365 else f"{years}y"


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _age(obj: Obj) -> str:
    return human_age(_meta(obj).get("creationTimestamp"))


def _containers(template_spec: Obj) -> tuple[str, str]:
    containers = template_spec.get("containers") or []
    names = ",".join(str(c.get("name", "")) for c in containers)
    images = ",".join(str(c.get("image", "")) for c in containers)
    return names or NONE, images or NONE


def _selector(selector: Obj | None) -> str:
    if not selector:
        return NONE
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        values = ",".join(expr.get("values") or [])
        op = str(expr.get("operator", "")).lower()
        key = expr.get("key", "")
        parts.append(
            f"{key} {op} ({values})" if values else f"{'!' if op == 'doesnotexist' else ''}{key}"
        )
    return ",".join(parts) or NONE


def _pod_template(obj: Obj) -> tuple[str, str, str]:
    spec = _spec(obj)
    names, images = _containers(_spec(spec.get("template") or {}))
    return names, images, _selector(spec.get("selector"))


def _pod_status(pod: Obj) -> str:
    status = _status(pod)
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for container in reversed(status.get("containerStatuses") or []):
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            reason = f"ExitCode:{terminated.get('exitCode', 0)}"
    if _meta(pod).get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod(pod: Obj) -> Row:
    status = _status(pod)
    statuses = status.get("containerStatuses") or []
    total = len(_spec(pod).get("containers") or [])
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [
        f"{ready}/{total}",
        _pod_status(pod),
        str(restarts),
        _age(pod),
        status.get("podIP") or NONE,
        _spec(pod).get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        NONE,
    ]


def _node(node: Obj) -> Row:
    conditions = {c.get("type"): c.get("status") for c in _status(node).get("conditions") or []}
    state = {"True": "Ready", "False": "NotReady"}.get(str(conditions.get("Ready")), "Unknown")
    if _spec(node).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.split("/", 1)[1]
        for key in (_meta(node).get("labels") or {})
        if key.startswith("node-role.kubernetes.io/")
    )
    addresses = {a.get("type"): a.get("address") for a in _status(node).get("addresses") or []}
    info = _status(node).get("nodeInfo") or {}
    return [
        state,
        ",".join(roles) or NONE,
        _age(node),
        info.get("kubeletVersion") or "",
        addresses.get("InternalIP") or NONE,
        addresses.get("ExternalIP") or NONE,
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _deployment(obj: Obj) -> Row:
    spec, status = _spec(obj), _status(obj)
    return [
        f"{status.get('readyReplicas') or 0}/{spec.get('replicas') or 0}",
        status.get("updatedReplicas") or 0,
        status.get("availableReplicas") or 0,
        _age(obj),
        *_pod_template(obj),
    ]


def _replicaset(obj: Obj) -> Row:
    spec, status = _spec(obj), _status(obj)
    return [
        spec.get("replicas") or 0,
        status.get("replicas") or 0,
        status.get("readyReplicas") or 0,
        _age(obj),
        *_pod_template(obj),
    ]


def _statefulset(obj: Obj) -> Row:
    names, images, _ = _pod_template(obj)
    return [
        f"{_status(obj).get('readyReplicas') or 0}/{_spec(obj).get('replicas') or 0}",
        _age(obj),
        names,
        images,
    ]


def _daemonset(obj: Obj) -> Row:
    status = _status(obj)
    node_selector = _spec(_spec(_spec(obj).get("template") or {})).get("nodeSelector") or {}
    return [
        status.get("desiredNumberScheduled") or 0,
        status.get("currentNumberScheduled") or 0,
        status.get("numberReady") or 0,
        status.get("updatedNumberScheduled") or 0,
        status.get("numberAvailable") or 0,
        ",".join(f"{k}={v}" for k, v in node_selector.items()) or NONE,
        _age(obj),
        *_pod_template(obj),
    ]


def _job_state(obj: Obj) -> str:
    conditions = {c.get("type"): c.get("status") for c in _status(obj).get("conditions") or []}
    for kind in ("Complete", "Failed", "Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if conditions.get(kind) == "True":
            return kind
    return "Running"


def _duration(start: str | None, end: str | None) -> str:
    """How long a Job ran (until now while it runs)."""
    if not start:
        return ""
    if not end:
        return human_age(start)
    try:
        finished = datetime.strptime(end, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return ""
    return human_age(start, finished)


def _job(obj: Obj) -> Row:
    spec, status = _spec(obj), _status(obj)
    completions = spec.get("completions")
    shown = (
        f"{status.get('succeeded') or 0}/{completions}"
        if completions is not None
        else (f"{status.get('succeeded') or 0}/1 of {spec.get('parallelism') or 1}")
    )
    return [
        _job_state(obj),
        shown,
        _duration(status.get("startTime"), status.get("completionTime")),
        _age(obj),
        *_pod_template(obj),
    ]


def _cronjob(obj: Obj) -> Row:
    spec, status = _spec(obj), _status(obj)
    return [
        spec.get("schedule") or "",
        spec.get("timeZone") or NONE,
        "True" if spec.get("suspend") else "False",
        len(status.get("active") or []),
        human_age(status.get("lastScheduleTime")),
        _age(obj),
    ]


def _service(obj: Obj) -> Row:
    spec = _spec(obj)
    ports = []
    for port in spec.get("ports") or []:
        text = f"{port.get('port')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        ports.append(f"{text}/{port.get('protocol') or 'TCP'}")
    ingress = (_status(obj).get("loadBalancer") or {}).get("ingress") or []
    external = ",".join(i.get("ip") or i.get("hostname") or "" for i in ingress)
    if not external:
        external = "<pending>" if spec.get("type") == "LoadBalancer" else NONE
    selector = spec.get("selector") or {}
    return [
        spec.get("type") or "ClusterIP",
        spec.get("clusterIP") or NONE,
        ",".join(spec.get("externalIPs") or []) or external,
        ",".join(ports) or NONE,
        _age(obj),
        ",".join(f"{k}={v}" for k, v in selector.items()) or NONE,
    ]


def _namespace(obj: Obj) -> Row:
    return [_status(obj).get("phase") or "Active", _age(obj)]


def _configmap(obj: Obj) -> Row:
    return [len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), _age(obj)]


def _secret(obj: Obj) -> Row:
    return [obj.get("type") or "Opaque", len(obj.get("data") or {}), _age(obj)]


def _serviceaccount(obj: Obj) -> Row:
    return [len(obj.get("secrets") or []), _age(obj)]


def _event(obj: Obj) -> Row:
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    last = (
        obj.get("lastTimestamp")
        or (obj.get("series") or {}).get("lastObservedTime")
        or obj.get("eventTime")
        or _meta(obj).get("creationTimestamp")
    )
    return [
        human_age(str(last)[:19] + "Z" if last else None),
        obj.get("type") or "",
        obj.get("reason") or "",
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        obj.get("message") or obj.get("note") or "",
    ]


def _lease(obj: Obj) -> Row:
    return [_spec(obj).get("holderIdentity") or "", _age(obj)]


def _crd(obj: Obj) -> Row:
    return [_meta(obj).get("creationTimestamp") or ""]


_TEMPLATE_WIDE: list[Column] = [
    ("Containers", "string", 1),
    ("Images", "string", 1),
    ("Selector", "string", 1),
]

_EVENT_COLUMNS: list[Column] = [
    ("Last Seen", "string", 0),
    ("Type", "string", 0),
    ("Reason", "string", 0),
    ("Object", "string", 0),
    ("Message", "string", 0),
]

Printer = tuple[list[Column], Callable[[Obj], Row]]
PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "Pod"): (
        [
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            _AGE,
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        _pod,
    ),
    ("", "Node"): (
        [
            ("Status", "string", 0),
            ("Roles", "string", 0),
            _AGE,
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        _node,
    ),
    ("apps", "Deployment"): (
        [
            ("Ready", "string", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            _AGE,
            *_TEMPLATE_WIDE,
        ],
        _deployment,
    ),
    ("apps", "ReplicaSet"): (
        [
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            _AGE,
            *_TEMPLATE_WIDE,
        ],
        _replicaset,
    ),
    ("apps", "StatefulSet"): (
        [("Ready", "string", 0), _AGE, ("Containers", "string", 1), ("Images", "string", 1)],
        _statefulset,
    ),
    ("apps", "DaemonSet"): (
        [
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Node Selector", "string", 0),
            _AGE,
            *_TEMPLATE_WIDE,
        ],
        _daemonset,
    ),
    ("batch", "Job"): (
        [
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            _AGE,
            *_TEMPLATE_WIDE,
        ],
        _job,
    ),
    ("batch", "CronJob"): (
        [
            ("Schedule", "string", 0),
            ("Timezone", "string", 0),
            ("Suspend", "boolean", 0),
            ("Active", "integer", 0),
            ("Last Schedule", "string", 0),
            _AGE,
        ],
        _cronjob,
    ),
    ("", "Service"): (
        [
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            _AGE,
            ("Selector", "string", 1),
        ],
        _service,
    ),
    ("", "Namespace"): ([("Status", "string", 0), _AGE], _namespace),
    ("", "ConfigMap"): ([("Data", "integer", 0), _AGE], _configmap),
    ("", "Secret"): ([("Type", "string", 0), ("Data", "integer", 0), _AGE], _secret),
    ("", "ServiceAccount"): ([("Secrets", "integer", 0), _AGE], _serviceaccount),
    ("", "Event"): (
        _EVENT_COLUMNS,
        _event,
    ),
    ("events.k8s.io", "Event"): (
        _EVENT_COLUMNS,
        _event,
    ),
    ("coordination.k8s.io", "Lease"): ([("Holder", "string", 0), _AGE], _lease),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): (
        [("Created At", "date", 0)],
        _crd,
    ),
}


# -- JSONPath for additionalPrinterColumns ------------------------------------------------

_STEP = re.compile(
    r"\.([A-Za-z0-9_\-]+)|\[(\d+|\*)\]|\[\?\(@\.([\w.\-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]"
)


def json_path(obj: Any, path: str) -> list[Any]:
    """The values at a CRD printer column's JSONPath (the subset CRDs use in practice)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    values = [obj]
    position = 0
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            return []
        position = match.end()
        field, index, filter_key, filter_value = match.groups()
        out: list[Any] = []
        for value in values:
            if field is not None and isinstance(value, dict) and field in value:
                out.append(value[field])
            elif index is not None and isinstance(value, list):
                if index == "*":
                    out.extend(value)
                elif int(index) < len(value):
                    out.append(value[int(index)])
            elif filter_key is not None and isinstance(value, list):
                for item in value:
                    found = json_path(item, "." + filter_key)
                    if found and str(found[0]) == filter_value:
                        out.append(item)
        values = out
    return values


def _cell(values: list[Any], kind: str) -> Any:
    if not values:
        return None
    value = values[0] if len(values) == 1 else values
    if kind == "date" and isinstance(value, str):
        return human_age(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return value


def crd_printer(columns: list[dict[str, Any]]) -> Printer:
    """NAME plus the CRD version's `additionalPrinterColumns` (NAME, AGE without any)."""
    if not columns:
        return [_AGE], lambda obj: [_age(obj)]
    defs: list[Column] = [
        (str(c.get("name", "")), str(c.get("type", "string")), int(c.get("priority") or 0))
        for c in columns
    ]

    def row(obj: Obj) -> Row:
        return [
            _cell(json_path(obj, str(c.get("jsonPath", ""))), str(c.get("type", "string")))
            for c in columns
        ]

    return defs, row


def printer_for(rt: ResourceType, crd_columns: list[dict[str, Any]] | None) -> Printer:
    if rt.custom:
        return crd_printer(crd_columns or [])
    return PRINTERS.get((rt.group, rt.kind)) or ([_AGE], lambda obj: [_age(obj)])


def _column_definitions(columns: list[Column]) -> list[dict[str, Any]]:
    out = []
    for name, kind, priority in [_NAME, *columns]:
        entry: dict[str, Any] = {
            "name": name,
            "type": "string" if kind == "date" else kind,
            "format": "name" if (name, kind) == _NAME[:2] else "",
            "description": f"{name} of the object"
            if name != "Name"
            else "Name must be unique within a namespace.",
            "priority": priority,
        }
        out.append(entry)
    return out


def _row_object(obj: Obj, include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(_meta(obj)),
    }


def table(
    printer: Printer,
    items: Sequence[Obj],
    *,
    include: str = "Metadata",
    metadata: Mapping[str, Any] | None = None,
    with_columns: bool = True,
) -> dict[str, Any]:
    """A `meta.k8s.io/v1` Table of `items` (one row each)."""
    columns, render = printer
    rows = []
    for obj in items:
        row: dict[str, Any] = {"cells": [_meta(obj).get("name"), *render(obj)]}
        embedded = _row_object(obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    out: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(metadata or {}),
        "columnDefinitions": _column_definitions(columns) if with_columns else [],
        "rows": rows,
    }
    return out
