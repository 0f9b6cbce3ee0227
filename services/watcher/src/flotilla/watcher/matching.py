"""Which placement policy governs a hub object, and which types to watch at all.

The watcher only streams objects some policy selects, and tags each with the one
policy that applies, so every later stage works from the same choice. Matching
is pure: it takes the object (a plain dict as the API server returns it) and the
current policies, and returns the winner.

Rules:

* A ``PlacementPolicy`` only applies to objects in its own namespace; a
  ``ClusterPlacementPolicy`` applies to objects in every namespace and to
  cluster-scoped objects. A selector's ``namespace`` narrows further.
* Within one selector every field that is set must match: ``apiVersion`` and
  ``kind`` exactly, ``name``, ``namespace``, ``labelSelector``. A policy matches
  when any of its selectors does.
* When several policies match, the highest ``priority`` wins. Ties go to the
  namespaced ``PlacementPolicy`` (the namespace owner's more specific intent beats
  a fleet-wide default), then to the policy whose name sorts first. The order is
  total, so every replica of the watcher picks the same policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from flotilla.common import labels
from flotilla.common.api import (
    ClusterPlacementPolicy,
    GroupVersionKind,
    PlacementPolicy,
    ResourceSelector,
)

Policy: TypeAlias = PlacementPolicy | ClusterPlacementPolicy


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def selector_matches(selector: ResourceSelector, obj: Mapping[str, Any]) -> bool:
    """Whether one ``resourceSelectors`` entry selects ``obj``."""
    metadata = _metadata(obj)
    if obj.get("apiVersion") != selector.api_version or obj.get("kind") != selector.kind:
        return False
    if selector.name is not None and metadata.get("name") != selector.name:
        return False
    if selector.namespace is not None and metadata.get("namespace") != selector.namespace:
        return False
    object_labels = metadata.get("labels") or {}
    return labels.matches(selector.label_selector, object_labels)


def policy_applies(policy: Policy, obj: Mapping[str, Any]) -> bool:
    """Whether ``policy`` governs ``obj`` (scope and selectors, ignoring priority)."""
    if isinstance(policy, PlacementPolicy):
        namespace = _metadata(obj).get("namespace")
        if not namespace or namespace != policy.metadata.namespace:
            return False
    return any(selector_matches(s, obj) for s in policy.spec.resource_selectors)


def precedence(policy: Policy) -> tuple[int, int, str, str]:
    """Sort key: the policy that sorts first wins."""
    scope = 0 if isinstance(policy, PlacementPolicy) else 1
    return (-policy.spec.priority, scope, policy.metadata.name, policy.metadata.namespace or "")


def matching_policies(obj: Mapping[str, Any], policies: Iterable[Policy]) -> list[Policy]:
    """Every policy that governs ``obj``, winner first."""
    return sorted((p for p in policies if policy_applies(p, obj)), key=precedence)


def select_policy(obj: Mapping[str, Any], policies: Iterable[Policy]) -> Policy | None:
    """The one policy that governs ``obj``, or None when no policy selects it."""
    matching = matching_policies(obj, policies)
    return matching[0] if matching else None


def selected_types(policies: Iterable[Policy]) -> list[GroupVersionKind]:
    """The types some policy selects, sorted: exactly what the watcher must watch."""
    return sorted({s.gvk for p in policies for s in p.spec.resource_selectors})
