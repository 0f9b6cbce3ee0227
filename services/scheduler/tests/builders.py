"""Fluent builders for scheduler tests (after Kubernetes ``pkg/scheduler/testing/wrappers.go``).

A test states only what matters to it::

    make_cluster("us-east").with_labels(region="us").with_taint("gpu", effect="NoSchedule")
    make_deployment(replicas=10).with_requests(cpu="500m")
    make_policy().tolerating("gpu").max_clusters(2)

Everything else has a sensible default: a cluster is Ready, uncordoned, untainted,
has 4 nodes of 4 CPU / 16Gi / 110 pods each and has not reported its API
resources; a Deployment asks for 100m CPU and 128Mi per replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.common import api, capacity, quantity
from flotilla.common.api import Strategy
from flotilla.common.events import (
    ClusterPlacement,
    Component,
    Dependency,
    ObjectRef,
    ResourceAnalyzed,
)
from flotilla.common.interpreters import Registry
from flotilla.scheduler.model import Fleet, SchedulingInput

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def units(requests: Mapping[str, str | int]) -> dict[str, int]:
    """``{"cpu": "500m"}`` → ``{"cpu": 500}`` (Flotilla's integer units)."""
    return {r: quantity.to_units(r, v) for r, v in requests.items()}


class ClusterBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.labels: dict[str, str] = {}
        self.taints: list[api.Taint] = []
        self.unschedulable = False
        self.evict_after: datetime | None = None
        self.ready: api.ConditionStatus | None = api.ConditionStatus.TRUE
        self.ready_reason = ""
        self.api_resources: list[api.ApiResource] = []
        self.placements = 0
        self.node_free: list[dict[str, int]] | None = [
            units({"cpu": "4", "memory": "16Gi", "pods": 110}) for _ in range(4)
        ]
        self.reserved: dict[str, int] = {}

    def with_labels(self, **labels: str) -> ClusterBuilder:
        self.labels.update(labels)
        return self

    def with_taint(
        self,
        key: str,
        value: str = "",
        effect: str = "NoSchedule",
        added: datetime | None = None,
    ) -> ClusterBuilder:
        self.taints.append(
            api.Taint(key=key, value=value, effect=api.TaintEffect(effect), time_added=added)
        )
        return self

    def cordoned(self) -> ClusterBuilder:
        self.unschedulable = True
        return self

    def draining(self, evict_after: datetime = NOW - timedelta(minutes=1)) -> ClusterBuilder:
        self.evict_after = evict_after
        return self

    def not_ready(self, reason: str = "HeartbeatMissed") -> ClusterBuilder:
        self.ready = api.ConditionStatus.FALSE
        self.ready_reason = reason
        return self

    def without_ready_condition(self) -> ClusterBuilder:
        self.ready = None
        return self

    def serving(self, *types: tuple[str, str]) -> ClusterBuilder:
        """API resources as ``("apps/v1", "Deployment")`` pairs."""
        for api_version, kind in types:
            gvk = api.GroupVersionKind.from_api_version(api_version, kind)
            self.api_resources.append(
                api.ApiResource(group=gvk.group, version=gvk.version, kind=gvk.kind)
            )
        return self

    def with_placements(self, count: int) -> ClusterBuilder:
        self.placements = count
        return self

    def with_nodes(self, *free: Mapping[str, str | int]) -> ClusterBuilder:
        """Nodes with this much free (and allocatable) capacity each."""
        self.node_free = [units(node) for node in free]
        return self

    def with_room(self, nodes: int = 1, **free: str | int) -> ClusterBuilder:
        """``nodes`` equal nodes with ``free`` each (pods default to 110)."""
        free.setdefault("pods", 110)
        return self.with_nodes(*[free] * nodes)

    def with_reserved(self, **reserved: str | int) -> ClusterBuilder:
        self.reserved = units(reserved)
        return self

    def without_capacity(self) -> ClusterBuilder:
        self.node_free = None
        return self

    def build(self) -> api.Cluster:
        conditions = []
        if self.ready is not None:
            conditions.append(
                api.Condition(type="Ready", status=self.ready, reason=self.ready_reason)
            )
        return api.Cluster(
            metadata=api.ObjectMeta(name=self.name, labels=self.labels),
            spec=api.ClusterSpec(
                taints=self.taints,
                unschedulable=self.unschedulable,
                evict_after=self.evict_after,
            ),
            status=api.ClusterStatus(
                conditions=conditions,
                api_resources=self.api_resources,
                placements=self.placements,
            ),
        )

    def record(self) -> capacity.ClusterCapacity | None:
        if self.node_free is None:
            return None
        nodes = [
            capacity.NodeCapacity(name=f"{self.name}-n{i}", allocatable=dict(free), free=dict(free))
            for i, free in enumerate(self.node_free)
        ]
        total = capacity.add(*(n.free for n in nodes))
        return capacity.ClusterCapacity(
            cluster=self.name,
            allocatable=total,
            available=total,
            nodes=nodes,
            reserved=self.reserved,
            observed_at=NOW.timestamp(),
        )


def make_cluster(name: str) -> ClusterBuilder:
    return ClusterBuilder(name)


def fleet(*clusters: ClusterBuilder) -> Fleet:
    records = {c.name: r for c in clusters if (r := c.record()) is not None}
    snapshot = capacity.Snapshot(clusters=records, taken_at=NOW.timestamp())
    return Fleet([c.build() for c in clusters], snapshot)


class ObjectBuilder:
    def __init__(
        self, api_version: str, kind: str, name: str, strategy: Strategy, replicas: int | None
    ) -> None:
        self.ref = ObjectRef(api_version=api_version, kind=kind, name=name, namespace="default")
        self.strategy = strategy
        self.replicas = replicas
        self.requests: dict[str, int] = {}
        self.components: list[Component] = []
        self.dependencies: list[Dependency] = []
        self.uid = f"uid-{name}"
        self.annotations: dict[str, str] = {}
        self.is_deleted = False
        self.policy: api.PlacementPolicySpec | None = None
        self.interpreter: api.ResourceInterpreterSpec | None = None

    def with_requests(self, **requests: str | int) -> ObjectBuilder:
        self.requests = units(requests)
        return self

    def with_replicas(self, replicas: int | None) -> ObjectBuilder:
        self.replicas = replicas
        return self

    def with_component(self, name: str, replicas: int = 1, **requests: str | int) -> ObjectBuilder:
        self.components.append(Component(name=name, replicas=replicas, requests=units(requests)))
        return self

    def with_uid(self, uid: str) -> ObjectBuilder:
        self.uid = uid
        return self

    def with_annotation(self, key: str, value: str) -> ObjectBuilder:
        self.annotations[key] = value
        return self

    def depending_on(self, api_version: str, kind: str, name: str) -> ObjectBuilder:
        self.dependencies.append(
            Dependency(api_version=api_version, kind=kind, name=name, namespace="default")
        )
        return self

    def deleted(self) -> ObjectBuilder:
        self.is_deleted = True
        return self

    def governed_by(self, policy: PolicyBuilder) -> ObjectBuilder:
        self.policy = policy.build()
        return self

    def detected_as(self, strategy: Strategy) -> ObjectBuilder:
        """As the dependency detector sends it: `strategy` is the effective one, and
        the event carries the built-in interpreter of the kind (its default)."""
        gvk = api.GroupVersionKind.from_api_version(self.ref.api_version, self.ref.kind)
        self.interpreter = Registry.with_builtins().lookup(gvk).spec
        self.strategy = strategy
        return self

    def build(self) -> ResourceAnalyzed:
        metadata: dict[str, Any] = {
            "name": self.ref.name,
            "namespace": self.ref.namespace,
            "uid": self.uid,
            "generation": 1,
        }
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return ResourceAnalyzed(
            ref=self.ref,
            object={
                "apiVersion": self.ref.api_version,
                "kind": self.ref.kind,
                "metadata": metadata,
            },
            deleted=self.is_deleted,
            strategy=self.strategy,
            replicas=self.replicas,
            requests=self.requests,
            components=self.components,
            dependencies=self.dependencies,
            policy_spec=self.policy,
            interpreter=self.interpreter,
        )


def make_deployment(name: str = "web", replicas: int = 3) -> ObjectBuilder:
    return ObjectBuilder("apps/v1", "Deployment", name, Strategy.SPLIT, replicas).with_requests(
        cpu="100m", memory="128Mi"
    )


def make_daemonset(name: str = "agent") -> ObjectBuilder:
    return ObjectBuilder("apps/v1", "DaemonSet", name, Strategy.COPY, 1).with_requests(
        cpu="50m", memory="64Mi"
    )


def make_pod(name: str = "job-pod") -> ObjectBuilder:
    return ObjectBuilder("v1", "Pod", name, Strategy.ANY, 1).with_requests(cpu="250m")


def make_pvc(name: str = "data") -> ObjectBuilder:
    return ObjectBuilder("v1", "PersistentVolumeClaim", name, Strategy.ANY, 1)


def make_configmap(name: str = "settings") -> ObjectBuilder:
    return ObjectBuilder("v1", "ConfigMap", name, Strategy.AS_NEEDED, 1)


def make_workload(name: str = "flink") -> ObjectBuilder:
    """A multi-component CRD (no components yet: add them with `with_component`)."""
    return ObjectBuilder("flink.apache.org/v1beta1", "FlinkDeployment", name, Strategy.ANY, 1)


class PolicyBuilder:
    def __init__(self) -> None:
        self.spec: dict[str, Any] = {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]
        }

    def strategy(self, strategy: str) -> PolicyBuilder:
        self.spec["strategy"] = strategy
        return self

    def selecting(self, **match_labels: str) -> PolicyBuilder:
        self.spec["clusterSelector"] = {"matchLabels": match_labels}
        return self

    def selecting_expression(self, key: str, operator: str, *values: str) -> PolicyBuilder:
        self.spec["clusterSelector"] = {
            "matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]
        }
        return self

    def names(self, *names: str) -> PolicyBuilder:
        self.spec["clusterNames"] = list(names)
        return self

    def tolerating(
        self,
        key: str = "",
        value: str = "",
        effect: str | None = None,
        seconds: int | None = None,
        operator: str | None = None,
    ) -> PolicyBuilder:
        toleration: dict[str, Any] = {"key": key}
        if value:
            toleration["value"] = value
        toleration["operator"] = operator or ("Equal" if value else "Exists")
        if effect:
            toleration["effect"] = effect
        if seconds is not None:
            toleration["tolerationSeconds"] = seconds
        self.spec.setdefault("tolerations", []).append(toleration)
        return self

    def max_clusters(self, count: int) -> PolicyBuilder:
        self.spec["maxClusters"] = count
        return self

    def spread(
        self, label: str, min_groups: int = 1, max_groups: int | None = None
    ) -> PolicyBuilder:
        spread: dict[str, Any] = {"labelKey": label, "minGroups": min_groups}
        if max_groups is not None:
            spread["maxGroups"] = max_groups
        self.spec["spread"] = spread
        return self

    def weighted(self, *rules: tuple[Mapping[str, str], int]) -> PolicyBuilder:
        """``splitBy: weights`` with ``(matchLabels, weight)`` rules."""
        self.spec["splitBy"] = "weights"
        self.spec["weights"] = [
            {"clusterSelector": {"matchLabels": dict(labels)}, "weight": weight}
            for labels, weight in rules
        ]
        return self

    def build(self) -> api.PlacementPolicySpec:
        return api.PlacementPolicySpec.model_validate(self.spec)


def make_policy() -> PolicyBuilder:
    return PolicyBuilder()


def placed(*entries: tuple[str, int | None]) -> tuple[ClusterPlacement, ...]:
    """A previous placement: ``placed(("a", 4), ("b", 3))``."""
    return tuple(ClusterPlacement(cluster=c, replicas=n) for c, n in entries)


def make_input(
    obj: ObjectBuilder | ResourceAnalyzed,
    clusters: Sequence[ClusterBuilder] | Fleet,
    *,
    policy: PolicyBuilder | api.PlacementPolicySpec | None = None,
    previous: Iterable[ClusterPlacement] = (),
    dependencies: Mapping[str, Sequence[str]] | None = None,
    now: datetime = NOW,
    avoid: Iterable[str] = (),
) -> SchedulingInput:
    return SchedulingInput(
        analyzed=obj.build() if isinstance(obj, ObjectBuilder) else obj,
        policy=policy.build() if isinstance(policy, PolicyBuilder) else policy,
        fleet=clusters if isinstance(clusters, Fleet) else fleet(*clusters),
        now=now,
        previous=tuple(previous),
        dependency_placements=dict(dependencies or {}),
        avoid_clusters=frozenset(avoid),
    )


def three_equal() -> list[ClusterBuilder]:
    return [make_cluster(n) for n in ("ap-south", "eu-west", "us-east")]


def varied_inputs() -> list[SchedulingInput]:
    """Inputs that between them reach every part of a decision id: rejections of
    several kinds, spread and maxClusters, a previous placement (Retiring entries),
    dependencies, clusters to avoid, components, each strategy. For checks that ids
    are the same in every process."""
    clusters = [
        make_cluster("ap-south").with_labels(region="ap"),
        make_cluster("eu-west").with_labels(region="eu"),
        make_cluster("eu-central").with_labels(region="eu").with_taint("gpu"),
        make_cluster("us-east").with_labels(region="us").with_room(cpu="1"),
        make_cluster("us-west").with_labels(region="us").cordoned(),
    ]
    spread = make_policy().spread("region", min_groups=2).max_clusters(3)
    return [
        make_input(make_deployment(replicas=7).with_requests(cpu="300m"), clusters),
        make_input(make_deployment(replicas=5), clusters, policy=spread),
        make_input(
            make_deployment(replicas=4),
            clusters,
            previous=placed(("us-west", 4)),
            dependencies={"v1/ConfigMap/default/settings": ["eu-west", "ap-south"]},
            avoid=["ap-south", "eu-west"],
        ),
        make_input(make_daemonset(), clusters),
        make_input(make_pod(), clusters, previous=placed(("eu-west", 1))),
        make_input(make_workload().with_component("taskmanager", 2, cpu="2"), clusters),
        make_input(make_deployment(replicas=3).with_requests(cpu="64"), clusters),
    ]
