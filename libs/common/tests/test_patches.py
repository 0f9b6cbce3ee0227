"""The patch formats' error vocabulary and copy semantics (their merge semantics
are tabled in kubesim's ``test_api_patch.py``, which goes through the same code)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.common import patches

TARGET: dict[str, Any] = {
    "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "app", "image": "a"}]}}}
}

ERRORS = [
    ("json not a list", patches.json_patch, {"op": "add"}, patches.PatchError),
    ("json unknown op", patches.json_patch, [{"op": "frob", "path": "/x"}], patches.PatchError),
    (
        "json test fails",
        patches.json_patch,
        [{"op": "test", "path": "/spec/replicas", "value": 2}],
        patches.PatchFailed,
    ),
    (
        "json missing path",
        patches.json_patch,
        [{"op": "remove", "path": "/nope"}],
        patches.PatchFailed,
    ),
    (
        "strategic unknown directive",
        patches.strategic_merge_patch,
        {"spec": {"$patch": "frob"}},
        patches.PatchError,
    ),
    (
        "strategic item without merge key",
        patches.strategic_merge_patch,
        {"spec": {"template": {"spec": {"containers": [{"image": "b"}]}}}},
        patches.PatchError,
    ),
]


@pytest.mark.parametrize(
    ("apply", "patch", "error"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_errors(apply: Any, patch: Any, error: type[Exception]) -> None:
    target = copy.deepcopy(TARGET)
    with pytest.raises(error) as raised:
        apply(target, patch)
    if error is patches.PatchError:
        assert not isinstance(raised.value, patches.PatchFailed)
    assert target == TARGET


@pytest.mark.parametrize(
    ("apply", "patch"),
    [
        (patches.merge_patch, {"spec": {"replicas": 3}}),
        (patches.strategic_merge_patch, {"spec": {"replicas": 3}}),
        (patches.json_patch, [{"op": "replace", "path": "/spec/replicas", "value": 3}]),
    ],
    ids=["merge", "strategic", "json"],
)
def test_the_target_is_left_alone(apply: Any, patch: Any) -> None:
    target = copy.deepcopy(TARGET)
    assert apply(target, patch)["spec"]["replicas"] == 3
    assert target == TARGET


def test_json_patch_in_place_edits_the_target() -> None:
    target = copy.deepcopy(TARGET)
    patches.json_patch(
        target, [{"op": "replace", "path": "/spec/replicas", "value": 4}], in_place=True
    )
    assert target["spec"]["replicas"] == 4
