from typing import Any

import pytest

from flotilla.common import labels
from flotilla.common.api import LabelSelector

US_EAST = {"region": "us-east", "zone": "us-east-1a", "gpu": "v100"}


def selector(**fields: Any) -> LabelSelector:
    return LabelSelector.model_validate(fields)


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("sel", "expected"),
    [
        pytest.param(None, True, id="absent-selects-all"),
        pytest.param(selector(), True, id="empty-selects-all"),
        pytest.param(selector(matchLabels={"region": "us-east"}), True, id="label-equal"),
        pytest.param(selector(matchLabels={"region": "eu-west"}), False, id="label-differs"),
        pytest.param(selector(matchLabels={"tier": "gold"}), False, id="label-missing"),
        pytest.param(
            selector(matchLabels={"region": "us-east", "gpu": "a100"}),
            False,
            id="all-labels-must-match",
        ),
        pytest.param(selector(matchExpressions=[expr("gpu", "In", "a100", "v100")]), True, id="in"),
        pytest.param(
            selector(matchExpressions=[expr("gpu", "In", "a100")]), False, id="not-in-set"
        ),
        pytest.param(
            selector(matchExpressions=[expr("tier", "In", "gold")]), False, id="in-absent-key"
        ),
        pytest.param(
            selector(matchExpressions=[expr("gpu", "NotIn", "a100")]), True, id="notin-other-value"
        ),
        pytest.param(
            selector(matchExpressions=[expr("gpu", "NotIn", "v100")]), False, id="notin-same-value"
        ),
        pytest.param(
            selector(matchExpressions=[expr("tier", "NotIn", "gold")]), True, id="notin-absent-key"
        ),
        pytest.param(selector(matchExpressions=[expr("gpu", "Exists")]), True, id="exists"),
        pytest.param(
            selector(matchExpressions=[expr("tier", "Exists")]), False, id="exists-absent"
        ),
        pytest.param(
            selector(matchExpressions=[expr("tier", "DoesNotExist")]), True, id="doesnotexist"
        ),
        pytest.param(
            selector(matchExpressions=[expr("gpu", "DoesNotExist")]),
            False,
            id="doesnotexist-present",
        ),
        pytest.param(
            selector(
                matchLabels={"region": "us-east"},
                matchExpressions=[expr("gpu", "Exists"), expr("zone", "NotIn", "us-east-1b")],
            ),
            True,
            id="labels-and-expressions",
        ),
        pytest.param(
            selector(matchLabels={"region": "us-east"}, matchExpressions=[expr("gpu", "In", "t4")]),
            False,
            id="labels-match-expression-fails",
        ),
    ],
)
def test_matches(sel: LabelSelector | None, expected: bool) -> None:
    assert labels.matches(sel, US_EAST) is expected


@pytest.mark.parametrize(
    ("match_labels", "expected"),
    [
        pytest.param({}, True, id="empty"),
        pytest.param({"region": "us-east"}, True, id="subset"),
        pytest.param({"region": "us-east", "tier": "gold"}, False, id="extra-key"),
    ],
)
def test_map_matches(match_labels: dict[str, str], expected: bool) -> None:
    assert labels.map_matches(match_labels, US_EAST) is expected


def test_to_query_is_stable_and_complete() -> None:
    sel = selector(
        matchLabels={"zone": "a", "region": "us"},
        matchExpressions=[
            expr("gpu", "In", "v100", "a100"),
            expr("tier", "NotIn", "bronze"),
            expr("ssd", "Exists"),
            expr("spot", "DoesNotExist"),
        ],
    )
    assert (
        labels.to_query(sel) == "region=us,zone=a,gpu in (a100,v100),tier notin (bronze),ssd,!spot"
    )


@pytest.mark.parametrize(
    ("requirement", "message"),
    [
        pytest.param(expr("gpu", "In"), "needs at least one entry in values", id="in-no-values"),
        pytest.param(expr("gpu", "Exists", "x"), "takes no values", id="exists-with-values"),
        pytest.param(expr("gpu", "Near", "x"), "Input should be", id="unknown-operator"),
    ],
)
def test_invalid_requirements_are_rejected(requirement: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        selector(matchExpressions=[requirement])
