"""The one rule for an object's strategy: annotation, else policy, else the type's default."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.common.api import (
    STRATEGY_ANNOTATION,
    PlacementPolicySpec,
    Strategy,
    effective_strategy,
)
from flotilla.common.builders import manifest
from flotilla.common.interpreters import InterpretationError, Registry

SPLIT, COPY, ANY, AS_NEEDED = Strategy.SPLIT, Strategy.COPY, Strategy.ANY, Strategy.AS_NEEDED
SELECT_DEPLOYMENTS = {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]}


def deployment(annotation: str | None = None) -> dict[str, Any]:
    annotations = {STRATEGY_ANNOTATION: annotation} if annotation is not None else None
    return manifest("apps/v1", "Deployment", {"replicas": 1}, annotations=annotations)


def policy(strategy: str | None = None) -> PlacementPolicySpec:
    fields = {"strategy": strategy} if strategy is not None else {}
    return PlacementPolicySpec.model_validate({**SELECT_DEPLOYMENTS, **fields})


@pytest.mark.parametrize(
    ("annotation", "governing", "default", "expected"),
    [
        pytest.param(None, None, Strategy.SPLIT, Strategy.SPLIT, id="no-policy-type-default"),
        pytest.param(None, policy(), Strategy.SPLIT, Strategy.SPLIT, id="policy-without-strategy"),
        pytest.param(None, policy("copy"), Strategy.SPLIT, Strategy.COPY, id="policy-over-default"),
        pytest.param(
            "any", policy("copy"), Strategy.SPLIT, Strategy.ANY, id="annotation-over-policy"
        ),
        pytest.param("copy", None, Strategy.ANY, Strategy.COPY, id="annotation-over-default"),
        pytest.param(
            "as-needed",
            policy("split"),
            Strategy.ANY,
            Strategy.AS_NEEDED,
            id="annotation-as-needed",
        ),
    ],
)
def test_precedence(
    annotation: str | None,
    governing: PlacementPolicySpec | None,
    default: Strategy,
    expected: Strategy,
) -> None:
    assert effective_strategy(deployment(annotation), governing, default) is expected


@pytest.mark.parametrize(
    ("annotation", "governing"),
    [
        pytest.param("scatter", None, id="unknown-name"),
        pytest.param("Split", policy("copy"), id="wrong-case-never-falls-back-to-policy"),
        pytest.param("", policy("copy"), id="empty"),
    ],
)
def test_an_invalid_annotation_is_an_error_naming_it_and_the_choices(
    annotation: str, governing: PlacementPolicySpec | None
) -> None:
    with pytest.raises(
        ValueError,
        match=rf"annotation {STRATEGY_ANNOTATION}: unknown strategy '{annotation}'; "
        "use one of split, copy, any, as-needed",
    ):
        effective_strategy(deployment(annotation), governing, Strategy.SPLIT)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"apiVersion": "v1", "kind": "ConfigMap"}, id="no-metadata"),
        pytest.param({"metadata": None}, id="null-metadata"),
        pytest.param({"metadata": {"annotations": None}}, id="null-annotations"),
    ],
)
def test_objects_without_annotations_take_the_policy(obj: dict[str, Any]) -> None:
    assert effective_strategy(obj, policy("copy"), Strategy.ANY) is Strategy.COPY


def test_the_interpreter_reads_objects_with_the_same_rule() -> None:
    registry = Registry.with_builtins()
    assert registry.interpret(deployment()).strategy is Strategy.SPLIT
    assert registry.interpret(deployment(), policy("copy")).strategy is Strategy.COPY
    assert registry.interpret(deployment("any"), policy("copy")).strategy is Strategy.ANY
    with pytest.raises(InterpretationError, match="unknown strategy 'scatter'"):
        registry.interpret(deployment("scatter"), policy("copy"))
