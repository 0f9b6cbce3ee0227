import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from flotilla.common import api, events
from flotilla.common.errors import InvalidEvent, InvalidObject
from flotilla.common.interpreters import Follow, Registry

REF = events.ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="default")


def analyzed(**overrides: object) -> events.Envelope:
    payload = events.ResourceAnalyzed(
        ref=REF,
        object={"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
        strategy=api.Strategy.SPLIT,
        replicas=3,
        requests={"cpu": 250, "memory": 2**27},
        dependencies=[events.Dependency(api_version="v1", kind="ConfigMap", name="cfg")],
    )
    return events.envelope(
        payload,
        key=REF.key,
        producer="depdetector",
        uid="u-1",
        generation=2,
        revision=17,
        produced_at=datetime(2026, 1, 1, tzinfo=UTC),
        **overrides,  # type: ignore[arg-type]
    )


def test_round_trip_keeps_every_field() -> None:
    event = analyzed()
    decoded = events.decode(events.encode(event))
    assert decoded == event
    assert decoded.type == "ResourceAnalyzed"
    assert isinstance(decoded.payload, events.ResourceAnalyzed)
    assert decoded.payload.dependencies[0].api_version == "v1"


def test_wire_format_uses_kubernetes_field_names() -> None:
    wire = json.loads(events.encode(analyzed()))
    assert wire["payload"]["ref"]["apiVersion"] == "apps/v1"
    assert wire["schema_version"] == 1


def test_id_is_deterministic_and_distinguishes_revisions() -> None:
    assert analyzed().id == analyzed().id
    later = events.envelope(
        analyzed().payload, key=REF.key, producer="x", uid="u-1", generation=2, revision=18
    )
    assert later.id != analyzed().id


def test_object_ref_key_and_of() -> None:
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}}
    assert events.ObjectRef.of(obj).key == "v1/Namespace/_/prod"
    assert REF.key == "apps/v1/Deployment/default/web"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda w: w["payload"].__setitem__("replicas", -1), "replicas", id="negative-replicas"
        ),
        pytest.param(
            lambda w: w["payload"].__setitem__("replicas", "three"), "replicas", id="wrong-type"
        ),
        pytest.param(lambda w: w.pop("key"), "key", id="no-key"),
        pytest.param(
            lambda w: w["payload"].__setitem__("strategy", "scatter"), "strategy", id="strategy"
        ),
        pytest.param(
            lambda w: w["payload"]["policy_spec"].__setitem__("maxClusters", 0),
            r"policy_spec\.maxClusters: .*maxClusters must be 1 or more",
            id="invalid-policy",
        ),
        pytest.param(
            lambda w: w["payload"]["follows"][0].__setitem__("pod_labels", "app=web"),
            "follows",
            id="wrong-type-deep-down",
        ),
    ],
)
def test_malformed_events_are_rejected_whole(mutate: object, message: str) -> None:
    wire = json.loads(events.encode(governed()))
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(InvalidEvent, match=message):
        events.decode(json.dumps(wire).encode())


def governed() -> events.Envelope:
    """An analysis with every optional part set: policy, interpreter, follows."""
    base = analyzed()
    assert isinstance(base.payload, events.ResourceAnalyzed)
    payload = base.payload.model_copy(
        update={
            "policy": events.PolicyRef(kind="PlacementPolicy", name="p", namespace="default"),
            "policy_spec": api.PlacementPolicySpec.model_validate(
                {
                    "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                    "strategy": "copy",
                    "maxClusters": 2,
                }
            ),
            "interpreter": Registry.with_builtins()
            .lookup(api.GroupVersionKind("apps", "v1", "Deployment"))
            .spec,
            "follows": [Follow(namespace="default", pod_labels={"app": "web"})],
        }
    )
    return base.model_copy(update={"payload": payload})


def test_typed_policy_interpreter_and_follows_round_trip() -> None:
    event = governed()
    decoded = events.decode(events.encode(event))
    assert decoded == event
    assert isinstance(decoded.payload, events.ResourceAnalyzed)
    assert decoded.payload.policy_spec is not None
    assert decoded.payload.policy_spec.strategy is api.Strategy.COPY
    assert decoded.payload.default_strategy is api.Strategy.SPLIT
    interpreter = decoded.payload.interpreter
    assert interpreter is not None and interpreter.replicas is not None
    assert interpreter.replicas.path == ".spec.replicas"
    assert [r.path for r in interpreter.status_aggregation][:1] == [".status.replicas"]


def test_a_newer_producers_added_optional_fields_are_ignored_at_every_depth() -> None:
    """A replica of the previous release reads what an upgraded producer sends."""
    event = governed()
    wire = json.loads(events.encode(event))
    wire["sent_by_region"] = "eu"
    wire["payload"]["priority_class"] = "high"
    wire["payload"]["ref"]["uid"] = "u-1"
    wire["payload"]["dependencies"][0]["optional"] = True
    wire["payload"]["policy_spec"]["budget"] = {"maxUnavailable": 1}
    wire["payload"]["interpreter"]["health"] = {"path": ".status.ready"}
    wire["payload"]["follows"][0]["weight"] = 3
    assert events.decode(json.dumps(wire).encode()) == event


def test_an_event_from_before_payload_versions_is_version_1() -> None:
    wire = json.loads(events.encode(analyzed()))
    del wire["payload"]["version"]
    decoded = events.decode(json.dumps(wire).encode())
    assert decoded.payload.version == events.ResourceAnalyzed.VERSION == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda w: w.__setitem__("schema_version", 2),
            "envelope schema version 2 is not supported: this consumer reads envelope version 1",
            id="newer-envelope",
        ),
        pytest.param(
            lambda w: w["payload"].__setitem__("version", 2),
            "ResourceAnalyzed version 2 is not supported: "
            "this consumer reads ResourceAnalyzed version 1",
            id="newer-payload",
        ),
        pytest.param(
            lambda w: w["payload"].update(version=3, replicas={"min": 1, "max": 3}),
            "ResourceAnalyzed version 3 is not supported: "
            "this consumer reads ResourceAnalyzed version 1",
            id="newer-payload-that-also-fails-validation",
        ),
        pytest.param(
            lambda w: w["payload"].update(type="WorkloadMigrated", version=1),
            "unknown event type 'WorkloadMigrated' \\(version 1\\): this consumer reads "
            "ResourceObserved, ",
            id="unknown-type",
        ),
    ],
)
def test_an_incompatible_version_is_refused_naming_both_versions(
    mutate: object, message: str
) -> None:
    wire = json.loads(events.encode(analyzed()))
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(InvalidEvent, match=f"^{message}"):
        events.decode(json.dumps(wire).encode())


def test_what_we_produce_never_carries_an_unknown_field() -> None:
    with pytest.raises(ValidationError, match="surprise"):
        events.ResourceAnalyzed.model_validate({**analyzed().payload.model_dump(), "surprise": 1})
    with pytest.raises(ValidationError, match="surprise"):
        Follow.model_validate({"name": "web", "surprise": 1})
    wire = json.loads(events.encode(governed()))
    assert set(wire["payload"]) == set(events.ResourceAnalyzed.model_fields)
    assert wire["payload"]["version"] == 1


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b"{}"], ids=repr)
def test_garbage_is_an_invalid_event(data: bytes) -> None:
    with pytest.raises(InvalidEvent, match="not a valid Flotilla event"):
        events.decode(data)


def test_every_event_type_is_in_the_union() -> None:
    names = {cls.__name__ for cls in events.EVENT_PAYLOADS}
    assert names == set(events.EVENT_TYPES)


def nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"leaf": 1}
    for _ in range(depth):
        value = {"inner": value}
    return value


@pytest.mark.parametrize("depth", [10, 250, 600], ids=["shallow", "250 levels", "600 levels"])
def test_deeply_nested_objects_round_trip(depth: int) -> None:
    """Past pydantic's own limits (about 200 levels to parse, 250 to serialize)."""
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "spec": nested(depth)}
    event = analyzed()
    event = event.model_copy(update={"payload": event.payload.model_copy(update={"object": obj})})
    data = events.encode(event)
    assert json.loads(data)["payload"]["object"] == obj
    assert events.decode(data) == event


def test_an_object_nested_beyond_any_parser_is_refused_as_permanent() -> None:
    obj = {"spec": nested(5000)}
    event = analyzed()
    event = event.model_copy(update={"payload": event.payload.model_copy(update={"object": obj})})
    with pytest.raises(InvalidObject) as caught:
        events.encode(event)
    assert caught.value.reason == "ObjectTooDeep"
    hand_made = b'{"a":' * 5000 + b"1" + b"}" * 5000
    with pytest.raises(InvalidEvent):
        events.decode(hand_made)


def test_placement_decided_reads_rejections_in_either_shape() -> None:
    """`rejected` (reason → clusters) is what producers send now; `rejections`
    (cluster → reasons) is what older ones sent, and still reads the same."""
    ref = events.ObjectRef(api_version="v1", kind="Pod", name="p", namespace="ns")
    grouped = events.PlacementDecided(
        ref=ref, decision_id="d", clusters=[], rejected={"taints: gpu": ["a", "b"], "cordon": ["c"]}
    )
    older = events.PlacementDecided(
        ref=ref, decision_id="d", clusters=[], rejections={"b": ["taints: gpu"], "c": ["cordon"]}
    )
    for decided in (grouped, older):
        assert decided.reasons_for("b") == ["taints: gpu"]
        assert decided.reasons_for("c") == ["cordon"]
        assert decided.reasons_for("z") == []
    assert grouped.rejected_clusters() == ["a", "b", "c"]
    assert older.rejected_clusters() == ["b", "c"]
    # A version-1 reader of the new shape sees an event it can decode.
    assert events.PlacementDecided.VERSION == 1
    assert "rejected" in grouped.model_dump(mode="json")
