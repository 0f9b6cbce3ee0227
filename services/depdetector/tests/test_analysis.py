"""What the detector's analysis of one object carries to the later stages."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.common import events
from flotilla.common.api import STRATEGY_ANNOTATION, PlacementPolicySpec, Strategy
from flotilla.common.builders import manifest, template
from flotilla.common.interpreters import Follow, Registry
from flotilla.depdetector import service

REGISTRY = Registry.with_builtins()


def observed(obj: dict[str, Any], strategy: str | None = None) -> events.ResourceObserved:
    policy = None
    if strategy is not None:
        policy = PlacementPolicySpec.model_validate(
            {
                "resourceSelectors": [{"apiVersion": obj["apiVersion"], "kind": obj["kind"]}],
                "strategy": strategy,
            }
        )
    return events.ResourceObserved(ref=events.ObjectRef.of(obj), object=obj, policy_spec=policy)


def analyse(event: events.ResourceObserved) -> events.ResourceAnalyzed:
    interpreter = REGISTRY.for_object(event.object)
    interpretation = interpreter.interpret(event.object, event.policy_spec)
    return service.analysis(event, interpreter, interpretation, [])


def test_a_service_carries_what_it_follows_and_its_interpreter() -> None:
    svc = manifest("v1", "Service", {"selector": {"app": "web"}, "ports": [{"port": 80}]})
    analysed = analyse(observed(svc))
    assert analysed.strategy is Strategy.AS_NEEDED
    assert analysed.follows == [Follow(namespace="shop", pod_labels={"app": "web"})]
    assert analysed.interpreter is not None
    assert [rule.by.value for rule in analysed.interpreter.follows] == ["podLabels"]


def test_a_deployment_carries_its_status_aggregation_and_replicas_path() -> None:
    web = manifest("apps/v1", "Deployment", {"replicas": 4, "template": template()})
    analysed = analyse(observed(web))
    assert analysed.interpreter is not None
    assert analysed.interpreter.replicas is not None
    assert analysed.interpreter.replicas.path == ".spec.replicas"
    assert [(r.path, r.op.value) for r in analysed.interpreter.status_aggregation][:2] == [
        (".status.replicas", "sum"),
        (".status.readyReplicas", "sum"),
    ]
    assert analysed.follows == []


@pytest.mark.parametrize(
    ("annotation", "policy", "strategy"),
    [
        pytest.param(None, None, Strategy.SPLIT, id="type-default"),
        pytest.param(None, "copy", Strategy.COPY, id="policy"),
        pytest.param("any", "copy", Strategy.ANY, id="annotation-over-policy"),
    ],
)
def test_the_strategy_is_the_effective_one_and_the_default_is_kept(
    annotation: str | None, policy: str | None, strategy: Strategy
) -> None:
    annotations = {STRATEGY_ANNOTATION: annotation} if annotation else None
    web = manifest(
        "apps/v1", "Deployment", {"replicas": 2, "template": template()}, annotations=annotations
    )
    analysed = analyse(observed(web, policy))
    assert analysed.strategy is strategy
    assert analysed.default_strategy is Strategy.SPLIT
    assert analysed.policy_spec is not None or policy is None
