from __future__ import annotations

from typing import Any

import pytest

from flotilla.common.api import (
    ClusterPlacementPolicy,
    GroupVersionKind,
    PlacementPolicy,
)
from flotilla.watcher import matching
from flotilla.watcher.matching import Policy

# --- builders -----------------------------------------------------------------------


def obj(
    kind: str = "Deployment",
    name: str = "web",
    namespace: str | None = "shop",
    api_version: str = "apps/v1",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels or {"app": "web", "tier": "front"}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


def selector(
    kind: str = "Deployment", api_version: str = "apps/v1", **fields: Any
) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, **fields}


def policy(
    name: str,
    *selectors: dict[str, Any],
    namespace: str | None = "shop",
    priority: int = 0,
) -> Policy:
    """A PlacementPolicy in ``namespace``, or a ClusterPlacementPolicy when it is None."""
    spec = {"resourceSelectors": list(selectors) or [selector()], "priority": priority}
    if namespace is None:
        return ClusterPlacementPolicy.model_validate({"metadata": {"name": name}, "spec": spec})
    return PlacementPolicy.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )


# --- one selector ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sel", "expected"),
    [
        pytest.param(selector(), True, id="type-only"),
        pytest.param(selector(api_version="apps/v1beta1"), False, id="other-version"),
        pytest.param(selector(kind="StatefulSet"), False, id="other-kind"),
        pytest.param(selector(name="web"), True, id="name"),
        pytest.param(selector(name="api"), False, id="other-name"),
        pytest.param(selector(namespace="shop"), True, id="namespace"),
        pytest.param(selector(namespace="ops"), False, id="other-namespace"),
        pytest.param(selector(labelSelector={"matchLabels": {"app": "web"}}), True, id="labels"),
        pytest.param(
            selector(labelSelector={"matchLabels": {"app": "api"}}), False, id="other-labels"
        ),
        pytest.param(
            selector(
                labelSelector={
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]
                }
            ),
            True,
            id="expression",
        ),
        pytest.param(
            selector(name="web", labelSelector={"matchLabels": {"app": "api"}}),
            False,
            id="name-and-labels-both-must-match",
        ),
    ],
)
def test_selector(sel: dict[str, Any], expected: bool) -> None:
    assert matching.policy_applies(policy("p", sel), obj()) is expected


# --- scope ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pol", "target", "expected"),
    [
        pytest.param(policy("p"), obj(), True, id="namespaced-own-namespace"),
        pytest.param(policy("p"), obj(namespace="ops"), False, id="namespaced-other-namespace"),
        pytest.param(
            policy("p", selector(namespace="ops")),
            obj(namespace="ops"),
            False,
            id="namespaced-cannot-reach-out-by-selector",
        ),
        pytest.param(
            policy("p", selector("Namespace", "v1")),
            obj("Namespace", "shop", None, "v1"),
            False,
            id="namespaced-never-cluster-scoped",
        ),
        pytest.param(policy("c", namespace=None), obj(namespace="ops"), True, id="cluster-any-ns"),
        pytest.param(
            policy("c", selector("Namespace", "v1"), namespace=None),
            obj("Namespace", "shop", None, "v1"),
            True,
            id="cluster-policy-cluster-scoped-object",
        ),
        pytest.param(
            policy("c", selector(namespace="ops"), namespace=None),
            obj(),
            False,
            id="cluster-policy-narrowed-by-namespace",
        ),
        pytest.param(
            policy("p", selector(kind="StatefulSet"), selector()),
            obj(),
            True,
            id="any-selector-suffices",
        ),
    ],
)
def test_scope(pol: Policy, target: dict[str, Any], expected: bool) -> None:
    assert matching.policy_applies(pol, target) is expected


# --- choosing one -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policies", "winner"),
    [
        pytest.param([], None, id="none"),
        pytest.param([policy("a", selector(kind="Job"))], None, id="none-matching"),
        pytest.param(
            [policy("low", priority=1), policy("high", priority=5)], "high", id="priority"
        ),
        pytest.param(
            [policy("cluster-high", namespace=None, priority=10), policy("ns-low", priority=1)],
            "cluster-high",
            id="priority-beats-scope",
        ),
        pytest.param(
            [policy("aaa", namespace=None), policy("zzz")], "zzz", id="tie-namespaced-first"
        ),
        pytest.param([policy("b"), policy("a"), policy("c")], "a", id="tie-by-name"),
        pytest.param(
            [policy("a", namespace=None, priority=-1), policy("b", namespace=None, priority=-2)],
            "a",
            id="negative-priorities",
        ),
    ],
)
def test_select_policy(policies: list[Policy], winner: str | None) -> None:
    chosen = matching.select_policy(obj(), policies)
    assert (chosen.metadata.name if chosen else None) == winner
    chosen_reversed = matching.select_policy(obj(), list(reversed(policies)))
    assert (chosen_reversed.metadata.name if chosen_reversed else None) == winner


def test_matching_policies_lists_winner_first() -> None:
    policies = [
        policy("c", namespace=None),
        policy("other-ns", namespace="ops", priority=100),
        policy("b", priority=3),
        policy("a"),
    ]
    assert [p.metadata.name for p in matching.matching_policies(obj(), policies)] == ["b", "a", "c"]


def test_selected_types_are_the_union_sorted_and_unique() -> None:
    policies = [
        policy("a", selector(), selector("ConfigMap", "v1")),
        policy("b", selector(name="api"), namespace=None),
        policy(
            "c",
            selector("FlinkDeployment", "flink.apache.org/v1beta1"),
            selector("Deployment", "apps/v1beta2"),
        ),
    ]
    assert matching.selected_types(policies) == [
        GroupVersionKind("", "v1", "ConfigMap"),
        GroupVersionKind("apps", "v1", "Deployment"),
        GroupVersionKind("apps", "v1beta2", "Deployment"),
        GroupVersionKind("flink.apache.org", "v1beta1", "FlinkDeployment"),
    ]
    assert matching.selected_types([]) == []
