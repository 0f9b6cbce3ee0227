"""The patch formats kubesim accepts besides server-side apply, as API answers.

The formats themselves are `flotilla.common.patches` (the transformer applies the
same ones to rendered manifests); this adapter only turns their errors into what
an API server answers: a malformed patch is 400 BadRequest, a well-formed one that
cannot be applied (a failed JSON patch ``test``, a missing path) 422 Invalid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flotilla.common import patches
from flotilla.common.patches import merge_key_for
from flotilla.kubesim.errors import ApiError, bad_request

__all__ = [
    "APPLY_PATCH",
    "JSON_PATCH",
    "MERGE_PATCH",
    "PATCH_TYPES",
    "STRATEGIC_PATCH",
    "json_patch",
    "merge_key_for",
    "merge_patch",
    "strategic_merge_patch",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH, APPLY_PATCH)


@contextmanager
def _answered() -> Iterator[None]:
    try:
        yield
    except patches.PatchFailed as exc:
        raise ApiError(422, "Invalid", str(exc)) from exc
    except patches.PatchError as exc:
        raise bad_request(str(exc)) from exc


def _adapted(apply: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def patched(target: Any, patch: Any) -> Any:
        with _answered():
            return apply(target, patch)

    patched.__doc__ = apply.__doc__
    return patched


merge_patch = _adapted(patches.merge_patch)
json_patch = _adapted(patches.json_patch)
strategic_merge_patch = _adapted(patches.strategic_merge_patch)
