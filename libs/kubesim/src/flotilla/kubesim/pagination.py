"""List requests as upstream reads them: limit/continue pages of one consistent snapshot.

A `continue` token carries the resourceVersion of the list's first page and the
last key returned; every later page is read from the store as of that
resourceVersion (`Store.list_frozen(at=...)`, rebuilt from the watch history), so
objects created, changed or deleted meanwhile neither appear, nor vanish, nor show
twice. Once the history no longer reaches back that far the answer is upstream's
410 Expired, whose Status carries a fresh token (`metadata.continue`) that goes on
from the same key at the current resourceVersion.

`resourceVersion`/`resourceVersionMatch` follow upstream's list semantics: unset or
"0" read the latest state; `NotOlderThan` (the default for a set version) reads the
latest state once it is at least that new; `Exact` reads the snapshot at it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from flotilla.kubesim.errors import ApiError, bad_request
from flotilla.kubesim.resources import ResourceType
from flotilla.kubesim.store import Objects, Store

EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


class ExpiredContinue(ApiError):
    """410 Expired whose Status offers a token to continue (inconsistently) from now."""

    def __init__(self, token: str) -> None:
        super().__init__(410, "Expired", EXPIRED_CONTINUE)
        self.token = token

    def status(self) -> dict[str, Any]:
        return {**super().status(), "metadata": {"continue": self.token}}


def encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "start": list(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise bad_request("invalid continue token") from None


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def int_param(query: Mapping[str, str], name: str) -> int | None:
    """An integer query parameter, None when absent; 400 when it is not an integer."""
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {value!r}") from None


def _snapshot(query: Mapping[str, str], store: Store) -> int | None:
    """The resourceVersion to read at (None: the latest), per resourceVersion(Match)."""
    version, match = query.get("resourceVersion") or "", query.get("resourceVersionMatch") or ""
    if match and not version:
        raise bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")
    if match not in ("", "NotOlderThan", "Exact"):
        raise bad_request(f'resourceVersionMatch: Unsupported value: "{match}"')
    if not version:
        return None
    try:
        rv = int(version)
    except ValueError:
        raise bad_request(f"invalid resourceVersion {version!r}") from None
    if match == "Exact":
        if rv == 0:
            raise bad_request('resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
        if rv > store.resource_version:
            raise _too_large(rv, store)
        return rv
    if rv > store.resource_version:
        raise _too_large(rv, store)
    return None


def _too_large(rv: int, store: Store) -> ApiError:
    return ApiError(
        504,
        "Timeout",
        f"Too large resource version: {rv}, current resource version: {store.resource_version}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ]
        },
    )


def page(
    store: Store, rt: ResourceType, namespace: str | None, query: Mapping[str, str]
) -> tuple[Objects, dict[str, Any]]:
    """One page of a list request: the (stored, frozen) items and the list metadata."""
    label_selector, field_selector = query.get("labelSelector"), query.get("fieldSelector")
    limit = int_param(query, "limit")
    token = query.get("continue")
    start: tuple[str, str] | None = None
    if token:
        if query.get("resourceVersion") not in (None, "", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        at, start = decode_continue(token)
        try:
            items, rv = store.list_frozen(rt, namespace, label_selector, field_selector, at=at)
        except ApiError as error:
            if error.code != 410:
                raise
            raise ExpiredContinue(encode_continue(store.resource_version, start)) from None
        items = [obj for obj in items if _key(obj) > start]
    else:
        items, rv = store.list_frozen(
            rt, namespace, label_selector, field_selector, at=_snapshot(query, store)
        )
    metadata: dict[str, Any] = {"resourceVersion": str(rv)}
    if limit is not None and limit > 0 and len(items) > limit:
        remaining = len(items) - limit
        items = items[:limit]
        metadata["continue"] = encode_continue(rv, _key(items[-1]))
        metadata["remainingItemCount"] = remaining
    return items, metadata
