import json
from datetime import UTC, datetime

import pytest

from flotilla.common import events
from flotilla.common.errors import InvalidEvent, InvalidObject

REF = events.ObjectRef(api_version="apps/v1", kind="Deployment", name="web", namespace="default")


def analyzed(**overrides: object) -> events.Envelope:
    payload = events.ResourceAnalyzed(
        ref=REF,
        object={"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
        strategy=events.Strategy.SPLIT,
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
        (lambda w: w["payload"].__setitem__("type", "Bogus"), "payload"),
        (lambda w: w.__setitem__("schema_version", 2), "schema_version"),
        (lambda w: w.__setitem__("surprise", 1), "surprise"),
        (lambda w: w["payload"].__setitem__("replicas", -1), "replicas"),
        (lambda w: w.pop("key"), "key"),
        (lambda w: w["payload"].__setitem__("strategy", "scatter"), "strategy"),
    ],
    ids=[
        "unknown-type",
        "future-schema",
        "unknown-field",
        "negative-replicas",
        "no-key",
        "strategy",
    ],
)
def test_malformed_events_are_rejected_whole(mutate: object, message: str) -> None:
    wire = json.loads(events.encode(analyzed()))
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(InvalidEvent, match=message):
        events.decode(json.dumps(wire).encode())


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
