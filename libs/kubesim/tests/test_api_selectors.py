"""Label- and field-selector parsing, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.selectors import (
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector,
)

LABELS = {"app": "web", "tier": "frontend", "replicas": "3", "example.com/owner": "team-a"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app!=web", False),
        ("app=db", False),
        ("missing!=x", True),
        ("app in (web, db)", True),
        ("app notin (web)", False),
        ("app,tier", True),
        ("!app", False),
        ("!missing", True),
        ("replicas>2", True),
        ("replicas<3", False),
        ("example.com/owner=team-a", True),
        ("app=web,tier in (backend)", False),
        ("app in (web),tier notin (backend),!missing", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    matcher = parse_label_selector(selector)
    assert (matcher is None or matcher(LABELS)) is matches


@pytest.mark.parametrize(
    "selector",
    ["app in (", "app=we b", "-bad=x", "replicas>x", "app in (a b)"],
)
def test_invalid_label_selectors(selector: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_label_selector(selector)
    assert err.value.code == 400


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "default"},
    "spec": {"nodeName": "node-1"},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("metadata.name=p", True),
        ("metadata.namespace!=default", False),
        ("spec.nodeName=node-1,status.phase=Running", True),
        ("spec.nodeName=", False),
        ("spec.missing=", True),
    ],
)
def test_field_selectors(selector: str, matches: bool) -> None:
    matcher = parse_field_selector(selector)
    assert matcher is not None
    assert matcher(POD) is matches


def test_label_selector_objects_render_as_strings() -> None:
    rendered = selector_from_label_selector(
        {
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [
                {"key": "c", "operator": "In", "values": ["x", "y"]},
                {"key": "d", "operator": "DoesNotExist"},
            ],
        }
    )
    assert rendered == "a=1,b=2,c in (x,y),!d"
    matcher = parse_label_selector(rendered)
    assert matcher is not None
    assert matcher({"a": "1", "b": "2", "c": "y"})
