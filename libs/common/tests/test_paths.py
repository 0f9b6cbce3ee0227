import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.common import paths
from flotilla.common.paths import Field, Index, Match, PathError, Wildcard

POD_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "web"}, "annotations": {"flotilla.io/strategy": "split"}},
    "spec": {
        "replicas": 3,
        "paused": None,
        "containers": [
            {"name": "app", "image": "web:1", "ports": [{"containerPort": 80}]},
            {"name": "sidecar", "image": "proxy:2", "ports": [{"containerPort": 15001}]},
        ],
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Progressing", "status": "False"},
        ],
        "observed": True,
    },
}


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        pytest.param(".", (), id="root"),
        pytest.param(".spec.replicas", (Field("spec"), Field("replicas")), id="dotted"),
        pytest.param(".items[*]", (Field("items"), Wildcard()), id="wildcard"),
        pytest.param(".items[12]", (Field("items"), Index(12)), id="index"),
        pytest.param(
            ".containers[name=app].image",
            (Field("containers"), Match("name", "app"), Field("image")),
            id="match",
        ),
        pytest.param(
            ".c[name='a b'].x",
            (Field("c"), Match("name", "a b"), Field("x")),
            id="match-quoted-value",
        ),
        pytest.param(
            '.metadata.annotations["flotilla.io/strategy"]',
            (Field("metadata"), Field("annotations"), Field("flotilla.io/strategy")),
            id="quoted-field",
        ),
        pytest.param("[0][1]", (Index(0), Index(1)), id="leading-bracket"),
        pytest.param(".x-y.$ref._z", (Field("x-y"), Field("$ref"), Field("_z")), id="odd-names"),
    ],
)
def test_compile(path: str, steps: tuple[paths.Step, ...]) -> None:
    assert paths.compile_path(path).steps == steps


@pytest.mark.parametrize(
    ("path", "position", "message"),
    [
        pytest.param("", 0, "empty path", id="empty"),
        pytest.param("spec.replicas", 0, "a step starts with", id="no-leading-dot"),
        pytest.param(".spec..replicas", 6, "expected a field name", id="double-dot"),
        pytest.param(".spec.", 6, "expected a field name", id="trailing-dot"),
        pytest.param(".items[", 7, "an index, 'key=value'", id="open-bracket"),
        pytest.param(".items[*", 8, "expected ']'", id="unclosed-wildcard"),
        pytest.param(".items[name]", 11, "expected '='", id="selector-without-value"),
        pytest.param(".items[name=]", 12, "expected a value", id="empty-value"),
        pytest.param(".items['x]", 7, "unterminated", id="unterminated-quote"),
        pytest.param(".spec.replicas + 1", 14, "unexpected ' '", id="expression"),
        pytest.param(".a[__import__('os')]", 13, "expected '='", id="no-code"),
    ],
)
def test_bad_syntax_names_the_position(path: str, position: int, message: str) -> None:
    with pytest.raises(PathError, match=message) as raised:
        paths.compile_path(path)
    assert raised.value.position == position
    assert f"at position {position}" in str(raised.value)


def test_compiled_paths_are_cached() -> None:
    assert paths.compile_path(".spec.template") is paths.compile_path(".spec.template")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(".", [POD_TEMPLATE], id="root"),
        pytest.param(".spec.replicas", [3], id="scalar"),
        pytest.param(".spec.missing", [], id="missing"),
        pytest.param(".spec.paused", [], id="null-is-absent"),
        pytest.param(".spec.replicas.deeper", [], id="through-scalar"),
        pytest.param(".spec.containers[*].name", ["app", "sidecar"], id="wildcard"),
        pytest.param(".spec.containers[1].image", ["proxy:2"], id="index"),
        pytest.param(".spec.containers[7].image", [], id="index-out-of-range"),
        pytest.param(".spec.containers[name=app].image", ["web:1"], id="match"),
        pytest.param(".spec.containers[name=db].image", [], id="match-none"),
        pytest.param(
            ".spec.containers[*].ports[*].containerPort", [80, 15001], id="nested-wildcards"
        ),
        pytest.param(
            ".spec.containers[0].ports[containerPort=80]", [{"containerPort": 80}], id="int"
        ),
        pytest.param(".status.conditions[type=Ready].status", ["True"], id="condition"),
        pytest.param(".status[observed=true].observed", [True], id="match-on-mapping-bool"),
        pytest.param(".metadata.labels[*]", ["web"], id="wildcard-over-mapping"),
        pytest.param('.metadata.annotations["flotilla.io/strategy"]', ["split"], id="quoted"),
    ],
)
def test_get_all(path: str, expected: list[Any]) -> None:
    assert paths.get_all(POD_TEMPLATE, path) == expected


def test_get_one() -> None:
    assert paths.get_one(POD_TEMPLATE, ".spec.replicas") == 3
    assert paths.get_one(POD_TEMPLATE, ".spec.nothing", default=1) == 1
    with pytest.raises(PathError, match="selects 2 values"):
        paths.get_one(POD_TEMPLATE, ".spec.containers[*].name")


@pytest.mark.parametrize(
    ("before", "path", "value", "after"),
    [
        pytest.param({}, ".spec.replicas", 2, {"spec": {"replicas": 2}}, id="creates-mappings"),
        pytest.param(
            {"spec": {"replicas": None}}, ".spec.replicas", 2, {"spec": {"replicas": 2}}, id="null"
        ),
        pytest.param(
            {"c": [{"name": "a", "x": 1}, {"name": "b", "x": 1}]},
            ".c[name=b].x",
            2,
            {"c": [{"name": "a", "x": 1}, {"name": "b", "x": 2}]},
            id="match",
        ),
        pytest.param(
            {"c": []}, ".c[name=b].x", 2, {"c": [{"name": "b", "x": 2}]}, id="match-appends"
        ),
        pytest.param({"c": [1, 2]}, ".c[*]", 0, {"c": [0, 0]}, id="wildcard"),
        pytest.param({"c": [1, 2]}, ".c[1]", 5, {"c": [1, 5]}, id="index"),
        pytest.param(
            {"c": [{"name": "a"}]},
            ".c[name=a]",
            {"v": 1},
            {"c": [{"v": 1, "name": "a"}]},
            id="element-stays-selectable",
        ),
    ],
)
def test_set_value(before: dict[str, Any], path: str, value: Any, after: dict[str, Any]) -> None:
    paths.set_value(before, path, value)
    assert before == after


@pytest.mark.parametrize(
    ("obj", "path", "message"),
    [
        pytest.param({}, ".", "cannot replace the whole object", id="root"),
        pytest.param({"c": [1]}, ".c[3]", "out of range", id="index-out-of-range"),
        pytest.param({"c": "text"}, ".c.x", "holds a str", id="through-scalar"),
        pytest.param({"c": []}, ".c[name=a]", "only be set to an object", id="match-scalar"),
    ],
)
def test_set_value_refuses(obj: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(PathError, match=message):
        paths.set_value(obj, path, 1)


# --- properties -------------------------------------------------------------------

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-", min_size=1, max_size=8)
scalars = st.one_of(st.integers(), st.text(max_size=6), st.booleans())
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(names, inner, max_size=3)),
    max_leaves=12,
)


def _container_for(step: paths.Step) -> Any:
    return {} if isinstance(step, Field) else []


@st.composite
def object_and_path(draw: st.DrawFn) -> tuple[Any, str]:
    """A JSON-like object, surrounded by random siblings, and a path that exists in it.

    The steps are drawn first and the object is built around them, so deep paths
    with indexes and ``[name=...]`` selectors are as common as shallow ones.
    """
    steps: list[paths.Step] = [Field(draw(names))]
    for _ in range(draw(st.integers(0, 4))):
        if isinstance(steps[-1], Match):
            # A matched element is an object, and it keeps the name it is matched by.
            steps.append(Field(draw(names.filter(lambda name: name != "name"))))
        else:
            steps.append(
                draw(
                    st.one_of(
                        names.map(Field),
                        st.integers(0, 3).map(Index),
                        names.map(lambda name: Match("name", name)),
                    )
                )
            )
    root: dict[str, Any] = draw(st.dictionaries(names, json_values, max_size=3))
    node: Any = root
    for step, following in zip(steps, [*steps[1:], None], strict=True):
        child = draw(json_values) if following is None else _container_for(following)
        if isinstance(step, Field):
            node[step.name] = child
        elif isinstance(step, Index):
            fillers = draw(st.lists(json_values, min_size=step.index + 1, max_size=step.index + 3))
            node.extend(fillers)
            node[step.index] = child
        elif isinstance(step, Match):
            others = draw(st.lists(json_values, max_size=3))
            element = {**child, "name": step.value} if isinstance(child, dict) else child
            if not isinstance(element, dict):
                element = {"name": step.value, "v": child}
            node.extend(other for other in others if not step.selects(other))
            node.insert(draw(st.integers(0, len(node))), element)
            child = element
        node = child
    return root, str(paths.CompiledPath("", tuple(steps)))


@given(object_and_path(), json_values)
def test_set_then_get_round_trips(case: tuple[Any, str], value: Any) -> None:
    obj, path = case
    if path == ".":
        return
    if isinstance(paths.compile_path(path).steps[-1], Match) and not isinstance(value, dict):
        value = {"v": value}
    obj = copy.deepcopy(obj)
    paths.set_value(obj, path, value)
    got = paths.get_one(obj, path)
    if isinstance(paths.compile_path(path).steps[-1], Match):
        assert {k: v for k, v in got.items() if k != "name"} == {
            k: v for k, v in value.items() if k != "name"
        }
    else:
        assert got == value


@given(object_and_path())
def test_get_then_set_changes_nothing(case: tuple[Any, str]) -> None:
    obj, path = case
    current = paths.get_all(obj, path)
    if len(current) != 1 or path == ".":
        return
    updated = copy.deepcopy(obj)
    paths.set_value(updated, path, copy.deepcopy(current[0]))
    assert updated == obj


@given(
    st.lists(
        st.one_of(
            names.map(Field),
            st.integers(0, 99).map(Index),
            st.just(Wildcard()),
            st.builds(Match, names, st.text(alphabet="abc .:/-", min_size=1, max_size=5)),
            st.text(alphabet="abc./", min_size=1, max_size=6).map(Field),
        ),
        max_size=6,
    )
)
def test_canonical_text_parses_back(steps: list[paths.Step]) -> None:
    text = str(paths.CompiledPath("", tuple(steps)))
    assert paths.compile_path(text).steps == tuple(steps)
