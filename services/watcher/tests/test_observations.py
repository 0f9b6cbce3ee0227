"""What the watcher publishes for an observed object: table tests of the pure core."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from flotilla.common import events
from flotilla.common.api import ClusterPlacementPolicy, PlacementPolicy
from flotilla.watcher import observations
from flotilla.watcher.matching import Policy
from flotilla.watcher.observations import Record

Edit = Callable[[dict[str, Any]], None]


# --- builders -----------------------------------------------------------------------


def deployment(rv: int = 10, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "web",
        "namespace": "shop",
        "uid": "uid-1",
        "generation": 1,
        "resourceVersion": str(rv),
        "labels": {"app": "web"},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"replicas": 2},
        "status": {"readyReplicas": 0},
    }


def cluster_policy(name: str = "all", **spec: Any) -> Policy:
    selectors = [{"apiVersion": "apps/v1", "kind": "Deployment"}]
    return ClusterPlacementPolicy.model_validate(
        {"metadata": {"name": name}, "spec": {"resourceSelectors": selectors, **spec}}
    )


def namespaced_policy(name: str = "shop", **spec: Any) -> Policy:
    selectors = [{"apiVersion": "apps/v1", "kind": "Deployment"}]
    return PlacementPolicy.model_validate(
        {
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"resourceSelectors": selectors, **spec},
        }
    )


def published(obj: dict[str, Any], policies: list[Policy]) -> Record:
    change = observations.resource_observed(obj, policies, None)
    assert change is not None and change.record is not None
    return change.record


def edited(edit: Edit, obj: dict[str, Any] | None = None) -> dict[str, Any]:
    result = copy.deepcopy(obj or deployment())
    edit(result)
    result["metadata"]["resourceVersion"] = "11"
    return result


def annotate(name: str, value: str) -> Edit:
    return lambda o: o["metadata"].setdefault("annotations", {}).__setitem__(name, value)


DETECTED = json.dumps(
    [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "namespace": "shop", "detected": True}]
)
USER = json.dumps([{"apiVersion": "db.example.com/v1", "kind": "Database", "name": "orders"}])


# --- fingerprints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda o: None, id="resource-version-only"),
        pytest.param(lambda o: o["metadata"].__setitem__("managedFields", [{}]), id="managed"),
        pytest.param(lambda o: o["status"].__setitem__("readyReplicas", 2), id="status"),
        pytest.param(annotate("flotilla.io/placement", '{"clusters":[]}'), id="placement"),
        pytest.param(annotate("flotilla.io/cluster-status", "{}"), id="cluster-status"),
        pytest.param(annotate("flotilla.io/failover-history", "[]"), id="failover-history"),
        pytest.param(annotate("flotilla.io/dependencies", DETECTED), id="detected-deps"),
        pytest.param(annotate("flotilla.io/dependencies", "[]"), id="empty-deps"),
    ],
)
def test_flotilla_writes_do_not_change_the_fingerprint(edit: Edit) -> None:
    policies = [cluster_policy()]
    before = published(deployment(), policies)
    assert observations.resource_observed(edited(edit), policies, before) is None


def _replicas(o: dict[str, Any]) -> None:
    o["spec"]["replicas"] = 3
    o["metadata"]["generation"] = 2


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(_replicas, id="spec-and-generation"),
        pytest.param(lambda o: o["metadata"]["labels"].__setitem__("tier", "x"), id="label"),
        pytest.param(annotate("team.example.com/owner", "ann"), id="user-annotation"),
        pytest.param(annotate("flotilla.io/strategy", "copy"), id="strategy-annotation"),
        pytest.param(annotate("flotilla.io/dependencies", USER), id="user-dependency"),
        pytest.param(annotate("flotilla.io/dependencies", "{oops"), id="unparseable-deps"),
        pytest.param(lambda o: o["metadata"].__setitem__("uid", "uid-2"), id="recreated"),
    ],
)
def test_user_intent_changes_publish(edit: Edit) -> None:
    policies = [cluster_policy()]
    before = published(deployment(), policies)
    change = observations.resource_observed(edited(edit), policies, before)
    assert change is not None
    assert isinstance(change.payload, events.ResourceObserved)
    assert change.record is not None and change.record.revision == 11


def test_detected_entries_next_to_user_entries_do_not_count() -> None:
    user_only = deployment(annotations={"flotilla.io/dependencies": USER})
    policies = [cluster_policy()]
    before = published(user_only, policies)
    merged = json.loads(USER) + json.loads(DETECTED)
    both = edited(annotate("flotilla.io/dependencies", json.dumps(merged)), user_only)
    assert observations.resource_observed(both, policies, before) is None


# --- selection -------------------------------------------------------------------------


def test_unselected_objects_are_not_published() -> None:
    other = [cluster_policy(resourceSelectors=[{"apiVersion": "apps/v1", "kind": "StatefulSet"}])]
    assert observations.resource_observed(deployment(), other, None) is None


def test_published_object_carries_the_winning_policy_and_its_spec() -> None:
    change = observations.resource_observed(
        deployment(), [cluster_policy(), namespaced_policy(maxClusters=2)], None
    )
    assert change is not None
    payload = change.payload
    assert isinstance(payload, events.ResourceObserved)
    assert payload.policy == events.PolicyRef(kind="PlacementPolicy", name="shop", namespace="shop")
    assert payload.policy_spec is not None and payload.policy_spec.max_clusters == 2
    assert (change.key, change.uid, change.generation, change.revision) == (
        "apps/v1/Deployment/shop/web",
        "uid-1",
        1,
        10,
    )


def test_a_policy_spec_change_republishes_the_unchanged_object_under_a_new_id() -> None:
    before = observations.resource_observed(deployment(), [cluster_policy()], None)
    after = observations.resource_observed(
        deployment(), [cluster_policy(maxClusters=1)], before.record if before else None
    )
    assert before is not None and after is not None
    assert after.revision == before.revision
    assert after.envelope("w").id != before.envelope("w").id
    assert after.envelope("w").id == after.envelope("w").id


def test_an_interpreter_change_republishes_the_unchanged_object_carrying_it() -> None:
    old = {"metadata": {"name": "deploys"}, "spec": {"replicas": {"path": ".spec.replicas"}}}
    new = {"metadata": {"name": "deploys"}, "spec": {"replicas": {"path": ".spec.size"}}}
    before = observations.resource_observed(deployment(), [cluster_policy()], None, old)
    assert before is not None
    same = observations.resource_observed(deployment(), [cluster_policy()], before.record, old)
    after = observations.resource_observed(deployment(), [cluster_policy()], before.record, new)
    assert same is None
    assert after is not None
    assert isinstance(after.payload, events.ResourceObserved)
    assert after.payload.interpreter == new
    assert after.envelope("w").id != before.envelope("w").id


def test_losing_the_last_policy_publishes_once_without_policy_and_forgets() -> None:
    before = published(deployment(), [cluster_policy()])
    change = observations.resource_observed(deployment(), [], before)
    assert change is not None and change.record is None
    assert isinstance(change.payload, events.ResourceObserved)
    assert change.payload.policy is None and not change.payload.deleted


def test_an_older_observation_never_replaces_a_newer_one() -> None:
    newer = published(deployment(rv=20), [cluster_policy()])
    older = edited(_replicas)
    older["metadata"]["resourceVersion"] = "15"
    assert observations.resource_observed(older, [cluster_policy()], newer) is None


# --- deletions and config objects ------------------------------------------------------------


def test_deletion_of_a_published_object_names_its_policy() -> None:
    policies = [cluster_policy(maxClusters=3)]
    before = published(deployment(), policies)
    change = observations.resource_deleted(observations.stub(deployment()), before, 30, policies)
    assert change is not None and change.record is None and change.revision == 30
    assert isinstance(change.payload, events.ResourceObserved)
    assert change.payload.deleted and change.payload.policy == before.policy
    assert change.payload.policy_spec is not None
    assert change.payload.policy_spec.max_clusters == 3
    assert change.payload.object["metadata"]["name"] == "web"
    # The policy went first: the deletion still names it, without a spec.
    orphan = observations.resource_deleted(deployment(), before, 31, [])
    assert orphan is not None and isinstance(orphan.payload, events.ResourceObserved)
    assert orphan.payload.policy == before.policy and orphan.payload.policy_spec is None


def test_deletion_of_an_unknown_object_is_not_published() -> None:
    assert observations.resource_deleted(deployment(), None, 30) is None


def cluster(rv: int = 5, ready: str = "True") -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "us-east", "uid": "c1", "resourceVersion": str(rv)},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def test_cluster_status_changes_are_observed() -> None:
    first = observations.config_observed(cluster(), None)
    assert first is not None and isinstance(first.payload, events.ClusterObserved)
    assert first.payload.cluster == "us-east"
    assert observations.config_observed(cluster(rv=6), first.record) is None
    assert observations.config_observed(cluster(rv=7, ready="False"), first.record) is not None


def test_policy_status_changes_are_not_config_changes() -> None:
    policy: dict[str, Any] = {
        "apiVersion": "flotilla.io/v1alpha1",
        "kind": "ClusterPlacementPolicy",
        "metadata": {"name": "all", "uid": "p1", "resourceVersion": "3"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]},
    }
    first = observations.config_observed(policy, None)
    assert first is not None and isinstance(first.payload, events.ConfigChanged)
    with_status = {**policy, "status": {"matched": 4}, "metadata": {**policy["metadata"]}}
    with_status["metadata"]["resourceVersion"] = "4"
    assert observations.config_observed(with_status, first.record) is None
    gone = observations.config_deleted(policy, first.record, 9)
    assert gone is not None and isinstance(gone.payload, events.ConfigChanged)
    assert gone.payload.deleted and gone.record is None


MANAGED_FIELDS = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]


def with_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    managed = copy.deepcopy(obj)
    managed["metadata"]["managedFields"] = copy.deepcopy(MANAGED_FIELDS)
    return managed


def test_publishable_leaves_out_managed_fields_only() -> None:
    obj = with_managed_fields(deployment())
    assert observations.publishable(obj) == deployment()
    assert obj["metadata"]["managedFields"] == MANAGED_FIELDS, "the input is not changed"
    assert observations.publishable({"kind": "X"}) == {"kind": "X"}


def _published_objects() -> list[tuple[str, dict[str, Any] | None]]:
    policies = [cluster_policy()]
    obj = with_managed_fields(deployment())
    observed = observations.resource_observed(obj, policies, None)
    assert observed is not None and observed.record is not None
    unselected = observations.resource_observed(obj, [], observed.record)
    deleted = observations.resource_deleted(obj, observed.record, 11, policies)
    config = observations.config_observed(with_managed_fields(cluster()), None)
    assert config is not None and config.record is not None
    config_gone = observations.config_deleted(with_managed_fields(cluster()), config.record, 9)
    changes = {
        "observed": observed,
        "unselected": unselected,
        "deleted": deleted,
        "cluster": config,
        "cluster deleted": config_gone,
    }
    return [
        (name, getattr(c.payload, "object", None) if c else None) for name, c in changes.items()
    ]


@pytest.mark.parametrize(
    "name", ["observed", "unselected", "deleted", "cluster", "cluster deleted"]
)
def test_events_carry_objects_without_managed_fields(name: str) -> None:
    carried = dict(_published_objects())[name]
    assert carried is not None
    assert "managedFields" not in carried["metadata"]
    assert carried["metadata"]["name"]
