"""The transformer's handlers on the in-memory bus and store, with a fake hub."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from flotilla.common import events
from flotilla.common.api import PlacementState, Strategy, TransformationSpec
from flotilla.common.builders import container, manifest, pod_spec, template
from flotilla.common.dispatch import Received
from flotilla.common.events import (
    ClusterPlacement,
    Dependency,
    ObjectRef,
    PlacementDecided,
    ResourceAnalyzed,
    WorkRendered,
)
from flotilla.common.interpreters import Registry
from flotilla.common.membus import MemoryBus
from flotilla.common.store import Conflict, MemoryBucket, Store
from flotilla.transformer import service
from flotilla.transformer.records import DependentsRecord, ObjectRecord
from flotilla.transformer.steps import ClusterFacts
from flotilla.transformer.transformations import Catalog

REGISTRY = Registry.with_builtins()
NS = "shop"


class FakeHub:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.cluster_facts: dict[str, ClusterFacts] = {}
        self.catalog: dict[tuple[str, str | None, str], TransformationSpec] = {}
        self.forgotten = 0
        self.fresh_reads = 0

    def add(self, obj: dict[str, Any]) -> None:
        self.objects[ObjectRef.of(obj).key] = obj

    async def clusters(self, *, fresh: bool = False) -> dict[str, ClusterFacts]:
        self.fresh_reads += fresh
        return self.cluster_facts

    async def transformations(self) -> Catalog:
        return self.catalog

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        found = self.objects.get(ref.key)
        return copy.deepcopy(found) if found is not None else None

    def forget(self) -> None:
        self.forgotten += 1


class Reporter:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str]] = []

    async def warning(self, obj: dict[str, Any], reason: str, message: str) -> None:
        self.warnings.append((obj["metadata"]["name"], reason, message))


class Harness:
    def __init__(self) -> None:
        self.bus = MemoryBus()
        self.hub = FakeHub()
        self.reporter = Reporter()
        self.objects = Store(MemoryBucket(), ObjectRecord)
        self.dependents = Store(MemoryBucket(), DependentsRecord)
        self.transformer = service.Transformer(
            bus=self.bus,
            hub=self.hub,
            objects=self.objects,
            dependents=self.dependents,
            reporter=self.reporter,
        )
        self.revision = 0

    async def analyze(
        self,
        obj: dict[str, Any],
        *deps: ObjectRef,
        deleted: bool = False,
        strategy: Strategy = Strategy.SPLIT,
    ) -> None:
        self.revision += 1
        payload = ResourceAnalyzed(
            ref=ObjectRef.of(obj),
            object=obj,
            deleted=deleted,
            strategy=strategy,
            replicas=(obj.get("spec") or {}).get("replicas"),
            dependencies=[
                Dependency(
                    api_version=d.api_version, kind=d.kind, name=d.name, namespace=d.namespace
                )
                for d in deps
            ],
            interpreter=REGISTRY.for_object(obj).spec,
        )
        envelope = events.envelope(
            payload,
            key=payload.ref.key,
            producer="test",
            uid=obj["metadata"].get("uid", ""),
            revision=self.revision,
        )
        await self.transformer.on_resource_analyzed(Received.of(envelope))

    async def decide(
        self,
        obj: dict[str, Any],
        placements: dict[str, int],
        *,
        decision: str = "d-1",
        deleted: bool = False,
        retiring: tuple[str, ...] = (),
        rejections: dict[str, list[str]] | None = None,
    ) -> None:
        payload = PlacementDecided(
            ref=ObjectRef.of(obj),
            decision_id=decision,
            clusters=[
                ClusterPlacement(
                    cluster=c,
                    replicas=r,
                    state=PlacementState.RETIRING if c in retiring else PlacementState.ACTIVE,
                )
                for c, r in sorted(placements.items())
            ],
            deleted=deleted,
            rejections=rejections or {},
        )
        envelope = events.envelope(
            payload, key=payload.ref.key, producer="test", dedupe=(decision,)
        )
        await self.transformer.on_placement_decided(Received.of(envelope))

    async def works(self) -> list[WorkRendered]:
        found = []
        async for replayed in self.bus.replay(event_types=["WorkRendered"]):
            assert isinstance(replayed.envelope.payload, WorkRendered)
            assert replayed.envelope.key == events.work_key(
                replayed.envelope.payload.ref, replayed.envelope.payload.cluster
            )
            found.append(replayed.envelope.payload)
        return found

    async def current(self) -> dict[tuple[str, str], WorkRendered]:
        """The last work per (object, cluster): what the syncer converges to."""
        last: dict[tuple[str, str], WorkRendered] = {}
        for work in await self.works():
            last[(work.ref.key, work.cluster)] = work
        return last

    async def present(self) -> dict[tuple[str, str], WorkRendered]:
        return {k: w for k, w in (await self.current()).items() if w.manifest is not None}


def deployment(name: str = "web", replicas: int = 9, image: str = "app:1") -> dict[str, Any]:
    app = container("app")
    app["image"] = image
    obj = manifest(
        "apps/v1",
        "Deployment",
        {"replicas": replicas, "template": template(pod_spec(app, serviceAccountName="runner"))},
        name=name,
    )
    obj["metadata"].update({"uid": f"uid-{name}", "generation": 1})
    return obj


CONFIG = manifest("v1", "ConfigMap", name="settings", data={"mode": "prod"})
ACCOUNT = manifest("v1", "ServiceAccount", name="runner")
CONFIG_REF, ACCOUNT_REF = ObjectRef.of(CONFIG), ObjectRef.of(ACCOUNT)
WEB = ObjectRef.of(deployment())


@pytest.fixture
def harness() -> Harness:
    h = Harness()
    h.hub.add(CONFIG)
    h.hub.add(ACCOUNT)
    return h


async def test_split_deployment_gets_its_share_and_its_dependencies_on_each_cluster(
    harness: Harness,
) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF, ACCOUNT_REF)
    assert await harness.works() == []  # no decision yet: nothing to render
    await harness.decide(obj, {"a": 3, "b": 3, "c": 3})

    works = await harness.works()
    assert [(w.ref.kind, w.cluster) for w in works] == [
        ("ServiceAccount", "a"),
        ("ServiceAccount", "b"),
        ("ServiceAccount", "c"),
        ("ConfigMap", "a"),
        ("ConfigMap", "b"),
        ("ConfigMap", "c"),
        ("Deployment", "a"),
        ("Deployment", "b"),
        ("Deployment", "c"),
    ]
    for work in works:
        assert work.manifest is not None and work.decision_id == "d-1"
        if work.ref.kind == "Deployment":
            assert work.manifest["spec"]["replicas"] == 3
            assert work.dependency_of == []
        else:
            assert work.dependency_of == [WEB]


async def test_a_cluster_leaving_removes_the_object_and_its_dependencies_there(
    harness: Harness,
) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF, ACCOUNT_REF)
    await harness.decide(obj, {"a": 3, "b": 3, "c": 3})
    await harness.decide(obj, {"a": 5, "b": 4}, decision="d-2")

    present = await harness.present()
    assert sorted(present) == sorted(
        (ref.key, cluster) for ref in (WEB, CONFIG_REF, ACCOUNT_REF) for cluster in ("a", "b")
    )
    assert present[(WEB.key, "a")].manifest["spec"]["replicas"] == 5  # type: ignore[index]
    removed = [w for w in (await harness.current()).values() if w.manifest is None]
    assert sorted((w.ref.kind, w.cluster) for w in removed) == [
        ("ConfigMap", "c"),
        ("Deployment", "c"),
        ("ServiceAccount", "c"),
    ]


async def test_a_shared_dependency_stays_until_its_last_dependent_leaves(harness: Harness) -> None:
    web, api = deployment("web", 3), deployment("api", 3)
    for obj in (web, api):
        await harness.analyze(obj, CONFIG_REF)
        await harness.decide(obj, {"a": 3})
    # Published when its first dependent arrived; the second one changes nothing there.
    assert (await harness.present())[(CONFIG_REF.key, "a")].dependency_of == [WEB]

    await harness.analyze(web, CONFIG_REF, deleted=True)
    present = await harness.present()
    assert (WEB.key, "a") not in present
    assert (CONFIG_REF.key, "a") in present
    entry = await harness.dependents.get(CONFIG_REF.key)
    assert entry is not None and entry.value.clusters == {"a": [ObjectRef.of(api)]}

    await harness.decide(api, {}, decision="d-2", deleted=True)
    assert await harness.present() == {}
    assert await harness.dependents.get(CONFIG_REF.key) is None


async def test_deleting_the_object_removes_every_work_and_its_record(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF, ACCOUNT_REF)
    await harness.decide(obj, {"a": 3, "b": 3, "c": 3})
    await harness.decide(obj, {}, decision="d-2", deleted=True)
    assert await harness.present() == {}
    assert len(await harness.current()) == 9
    # The analysis is kept until it says deleted too (a re-created object's new
    # analysis may arrive before the old object's deleted decision).
    assert await harness.objects.get(WEB.key) is not None
    await harness.analyze(obj, deleted=True)
    assert await harness.objects.get(WEB.key) is None
    assert len(await harness.current()) == 9


async def test_retiring_cluster_keeps_its_manifest(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF)
    await harness.decide(obj, {"a": 3, "b": 6}, retiring=("b",))
    present = await harness.present()
    assert present[(WEB.key, "b")].state is PlacementState.RETIRING
    assert present[(WEB.key, "a")].state is PlacementState.ACTIVE
    assert (CONFIG_REF.key, "b") in present


async def test_a_new_analysis_re_renders_without_a_new_decision(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(obj)
    await harness.decide(obj, {"a": 9})
    await harness.analyze(deployment(image="app:2"))
    manifest_now = (await harness.present())[(WEB.key, "a")].manifest
    assert manifest_now is not None
    assert manifest_now["spec"]["template"]["spec"]["containers"][0]["image"] == "app:2"


async def test_handling_an_event_again_publishes_nothing_new(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF)
    await harness.decide(obj, {"a": 4, "b": 5})
    before = len(await harness.works())
    await harness.decide(obj, {"a": 4, "b": 5})
    assert len(await harness.works()) == before


async def test_a_stale_analysis_is_ignored(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(deployment(image="app:2"))
    harness.revision = -1  # the next analysis is older than the one taken in
    await harness.analyze(obj)
    entry = await harness.objects.get(WEB.key)
    assert entry is not None and entry.value.analyzed is not None
    assert (
        entry.value.analyzed.object["spec"]["template"]["spec"]["containers"][0]["image"] == "app:2"
    )


async def test_a_failed_transformation_fails_its_cluster_only_with_a_warning(
    harness: Harness,
) -> None:
    harness.hub.catalog[("ClusterTransformation", None, "mirror")] = (
        TransformationSpec.model_validate(
            {
                "transformations": [
                    {
                        "targetClusters": ["b"],
                        "patchType": "json",
                        "patch": [{"op": "test", "path": "/spec/replicas", "value": 1}],
                    },
                    {
                        "targetSelector": {"matchLabels": {"mirror": "eu"}},
                        "patchType": "merge",
                        "patch": {"metadata": {"labels": {"mirrored": "yes"}}},
                    },
                ]
            }
        )
    )
    harness.hub.cluster_facts["a"] = ClusterFacts("a", {"mirror": "eu"})
    obj = deployment()
    obj["metadata"]["annotations"] = {"flotilla.io/transformations": "mirror, nonexistent"}
    await harness.analyze(obj)
    await harness.decide(obj, {"a": 4, "b": 5})
    present = await harness.present()
    assert sorted(present) == [(WEB.key, "a")]
    assert present[(WEB.key, "a")].manifest["metadata"]["labels"]["mirrored"] == "yes"  # type: ignore[index]
    reasons = {reason: message for _, reason, message in harness.reporter.warnings}
    assert "nonexistent" in reasons["TransformationNotFound"]
    assert "ClusterTransformation mirror" in reasons["TransformationFailed"]
    assert "cluster b" in reasons["TransformationFailed"]


async def test_a_cluster_without_the_type_gets_no_work_and_a_warning(harness: Harness) -> None:
    from flotilla.common.api import GroupVersionKind

    harness.hub.cluster_facts["old"] = ClusterFacts(
        "old", api_resources=frozenset({GroupVersionKind("", "v1", "Pod")})
    )
    obj = deployment()
    await harness.analyze(obj)
    await harness.decide(obj, {"old": 4, "new": 5})
    assert sorted(await harness.present()) == [(WEB.key, "new")]
    assert [(r, "cluster old" in m) for _, r, m in harness.reporter.warnings] == [
        ("IncompatibleCluster", True)
    ]


async def test_config_changes_of_transformations_forget_the_cache(harness: Harness) -> None:
    change = events.ConfigChanged(
        ref=ObjectRef(api_version="flotilla.io/v1alpha1", kind="ClusterTransformation", name="m"),
        object={},
    )
    envelope = events.envelope(change, key=change.ref.key, producer="test")
    await harness.transformer.on_config_changed(Received.of(envelope))
    assert harness.hub.forgotten == 1


class RoundTripBucket(MemoryBucket):
    """A bucket whose reads and writes yield to the loop, as a JetStream round trip
    does; it counts the compare-and-sets that lost."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0

    async def get(self, key: str) -> Any:
        await asyncio.sleep(0)
        return await super().get(key)

    async def create(self, key: str, data: bytes) -> int:
        await asyncio.sleep(0)
        try:
            return await super().create(key, data)
        except Conflict:
            self.conflicts += 1
            raise

    async def update(self, key: str, data: bytes, revision: int) -> int:
        await asyncio.sleep(0)
        try:
            return await super().update(key, data, revision)
        except Conflict:
            self.conflicts += 1
            raise


async def test_renders_sharing_a_dependency_at_once_update_its_dependents_in_turn() -> None:
    """Twenty objects of one namespace placed at once all need its ConfigMap: one
    replica updates the shared dependents record one render at a time, so no
    compare-and-set is lost (each loss re-reads the whole, growing record)."""
    harness = Harness()
    harness.hub.add(CONFIG)
    bucket = RoundTripBucket()
    harness.transformer.dependents = harness.dependents = Store(bucket, DependentsRecord)
    objs = [deployment(f"web-{i}", 3) for i in range(20)]
    for obj in objs:
        await harness.analyze(obj, CONFIG_REF)
    await asyncio.gather(*(harness.decide(obj, {"a": 3}) for obj in objs))

    entry = await harness.dependents.get(CONFIG_REF.key)
    assert entry is not None
    assert entry.value.clusters == {"a": sorted(map(ObjectRef.of, objs), key=lambda r: r.key)}
    assert bucket.conflicts == 0
    assert len(harness.transformer._dependency_locks) == 0, "no lock outlives its updates"
    # The renders that updated the record before the first one's publish was
    # recorded wait for that publish rather than sending the same work again.
    assert [w.ref for w in await harness.works() if w.ref.kind == "ConfigMap"] == [CONFIG_REF]
    assert harness.transformer._publishing == {}


async def test_a_render_waiting_on_another_ones_dependency_work_sends_it_if_that_failed() -> None:
    harness = Harness()
    harness.hub.add(CONFIG)
    harness.transformer.dependents = harness.dependents = Store(RoundTripBucket(), DependentsRecord)
    web, api = deployment("web", 3), deployment("api", 3)
    for obj in (web, api):
        await harness.analyze(obj, CONFIG_REF)
    publish = harness.bus.publish_batch
    calls: list[list[str]] = []

    async def first_fails(batch: Any) -> None:
        calls.append([envelope.payload.ref.kind for envelope in batch])
        if len(calls) == 1:
            await asyncio.sleep(0.05)  # the other render updates the record meanwhile
            raise ConnectionError("bus down")
        await publish(batch)

    harness.bus.publish_batch = first_fails  # type: ignore[method-assign]
    results = await asyncio.gather(
        harness.decide(web, {"a": 3}), harness.decide(api, {"a": 3}), return_exceptions=True
    )
    assert isinstance(results[0], ConnectionError) and results[1] is None
    assert calls == [["ConfigMap", "Deployment"], ["Deployment"], ["ConfigMap"]]
    assert (CONFIG_REF.key, "a") in await harness.present()
    assert harness.transformer._publishing == {}


async def test_a_dependency_removed_while_another_object_takes_it_is_published_again(
    harness: Harness,
) -> None:
    """The re-check after a removal: someone needs the dependency there by now."""
    web = deployment("web", 3)
    await harness.analyze(web, CONFIG_REF)
    await harness.decide(web, {"a": 3})
    # Another replica added "api" as a dependent between this one's update and its publish.
    original = harness.transformer._dependents_update
    api = ObjectRef.of(deployment("api"))

    async def racing(dependency: ObjectRef, dependent: ObjectRef, *rest: Any) -> Any:
        result = await original(dependency, dependent, *rest)
        entry = await harness.dependents.get(dependency.key)
        await harness.dependents.write(
            dependency.key,
            DependentsRecord(ref=dependency, clusters={"a": [api]}),
            entry.revision if entry else 0,
        )
        return result

    harness.transformer._dependents_update = racing  # type: ignore[method-assign]
    await harness.decide(web, {}, decision="d-2", deleted=True)
    last = (await harness.current())[(CONFIG_REF.key, "a")]
    assert last.manifest is not None and last.dependency_of == [api]


async def test_a_cluster_missing_from_the_cache_is_read_fresh(harness: Harness) -> None:
    harness.hub.cluster_facts["a"] = ClusterFacts("a")
    obj = deployment()
    await harness.analyze(obj)
    await harness.decide(obj, {"a": 9})
    assert harness.hub.fresh_reads == 0
    await harness.decide(obj, {"a": 4, "new": 5}, decision="d-2")
    assert harness.hub.fresh_reads == 1


async def test_an_updated_dependency_reaches_the_clusters_that_need_it(harness: Harness) -> None:
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF)
    await harness.decide(obj, {"a": 4, "b": 5})
    updated = copy.deepcopy(CONFIG)
    updated["data"] = {"mode": "debug"}
    await harness.analyze(updated, strategy=Strategy.AS_NEEDED)
    present = await harness.present()
    for cluster in ("a", "b"):
        work = present[(CONFIG_REF.key, cluster)]
        assert work.manifest is not None and work.manifest["data"] == {"mode": "debug"}
        assert work.dependency_of == [WEB]
    await harness.analyze(updated, strategy=Strategy.AS_NEEDED, deleted=True)
    assert sorted(await harness.present()) == [(WEB.key, "a"), (WEB.key, "b")]


async def test_clusters_kept_off_for_lacking_the_type_are_named_in_a_warning(
    harness: Harness,
) -> None:
    from flotilla.common.api import GroupVersionKind

    pods_only = frozenset({GroupVersionKind("", "v1", "Pod")})
    harness.hub.cluster_facts.update(
        {
            "old": ClusterFacts("old", api_resources=pods_only),
            "full": ClusterFacts("full", {"env": "prod"}, api_resources=pods_only),
            "unreported": ClusterFacts("unreported"),
        }
    )
    obj = deployment()
    await harness.analyze(obj)
    await harness.decide(
        obj,
        {"new": 9},
        rejections={"old": ["x"], "unreported": ["y"], "full": ["z"], "gone": ["w"]},
    )
    assert harness.reporter.warnings == [
        (
            "web",
            "IncompatibleCluster",
            "not placed on clusters full, old: they do not serve apps/v1, Kind=Deployment",
        )
    ]


async def test_a_decision_keeping_an_object_off_for_other_reasons_reads_its_record_once(
    harness: Harness,
) -> None:
    """A drain's decisions all keep the object off the drained cluster: that it
    serves the type is known from the clusters alone, without the object's record."""
    harness.hub.cluster_facts.update(
        {"drained": ClusterFacts("drained"), "new": ClusterFacts("new")}
    )
    obj = deployment()
    await harness.analyze(obj)
    reads = 0
    real_get = harness.objects.get

    async def counted(key: str) -> Any:
        nonlocal reads
        reads += 1
        return await real_get(key)

    harness.objects.get = counted  # type: ignore[method-assign]
    await harness.decide(obj, {"new": 9}, rejections={"drained": ["unschedulable"]})
    assert reads == 1  # the reconciliation's own
    assert harness.reporter.warnings == []


async def test_the_objects_namespace_goes_first_and_leaves_with_its_last_object(
    harness: Harness,
) -> None:
    harness.hub.add(manifest("v1", "Namespace", name=NS, namespace=None))
    namespace = ObjectRef(api_version="v1", kind="Namespace", name=NS)
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF)
    await harness.decide(obj, {"a": 9})
    assert [w.ref.kind for w in await harness.works()] == ["Namespace", "ConfigMap", "Deployment"]
    assert (await harness.present())[(namespace.key, "a")].dependency_of == [WEB]
    await harness.decide(obj, {}, decision="d-2", deleted=True)
    assert await harness.present() == {}


async def test_a_namespace_of_many_objects_is_published_once_per_change(harness: Harness) -> None:
    """Each further object of a namespace changes nothing about its Namespace on a
    cluster: its work goes out when the first one arrives and again only when
    what it renders to changes; it names a few dependents, however many there are."""
    namespace = manifest("v1", "Namespace", name=NS, namespace=None)
    harness.hub.add(namespace)
    ns_ref = ObjectRef.of(namespace)
    objs = [deployment(f"web-{i:02}", 3) for i in range(30)]

    async def namespace_works() -> list[WorkRendered]:
        return [w for w in await harness.works() if w.ref.key == ns_ref.key]

    for obj in objs:
        await harness.analyze(obj)
        await harness.decide(obj, {"a": 3})
    works = await namespace_works()
    assert len(works) == 1
    assert works[0].manifest is not None and works[0].dependency_of == [ObjectRef.of(objs[0])]
    entry = await harness.dependents.get(ns_ref.key)
    assert entry is not None and len(entry.value.clusters["a"]) == 30

    # Rendering an object again (a new decision) publishes nothing new for it either.
    await harness.decide(objs[5], {"a": 3}, decision="d-2")
    assert len(await namespace_works()) == 1

    # The Namespace changed on the hub (no policy selects it, so no analysis of its
    # own says so): the next render of any of its objects carries the change, once.
    labelled = copy.deepcopy(namespace)
    labelled["metadata"]["labels"] = {"team": "shop"}
    harness.hub.add(labelled)
    await harness.decide(objs[7], {"a": 3}, decision="d-2")
    await harness.decide(objs[8], {"a": 3}, decision="d-2")
    works = await namespace_works()
    assert len(works) == 2
    assert works[-1].manifest is not None
    assert works[-1].manifest["metadata"]["labels"]["team"] == "shop"
    shown = sorted(map(ObjectRef.of, objs), key=lambda r: r.key)[: service.DEPENDENCY_OF_SHOWN]
    assert works[-1].dependency_of == shown

    for obj in objs[:-1]:
        await harness.analyze(obj, deleted=True)
    present = await harness.present()
    assert (ns_ref.key, "a") in present and len(await namespace_works()) == 2
    await harness.analyze(objs[-1], deleted=True)
    assert await harness.present() == {}
    assert (await namespace_works())[-1].manifest is None
    assert await harness.dependents.get(ns_ref.key) is None


async def test_a_dependency_whose_publish_failed_is_published_when_the_event_comes_again(
    harness: Harness,
) -> None:
    """The dependents record is written before the publish; the digest of what was
    published only after it, so a failed publish does not count as published."""
    obj = deployment()
    await harness.analyze(obj, CONFIG_REF)
    publish = harness.bus.publish_batch

    async def failing(batch: Any) -> None:
        raise ConnectionError("bus down")

    harness.bus.publish_batch = failing  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await harness.decide(obj, {"a": 3})
    entry = await harness.dependents.get(CONFIG_REF.key)
    assert entry is not None and entry.value.clusters == {"a": [WEB]}
    harness.bus.publish_batch = publish  # type: ignore[method-assign]
    await harness.decide(obj, {"a": 3})
    assert sorted(await harness.present()) == sorted([(CONFIG_REF.key, "a"), (WEB.key, "a")])


async def test_a_decision_sends_only_the_works_it_changes(harness: Harness) -> None:
    """A drain's decisions: the share moved off ``a`` (kept Retiring), then ``a``
    released. ``b``'s copy is the same throughout and is sent once."""
    obj = deployment(replicas=2)
    await harness.analyze(obj)
    await harness.decide(obj, {"a": 1, "b": 1})
    await harness.decide(obj, {"a": 1, "b": 1, "c": 1}, decision="d-2", retiring=("a",))
    await harness.decide(obj, {"b": 1, "c": 1}, decision="d-3")
    sent = [(w.cluster, w.decision_id, w.manifest is not None) for w in await harness.works()]
    assert sent == [
        ("a", "d-1", True),
        ("b", "d-1", True),
        ("c", "d-2", True),  # a's copy, Retiring now, is what it was
        ("a", "d-3", False),
    ]
    # A changed share, a changed object, or a cluster coming back is sent again.
    await harness.decide(obj, {"b": 2, "c": 1}, decision="d-4")
    await harness.analyze(deployment(replicas=2, image="app:2"))
    await harness.decide(obj, {"a": 1, "b": 2, "c": 1}, decision="d-5")
    assert [(w.cluster, w.decision_id) for w in (await harness.works())[4:]] == [
        ("b", "d-4"),
        ("b", "d-4"),
        ("c", "d-4"),
        ("a", "d-5"),
    ]
    entry = await harness.objects.get(WEB.key)
    assert entry is not None and sorted(entry.value.published) == ["a", "b", "c"]
