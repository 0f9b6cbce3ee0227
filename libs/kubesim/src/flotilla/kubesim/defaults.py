"""The defaults a real API server fills into built-in objects on every write.

A syncer that compares what it applied with what a member returns must see on
kubesim what it would see on a real cluster, so the fields upstream's
`SetDefaults_*` functions (and the admission plugins every cluster runs:
ServiceAccount, DefaultTolerationSeconds, Priority) fill in are filled here too.

Table-driven: `SPEC_DEFAULTS` holds the unconditional `spec` defaults per kind,
`POD_SPEC`/`CONTAINER`/`PROBE` those of every pod spec (pods and pod templates),
`ROLLING_UPDATES` the strategy defaults; the few conditional rules (imagePullPolicy
from the image tag, Job completions/parallelism) are small functions. Absent on
purpose: defaults of volume sources other than configMap/secret, `creationTimestamp:
null` in templates, the projected service-account token volume, the copy of container
limits into absent requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flotilla.kubesim.schema import clone

Obj = dict[str, Any]

SPEC_DEFAULTS: dict[tuple[str, str], Obj] = {
    ("apps", "Deployment"): {
        "replicas": 1,
        "revisionHistoryLimit": 10,
        "progressDeadlineSeconds": 600,
    },
    ("apps", "ReplicaSet"): {"replicas": 1},
    ("apps", "StatefulSet"): {
        "replicas": 1,
        "podManagementPolicy": "OrderedReady",
        "revisionHistoryLimit": 10,
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
    },
    ("apps", "DaemonSet"): {"revisionHistoryLimit": 10},
    ("batch", "Job"): {
        "backoffLimit": 6,
        "completionMode": "NonIndexed",
        "suspend": False,
        "podReplacementPolicy": "TerminatingOrFailed",
    },
    ("batch", "CronJob"): {
        "concurrencyPolicy": "Allow",
        "suspend": False,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 1,
    },
    ("", "Service"): {
        "type": "ClusterIP",
        "sessionAffinity": "None",
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
    },
}
POD_SPEC: Obj = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "securityContext": {},
    "schedulerName": "default-scheduler",
}
CONTAINER: Obj = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "resources": {},
}
PROBE: Obj = {
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}
# Only on Pods: `SetDefaults_Pod` and the admission plugins, not pod templates.
POD_ADMISSION: Obj = {
    "enableServiceLinks": True,
    "serviceAccountName": "default",
    "serviceAccount": "default",
    "priority": 0,
    "preemptionPolicy": "PreemptLowerPriority",
    "tolerations": [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        }
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ],
}
# Where each kind keeps its pod spec.
POD_SPEC_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): ("spec",),
    ("", "PodTemplate"): ("template", "spec"),
    ("apps", "Deployment"): ("spec", "template", "spec"),
    ("apps", "ReplicaSet"): ("spec", "template", "spec"),
    ("apps", "StatefulSet"): ("spec", "template", "spec"),
    ("apps", "DaemonSet"): ("spec", "template", "spec"),
    ("batch", "Job"): ("spec", "template", "spec"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template", "spec"),
}


def _fill(target: Obj, defaults: Obj) -> None:
    for key, value in defaults.items():
        if key not in target and value is not None:
            target[key] = clone(value)


def _dig(obj: Obj, path: tuple[str, ...]) -> Obj | None:
    current: Any = obj
    for part in path:
        current = current.get(part) if isinstance(current, dict) else None
    return current if isinstance(current, dict) else None


def image_pull_policy(image: str) -> str:
    """Always for `:latest` or no tag, IfNotPresent otherwise (digests count as a tag)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _probe(probe: Any) -> None:
    if not isinstance(probe, dict):
        return
    _fill(probe, PROBE)
    http = probe.get("httpGet")
    if isinstance(http, dict):
        http.setdefault("scheme", "HTTP")


def _container(container: Any) -> None:
    if not isinstance(container, dict):
        return
    _fill(container, CONTAINER)
    image = container.get("image")
    if isinstance(image, str) and "imagePullPolicy" not in container:
        container["imagePullPolicy"] = image_pull_policy(image)
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe(container.get(probe))


def _volume(volume: Any) -> None:
    if not isinstance(volume, dict):
        return
    for source in ("configMap", "secret"):
        if isinstance(volume.get(source), dict):
            volume[source].setdefault("defaultMode", 420)


def pod_spec(spec: Obj) -> None:
    _fill(spec, POD_SPEC)
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            _container(container)
    for volume in spec.get("volumes") or []:
        _volume(volume)


# Kind -> (strategy field, rollingUpdate defaults): filled only for RollingUpdate, the
# type defaulted when absent (a Recreate/OnDelete strategy must not get rollingUpdate).
ROLLING_UPDATES: dict[tuple[str, str], tuple[str, Obj]] = {
    ("apps", "Deployment"): ("strategy", {"maxUnavailable": "25%", "maxSurge": "25%"}),
    ("apps", "StatefulSet"): ("updateStrategy", {"partition": 0}),
    ("apps", "DaemonSet"): ("updateStrategy", {"maxUnavailable": 1, "maxSurge": 0}),
}


def _rolling_update(spec: Obj, field: str, rolling_defaults: Obj) -> None:
    strategy = spec.setdefault(field, {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                _fill(rolling, rolling_defaults)


def _job(spec: Obj) -> None:
    if "completions" not in spec and "parallelism" not in spec:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)


def _service(spec: Obj) -> None:
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")


CONDITIONAL: dict[tuple[str, str], Callable[[Obj], None]] = {
    ("batch", "Job"): _job,
    ("", "Service"): _service,
}


def apply(group: str, kind: str, obj: Obj) -> None:
    """Fill the defaults of a built-in object in place (a no-op for other kinds)."""
    key = (group, kind)
    if key == ("", "Secret"):
        obj.setdefault("type", "Opaque")
        return
    spec = obj.get("spec")
    if key in SPEC_DEFAULTS or key in CONDITIONAL:
        if spec is None:
            spec = obj["spec"] = {}
        if isinstance(spec, dict):
            _fill(spec, SPEC_DEFAULTS.get(key, {}))
            rule = CONDITIONAL.get(key)
            if rule is not None:
                rule(spec)
            if key in ROLLING_UPDATES:
                _rolling_update(spec, *ROLLING_UPDATES[key])
    path = POD_SPEC_PATHS.get(key)
    if path is None:
        return
    pod = _dig(obj, path)
    if pod is None:
        return
    pod_spec(pod)
    if key == ("", "Pod"):
        _fill(pod, POD_ADMISSION)
