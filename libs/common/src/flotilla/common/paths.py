"""The small declarative path language of ResourceInterpreters.

Type authors point Flotilla at the parts of their objects that matter (replicas,
pod templates, dependencies, status fields) with paths such as
``.spec.taskManager.podTemplate`` or ``.status.conditions[type=Ready].status``.
Paths are data, never code: they are parsed once into a tuple of steps (cached)
and then walked over plain JSON-like dicts and lists.

Grammar::

    path     := "." | step+
    step     := "." field | "[" selector "]"
    field    := [A-Za-z0-9_$-]+
    selector := "*"                 every list element (or every mapping value)
              | digits              one list element by index
              | key "=" value       list elements (or the mapping itself) whose key equals value
              | quoted              a field whose name needs quoting: ["flotilla.io/strategy"]

``value`` is either bare (up to ``]``) or quoted with ``"`` or ``'``. Reading
treats an absent field and a JSON ``null`` alike: neither yields a value, the
same way Kubernetes treats them.

Hand-written because the maintained JSONPath libraries (jsonpath-ng,
jsonpath-python) evaluate a much larger language, including filter expressions,
than a CRD author should be able to put in a cluster-scoped object; the subset
here is what ``kubectl -o jsonpath`` users already know, and writing values
(``set_value``) is something those libraries do only partially.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, MutableMapping, MutableSequence
from dataclasses import dataclass
from typing import Any, TypeAlias

_FIELD = re.compile(r"[A-Za-z0-9_$-]+")
_BARE_VALUE = re.compile(r"[^\]'\"]+")
_INDEX = re.compile(r"(\d+)\]")


class PathError(ValueError):
    """A path that cannot be parsed or used; ``position`` is the 0-based offset when known."""

    def __init__(self, path: str, message: str, position: int | None = None) -> None:
        self.path = path
        self.position = position
        where = f" at position {position}" if position is not None else ""
        pointer = f"\n  {path}\n  {' ' * position}^" if position is not None else ""
        super().__init__(f"path {path!r}{where}: {message}{pointer}")


@dataclass(frozen=True, slots=True)
class Field:
    name: str

    def __str__(self) -> str:
        if _FIELD.fullmatch(self.name):
            return f".{self.name}"
        return f"[{_quote(self.name)}]"


@dataclass(frozen=True, slots=True)
class Index:
    index: int

    def __str__(self) -> str:
        return f"[{self.index}]"


@dataclass(frozen=True, slots=True)
class Wildcard:
    def __str__(self) -> str:
        return "[*]"


@dataclass(frozen=True, slots=True)
class Match:
    key: str
    value: str

    def __str__(self) -> str:
        value = self.value if _BARE_VALUE.fullmatch(self.value) else _quote(self.value)
        return f"[{self.key}={value}]"

    def selects(self, node: Any) -> bool:
        if not isinstance(node, Mapping):
            return False
        found = node.get(self.key)
        if isinstance(found, bool):
            return ("true" if found else "false") == self.value
        return isinstance(found, str | int | float) and str(found) == self.value


Step: TypeAlias = Field | Index | Wildcard | Match


def _quote(text: str) -> str:
    quote = "'" if '"' in text else '"'
    if quote in text:
        raise ValueError(f"{text!r} contains both quote characters and cannot be written")
    return f"{quote}{text}{quote}"


@dataclass(frozen=True, slots=True)
class CompiledPath:
    """A parsed path; ``str()`` gives back its canonical text."""

    text: str
    steps: tuple[Step, ...]

    def __str__(self) -> str:
        return "".join(str(step) for step in self.steps) or "."

    @property
    def is_single(self) -> bool:
        """Whether the path can select at most one value (no ``[*]``)."""
        return not any(isinstance(step, Wildcard) for step in self.steps)


@functools.lru_cache(maxsize=4096)
def compile_path(path: str) -> CompiledPath:
    """Parse ``path`` once; raises `PathError` pointing at the offending character."""
    if path == ".":
        return CompiledPath(path, ())
    if not path:
        raise PathError(path, "empty path; use '.' for the whole object", 0)
    steps: list[Step] = []
    pos = 0
    while pos < len(path):
        char = path[pos]
        if char == ".":
            match = _FIELD.match(path, pos + 1)
            if match is None:
                raise PathError(path, "expected a field name after '.'", pos + 1)
            steps.append(Field(match.group()))
            pos = match.end()
        elif char == "[":
            step, pos = _parse_bracket(path, pos)
            steps.append(step)
        else:
            raise PathError(path, f"unexpected {char!r}; a step starts with '.' or '['", pos)
    return CompiledPath(path, tuple(steps))


def _parse_quoted(path: str, pos: int) -> tuple[str, int]:
    quote = path[pos]
    end = path.find(quote, pos + 1)
    if end < 0:
        raise PathError(path, f"unterminated {quote} quote", pos)
    return path[pos + 1 : end], end + 1


def _parse_bracket(path: str, start: int) -> tuple[Step, int]:
    pos = start + 1
    step: Step
    if path.startswith("*", pos):
        step, pos = Wildcard(), pos + 1
    elif pos < len(path) and path[pos] in "\"'":
        name, pos = _parse_quoted(path, pos)
        step = Field(name)
    elif (digits := _INDEX.match(path, pos)) is not None:
        step, pos = Index(int(digits.group(1))), digits.end(1)
    else:
        key = _FIELD.match(path, pos)
        if key is None:
            raise PathError(path, "expected '*', an index, 'key=value' or a quoted field", pos)
        pos = key.end()
        if not path.startswith("=", pos):
            raise PathError(path, "expected '=' after the key of a [key=value] selector", pos)
        pos += 1
        if pos < len(path) and path[pos] in "\"'":
            value, pos = _parse_quoted(path, pos)
        else:
            bare = _BARE_VALUE.match(path, pos)
            if bare is None:
                raise PathError(path, "expected a value after '='", pos)
            value, pos = bare.group(), bare.end()
        step = Match(key.group(), value)
    if not path.startswith("]", pos):
        raise PathError(path, "expected ']'", pos)
    return step, pos + 1


def _children(node: Any, step: Step) -> list[Any]:
    if isinstance(step, Field):
        if isinstance(node, Mapping) and node.get(step.name) is not None:
            return [node[step.name]]
        return []
    if isinstance(step, Index):
        if isinstance(node, list) and step.index < len(node):
            return [node[step.index]]
        return []
    if isinstance(step, Wildcard):
        if isinstance(node, list):
            return list(node)
        if isinstance(node, Mapping):
            return list(node.values())
        return []
    if isinstance(node, list):
        return [item for item in node if step.selects(item)]
    return [node] if step.selects(node) else []


def get_all(obj: Any, path: str | CompiledPath) -> list[Any]:
    """Every value ``path`` selects in ``obj``, in document order; nulls are left out."""
    compiled = path if isinstance(path, CompiledPath) else compile_path(path)
    nodes = [obj] if obj is not None else []
    for step in compiled.steps:
        nodes = [child for node in nodes for child in _children(node, step) if child is not None]
    return nodes


def get_one(obj: Any, path: str | CompiledPath, default: Any = None) -> Any:
    """The one value ``path`` selects, ``default`` if none; `PathError` if several."""
    values = get_all(obj, path)
    if not values:
        return default
    if len(values) > 1:
        text = path.text if isinstance(path, CompiledPath) else path
        raise PathError(text, f"selects {len(values)} values where one was expected")
    return values[0]


def set_value(obj: Any, path: str | CompiledPath, value: Any) -> int:
    """Write ``value`` at every place ``path`` selects in ``obj`` (in place).

    Missing mappings along ``.field`` steps are created, and a ``[key=value]`` step
    that matches no list element appends ``{key: value}``, so a path can be set on
    an object that does not have it yet. ``[*]`` writes to every existing element;
    an index must exist. Returns the number of places written.
    """
    compiled = path if isinstance(path, CompiledPath) else compile_path(path)
    if not compiled.steps:
        raise PathError(compiled.text, "cannot replace the whole object; name a field")
    nodes: list[Any] = [obj]
    for step in compiled.steps[:-1]:
        nodes = [child for node in nodes for child in _children_for_write(compiled, node, step)]
    last = compiled.steps[-1]
    written = 0
    for node in nodes:
        written += _write(compiled, node, last, value)
    return written


def _children_for_write(compiled: CompiledPath, node: Any, step: Step) -> list[Any]:
    if isinstance(step, Field) and isinstance(node, MutableMapping):
        if node.get(step.name) is None:
            node[step.name] = {}
        elif not isinstance(node[step.name], MutableMapping | MutableSequence):
            raise PathError(
                compiled.text,
                f"field {step.name!r} holds a {type(node[step.name]).__name__}, "
                "not an object or list",
            )
        return [node[step.name]]
    if isinstance(step, Index) and isinstance(node, MutableSequence):
        if step.index >= len(node):
            raise PathError(
                compiled.text, f"index {step.index} is out of range (list has {len(node)} items)"
            )
        if node[step.index] is None:
            node[step.index] = {}
        return [node[step.index]]
    if isinstance(step, Match) and isinstance(node, MutableSequence):
        selected = [item for item in node if step.selects(item)]
        if not selected:
            node.append({step.key: step.value})
            selected = [node[-1]]
        return selected
    return _children(node, step)


def _write(compiled: CompiledPath, node: Any, step: Step, value: Any) -> int:
    if isinstance(step, Field) and isinstance(node, MutableMapping):
        node[step.name] = value
        return 1
    if isinstance(step, Index) and isinstance(node, MutableSequence):
        if step.index >= len(node):
            raise PathError(
                compiled.text, f"index {step.index} is out of range (list has {len(node)} items)"
            )
        node[step.index] = value
        return 1
    if isinstance(step, Wildcard) and isinstance(node, MutableSequence):
        node[:] = [value] * len(node)
        return len(node)
    if isinstance(step, Wildcard) and isinstance(node, MutableMapping):
        for key in node:
            node[key] = value
        return len(node)
    if isinstance(step, Match) and isinstance(node, MutableSequence):
        # The written element must stay selectable by the same path.
        if not isinstance(value, Mapping):
            raise PathError(compiled.text, f"a {step} element can only be set to an object")
        element = dict(value)
        if not step.selects(element):
            element[step.key] = step.value
        positions = [i for i, item in enumerate(node) if step.selects(item)]
        for i in positions:
            node[i] = dict(element)
        if not positions:
            node.append(element)
            return 1
        return len(positions)
    raise PathError(
        compiled.text, f"cannot write {step} into a {type(node).__name__}; the path does not fit"
    )
