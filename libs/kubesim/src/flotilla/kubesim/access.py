"""Who the caller is and what it may do, plus the other answers a working day asks for:
`kubectl auth can-i|whoami`, `kubectl create token` and `kubectl logs`.

kubesim has one user (the bearer token of its kubeconfig) and no authorizer, so
every access review is allowed and the identity is a cluster admin. Service-account
tokens are well-formed JWTs (so tools that decode them work) but unsigned, and
kubesim does not accept them as credentials. Pod logs are simulated: a few lines
derived from the pod's recorded lifecycle, never real output.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from flotilla.kubesim.errors import ApiError, bad_request

USERNAME = "kubesim-admin"
GROUPS = ["system:masters", "system:authenticated"]
DEFAULT_TOKEN_SECONDS = 3600
MIN_TOKEN_SECONDS = 600


def _echo(body: Any, kind: str, api_version: str) -> dict[str, Any]:
    """The answer's skeleton; `body` None means "not decoded": answer with defaults."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a {kind} object")
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})},
        "spec": body.get("spec") or {},
    }


def review(kind: str, api_version: str, body: Any) -> dict[str, Any]:
    """The answer to a SelfSubjectAccessReview, SelfSubjectRulesReview or SelfSubjectReview."""
    out = _echo(body, kind, api_version)
    if kind == "SelfSubjectAccessReview" and body is None:
        out["status"] = {"allowed": True, "reason": "kubesim allows every request of its user"}
    elif kind == "SelfSubjectAccessReview":
        spec = out["spec"]
        if not spec.get("resourceAttributes") and not spec.get("nonResourceAttributes"):
            raise ApiError(
                422,
                "Invalid",
                f"{kind}.authorization.k8s.io is invalid: spec.resourceAttributes: Invalid "
                "value: null: exactly one of nonResourceAttributes or resourceAttributes "
                "must be specified",
            )
        out["status"] = {"allowed": True, "reason": "kubesim allows every request of its user"}
    elif kind == "SelfSubjectRulesReview":
        out["status"] = {
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": False,
        }
    else:
        out.pop("spec", None)
        out["status"] = {"userInfo": {"username": USERNAME, "groups": list(GROUPS)}}
    return out


def _b64(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def token_request(
    cluster: str, namespace: str, account: dict[str, Any], body: Any
) -> dict[str, Any]:
    """A TokenRequest answered for `account` (an unsigned JWT naming it)."""
    out = _echo(body, "TokenRequest", "authentication.k8s.io/v1")
    spec = out["spec"]
    seconds = spec.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < MIN_TOKEN_SECONDS:
        raise ApiError(
            422,
            "Invalid",
            f"TokenRequest.authentication.k8s.io is invalid: spec.expirationSeconds: Invalid "
            f"value: {json.dumps(seconds)}: may not specify a duration less than 10 minutes",
        )
    audiences = spec.get("audiences") or [f"https://kubesim.{cluster}"]
    now = int(time.time())
    name = account["metadata"]["name"]
    claims = {
        "aud": audiences,
        "exp": now + seconds,
        "iat": now,
        "iss": f"https://kubesim.{cluster}",
        "jti": secrets.token_hex(16),
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]},
        },
        "nbf": now,
        "sub": f"system:serviceaccount:{namespace}:{name}",
    }
    signature = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    token = f"{_b64({'alg': 'none', 'kid': 'kubesim'})}.{_b64(claims)}.{signature}"
    out["metadata"] = {"name": name, "namespace": namespace, "creationTimestamp": None}
    out["spec"] = {**spec, "audiences": audiences, "expirationSeconds": seconds}
    expires = datetime.fromtimestamp(now + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out["status"] = {"token": token, "expirationTimestamp": expires}
    return out


def pod_log(pod: dict[str, Any], container: str | None, tail_lines: int | None) -> str:
    """A simulated log of one container of a pod; 400 as upstream when there is none yet."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    names = [c.get("name") for c in spec.get("containers") or []]
    init_names = [c.get("name") for c in spec.get("initContainers") or []]
    pod_name = meta["name"]
    if container is None:
        if len(names) != 1:
            choices = " ".join(str(n) for n in names)
            raise bad_request(
                f"a container name must be specified for pod {pod_name}, choose one of: [{choices}]"
            )
        container = str(names[0])
    if container not in names and container not in init_names:
        raise bad_request(f"container {container} is not valid for pod {pod_name}")
    status = pod.get("status") or {}
    started = None
    for entry in status.get("containerStatuses") or []:
        if entry.get("name") == container:
            running = (entry.get("state") or {}).get("running") or {}
            terminated = (entry.get("state") or {}).get("terminated") or {}
            started = running.get("startedAt") or terminated.get("startedAt")
    if started is None:
        raise bad_request(
            f'container "{container}" in pod "{pod_name}" is waiting to start: ContainerCreating'
        )
    image = next(
        (c.get("image") for c in spec.get("containers") or [] if c.get("name") == container), ""
    )
    lines = [
        f"{started} kubesim: simulated log of container {container} ({image})",
        f"{started} kubesim: pod {meta.get('namespace')}/{pod_name} on node "
        f"{spec.get('nodeName', '')}",
        f"{started} kubesim: container {container} started",
    ]
    if status.get("phase") == "Succeeded":
        lines.append(f"{started} kubesim: container {container} completed")
    if tail_lines is not None and tail_lines >= 0:
        lines = lines[len(lines) - tail_lines :] if tail_lines else []
    return "".join(f"{line}\n" for line in lines)
