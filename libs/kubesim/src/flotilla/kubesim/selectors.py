"""Label- and field-selector strings, parsed once per request and matched per object.

The grammar is upstream's (`k8s.io/apimachinery/pkg/labels`): `a=b`, `a==b`, `a!=b`,
`a in (x,y)`, `a notin (x)`, `a`, `!a`, and the numeric `a>1`/`a<1`. Hand-written
because the only maintained parsers are Go; Python clients send these strings and
never parse them. Field selectors accept any dotted path (upstream restricts the set
per kind); unknown paths simply compare against "".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from flotilla.kubesim.errors import bad_request

Matcher = Callable[[Mapping[str, str]], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")
_SET_RE = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_CMP_RE = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>.*)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `( )`."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _check_key(key: str, selector: str) -> str:
    if not _KEY_RE.match(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {selector!r}")
    return key


def _check_value(value: str, selector: str) -> str:
    if not _VALUE_RE.match(value):
        raise bad_request(
            f"unable to parse requirement: invalid label value {value!r} in {selector!r}"
        )
    return value


def _requirement(text: str, selector: str) -> Matcher:
    if text.startswith("!"):
        key = _check_key(text[1:].strip(), selector)
        return lambda labels: key not in labels
    m = _SET_RE.match(text)
    if m:
        key = m["key"]
        values = frozenset(
            _check_value(v.strip(), selector) for v in m["values"].split(",") if v.strip()
        )
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    m = _CMP_RE.match(text)
    if m:
        key, op, value = m["key"], m["op"], m["value"].strip()
        if op in ("=", "=="):
            _check_value(value, selector)
            return lambda labels: key in labels and labels[key] == value
        if op == "!=":
            _check_value(value, selector)
            return lambda labels: labels.get(key) != value
        try:
            bound = int(value)
        except ValueError:
            raise bad_request(f"unable to parse requirement: {value!r} is not an integer") from None
        greater = op == ">"

        def compare(labels: Mapping[str, str]) -> bool:
            try:
                actual = int(labels[key])
            except (KeyError, ValueError):
                return False
            return actual > bound if greater else actual < bound

        return compare
    key = _check_key(text, selector)
    return lambda labels: key in labels


def parse_label_selector(selector: str | None) -> Matcher | None:
    """A predicate over a labels mapping, or None when the selector selects everything."""
    if selector is None or not selector.strip():
        return None
    requirements = [_requirement(part, selector) for part in _split_top_level(selector)]
    if len(requirements) == 1:
        return requirements[0]
    return lambda labels: all(req(labels) for req in requirements)


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = obj.get("metadata", {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _field_value(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    current: Any = obj
    for part in path:
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


ObjectMatcher = Callable[[Mapping[str, Any]], bool]


def parse_field_selector(selector: str | None) -> ObjectMatcher | None:
    """A predicate over whole objects, or None when the selector selects everything."""
    if selector is None or not selector.strip():
        return None
    checks: list[tuple[tuple[str, ...], bool, str]] = []
    for part in _split_top_level(selector):
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(==|!=|=)\s*(.*)$", part)
        if m is None:
            raise bad_request(f"invalid field selector: {part!r}")
        checks.append((tuple(m[1].split(".")), m[2] != "!=", m[3].strip()))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) == equal for path, equal, value in checks)

    return matches


def selector_from_label_selector(label_selector: Mapping[str, Any] | None) -> str:
    """Render a `metav1.LabelSelector` (matchLabels/matchExpressions) as a selector string."""
    if not label_selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((label_selector.get("matchLabels") or {}).items())]
    for expr in label_selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise bad_request(f"unknown label selector operator {op!r}")
    return ",".join(parts)
