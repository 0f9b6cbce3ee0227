"""Which strategy the analysis carries: annotation, else policy, else interpreter."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.common.api import STRATEGY_ANNOTATION, Strategy
from flotilla.depdetector.interpreters import Registry
from flotilla.depdetector.service import effective_strategy

from .builders import manifest


def deployment(strategy: str | None = None) -> dict[str, Any]:
    annotations = {STRATEGY_ANNOTATION: strategy} if strategy else None
    return manifest("apps/v1", "Deployment", {"replicas": 1}, annotations=annotations)


@pytest.mark.parametrize(
    ("annotation", "policy_spec", "expected"),
    [
        pytest.param(None, None, Strategy.SPLIT, id="interpreter-default"),
        pytest.param(None, {"strategy": "copy"}, Strategy.COPY, id="policy-over-default"),
        pytest.param("any", {"strategy": "copy"}, Strategy.ANY, id="annotation-over-policy"),
        pytest.param(None, {"maxClusters": 2}, Strategy.SPLIT, id="policy-without-strategy"),
        pytest.param(None, {"strategy": "sideways"}, Strategy.SPLIT, id="unknown-policy-value"),
    ],
)
def test_effective_strategy(
    annotation: str | None, policy_spec: dict[str, Any] | None, expected: Strategy
) -> None:
    interpretation = Registry.with_builtins().interpret(deployment(annotation))
    assert effective_strategy(interpretation, policy_spec) is expected
