"""Kubernetes label-selector evaluation, shared by the watcher and the scheduler.

The watcher matches hub objects to a policy's ``resourceSelectors[].labelSelector``
and the scheduler matches clusters to ``clusterSelector`` / ``weights`` /
``targetSelector``; both must agree exactly with what ``kubectl get -l`` would
select, so the rules live here once. Semantics are those of
``k8s.io/apimachinery/pkg/labels``: all matchLabels and all matchExpressions must
hold; ``NotIn`` and ``DoesNotExist`` also hold when the key is absent; an empty
selector selects everything.

Hand-written because the only maintained implementations are the Go apimachinery
package and the synchronous ``kubernetes`` client, which has no evaluator at all
(it only serialises selectors for the API server).
"""

from __future__ import annotations

from collections.abc import Mapping

from flotilla.common.api import LabelSelector, LabelSelectorRequirement, SelectorOperator


def requirement_matches(requirement: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """Whether one matchExpressions entry holds for ``labels``."""
    present = requirement.key in labels
    match requirement.operator:
        case SelectorOperator.IN:
            return present and labels[requirement.key] in requirement.values
        case SelectorOperator.NOT_IN:
            return not present or labels[requirement.key] not in requirement.values
        case SelectorOperator.EXISTS:
            return present
        case SelectorOperator.DOES_NOT_EXIST:
            return not present


def map_matches(match_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a plain label map (a Service's ``spec.selector``) selects ``labels``."""
    return all(labels.get(key) == value for key, value in match_labels.items())


def matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether ``selector`` selects an object with ``labels``.

    ``None`` means "no constraint" and selects everything: in Flotilla's API every
    selector is optional and an absent one never narrows (unlike a nil selector
    passed to apimachinery's ``LabelSelectorAsSelector``, which selects nothing).
    """
    if selector is None:
        return True
    return map_matches(selector.match_labels, labels) and all(
        requirement_matches(r, labels) for r in selector.match_expressions
    )


def to_query(selector: LabelSelector) -> str:
    """The selector in the API server's ``labelSelector=`` query syntax.

    Lets a watcher narrow a list/watch on the server. Values are sorted so the same
    selector always yields the same string (and the same watch).
    """
    terms = [f"{key}={value}" for key, value in sorted(selector.match_labels.items())]
    for requirement in selector.match_expressions:
        values = ",".join(sorted(requirement.values))
        match requirement.operator:
            case SelectorOperator.IN:
                terms.append(f"{requirement.key} in ({values})")
            case SelectorOperator.NOT_IN:
                terms.append(f"{requirement.key} notin ({values})")
            case SelectorOperator.EXISTS:
                terms.append(requirement.key)
            case SelectorOperator.DOES_NOT_EXIST:
                terms.append(f"!{requirement.key}")
    return ",".join(terms)
