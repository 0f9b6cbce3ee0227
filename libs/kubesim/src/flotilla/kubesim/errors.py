"""The one error type of the kubesim API server, shaped like a Kubernetes `Status`.

Client libraries branch on the HTTP code and on `Status.reason` (kubernetes_asyncio's
`ApiException.status`, the watch loop's 410 `Expired` handling), so every failure the
store or the HTTP layer reports carries both and renders as a `metav1.Status` body.
"""

from __future__ import annotations

from typing import Any

_CODE_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A request the API server refuses; `status()` is the body the client sees."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The `metav1.Status` body for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def reason_for(code: int) -> str:
    """The usual `StatusReason` for an HTTP code (used for errors raised outside the store)."""
    return _CODE_REASONS.get(code, "Unknown")


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    """`<resource> "<name>" not found`, the message real API servers send."""
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        404,
        "NotFound",
        f'{qualified} "{name}" not found',
        {"name": name, "group": group, "kind": resource},
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified} "{name}" already exists',
        {"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, name: str, message: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {message}',
        {"name": name, "group": group, "kind": resource},
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
    """422 Invalid with one `StatusCause` per (field, message)."""
    text = "; ".join(f"{field}: {msg}" for field, msg in causes)
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {text}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": msg, "field": field}
                for field, msg in causes
            ],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
