"""The dependency detector service: `ResourceObserved` in, `ResourceAnalyzed` out.

For each observed object it reads the object through its interpreter (strategy,
replicas, per-replica requests, components), detects what the object depends on,
merges that with the user's own ``flotilla.io/dependencies`` entries, writes the
merged list back to the hub object when it differs, and publishes the analysis.
The pure work is `interpreters` and `detection`; this module is the edge: bus
handlers, the hub writes and Kubernetes Events.

Decisions where the brief is silent:

* **Strategy** in the analysis is the effective one
  (`flotilla.common.api.effective_strategy`); the analysis also carries the
  interpreter it was made with and the resolved ``follows``, which later stages
  need (replicas and pod-template paths, status aggregation, what an
  ``as-needed`` object goes along with).
* **The annotation write** is a merge patch of that one annotation carrying the
  observed ``resourceVersion`` as a precondition, so a concurrent edit of the
  user's entries is never overwritten with stale ones. On 409 the object is read
  again and the value recomputed from the fresh copy (a few times, then the
  event is retried later). A 404 skips the write: the deletion event follows.
  The write happens before the event is published, so an acknowledged event
  means the annotation is durable.
* **Missing dependencies** (not found, or of a type the hub does not serve —
  e.g. a user entry naming a Crossplane ``Database`` that is not installed) are
  listed in one ``DependencyMissing`` Warning Event per object and analysis goes
  on: the dependency may be created later, and the transformer syncs what exists.
* **Invalid input** (a bad strategy annotation, an unparseable dependencies
  annotation, an invalid ResourceInterpreter) raises `InvalidObject` saying what
  to fix: the kit dead-letters that one message and writes the Warning Event on
  the object, while other objects keep flowing. A fixed object is a new
  observation and flows again.
* **Interpreters**: every replica lists the hub's ResourceInterpreters at start,
  applies the `ConfigChanged` events it consumes at once, and re-lists every
  `INTERPRETER_REFRESH` seconds, because a `ConfigChanged` reaches only the
  replica owning its key's partition. A `ResourceObserved` that carries its
  type's interpreter (the watcher attaches it, and re-publishes the objects of a
  type whose interpreter changed) is analysed with exactly that one, so an
  interpreter change re-analyses what it governs without racing the registry.
* **Dependency scope** (`detection.refusal`): a reference outside what the object
  may depend on (another namespace, Flotilla's own namespace, a cluster-scoped
  kind not on the allow-list) is left out of the analysis and named in one
  ``DependencyRefused`` Warning Event; refused *detected* entries are not written
  to the annotation either, the user's own entries stay as written.
* **Reporting is best effort**: a Warning Event that cannot be recorded, or a
  dependency whose existence cannot be checked, is logged; the analysis goes on.
* **Stale events**: an observation with a lower revision than one already
  analysed for the same object (same uid) on this replica is acknowledged and
  dropped by the kit's stale-event middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from pydantic import Field, ValidationError

from flotilla.common import events, kube
from flotilla.common.api import (
    API_VERSION,
    DEPENDENCIES_ANNOTATION,
    DependencyEntry,
    GroupVersionKind,
    InvalidObjectError,
    ResourceInterpreter,
    ResourceInterpreterSpec,
    dump_dependencies,
    parse_as,
)
from flotilla.common.config import DEFAULT_SYSTEM_NAMESPACE, Settings
from flotilla.common.dispatch import EventBus, Received
from flotilla.common.errors import FlotillaError, InvalidObject, Unavailable
from flotilla.common.events import Envelope, ObjectRef
from flotilla.common.interpreters import (
    DuplicateInterpreterError,
    Interpretation,
    InterpretationError,
    Interpreter,
    InvalidInterpreterError,
    Registry,
)
from flotilla.common.router import Router
from flotilla.common.service import Runtime
from flotilla.depdetector import detection

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

COMPONENT = "flotilla-depdetector"
SERVICE = "depdetector"
WRITE_ATTEMPTS = 5
MERGE_PATCH = "application/merge-patch+json"
INTERPRETER_KIND = "ResourceInterpreter"
INTERPRETER_REFRESH = 30.0
"""Seconds between reloads of the hub's ResourceInterpreters (see `refresh_interpreters`)."""


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _annotation(obj: Mapping[str, Any]) -> str | None:
    annotations = _metadata(obj).get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    value = annotations.get(DEPENDENCIES_ANNOTATION)
    return value if isinstance(value, str) else None


def analysis(
    observed: events.ResourceObserved,
    interpreter: Interpreter,
    interpretation: Interpretation,
    dependencies: list[DependencyEntry],
) -> events.ResourceAnalyzed:
    """The event for `observed` read with `interpreter` (`interpretation`, made under
    the observed policy, so its strategy is the effective one)."""
    return events.ResourceAnalyzed(
        ref=observed.ref,
        object=observed.object,
        strategy=interpretation.strategy,
        replicas=interpretation.replicas,
        requests=interpretation.requests,
        components=[
            events.Component(name=c.name, replicas=c.replicas, requests=c.requests)
            for c in interpretation.components
        ],
        dependencies=[
            events.Dependency(
                api_version=d.api_version,
                kind=d.kind,
                name=d.name,
                namespace=d.namespace,
                detected=d.detected,
            )
            for d in dependencies
        ],
        policy=observed.policy,
        policy_spec=observed.policy_spec,
        interpreter=interpreter.spec,
        follows=interpretation.follows,
    )


class Detector:
    """The handlers, with the registry and the hub connection they share."""

    def __init__(
        self,
        bus: EventBus,
        api: ApiClient,
        dyn: DynamicClient,
        *,
        system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
    ) -> None:
        self.bus = bus
        self.system_namespace = system_namespace
        self.api = api
        self.dyn = dyn
        self.registry = Registry.with_builtins()
        self.recorder = kube.EventRecorder(api, COMPONENT)
        self._interpreter_types: dict[str, GroupVersionKind] = {}

    def router(self) -> Router:
        router = Router(SERVICE)
        router.on(events.ResourceObserved)(self.on_resource_observed)
        router.on(events.ConfigChanged)(self.on_changed)
        return router

    # -- interpreters ----------------------------------------------------------------

    async def load_interpreters(self, *, report: bool = True) -> None:
        """Replace the declared interpreters with the hub's ResourceInterpreters.

        Invalid ones are skipped; with `report` their authors get a Warning Event
        (the periodic refresh does not repeat it).
        """
        resource = await kube.resource_for(self.dyn, API_VERSION, INTERPRETER_KIND)
        try:
            listed = kube.checked(await self.dyn.get(resource))
        except Exception as exc:
            raise kube.translate(exc) from exc
        registry = Registry.with_builtins()
        types: dict[str, GroupVersionKind] = {}
        for item in listed.get("items") or []:
            item.setdefault("apiVersion", API_VERSION)
            item.setdefault("kind", INTERPRETER_KIND)
            name = str(_metadata(item).get("name"))
            try:
                types[name] = registry.register(parse_as(ResourceInterpreter, item)).gvk
            except (InvalidObjectError, InvalidInterpreterError, DuplicateInterpreterError) as exc:
                log.warning("skipping ResourceInterpreter %s: %s", name, exc)
                if report:
                    with contextlib.suppress(FlotillaError):
                        await self.recorder.warning(item, "InvalidInterpreter", str(exc))
        self.registry, self._interpreter_types = registry, types

    async def refresh_interpreters(self, interval: float) -> None:
        """Reload the interpreters every `interval` seconds, until cancelled.

        A `ConfigChanged` reaches only the replica that owns its key's partition;
        this bounds how long the other replicas use an outdated interpreter.
        """
        while True:
            await asyncio.sleep(interval)
            try:
                await self.load_interpreters(report=False)
            except FlotillaError as exc:
                log.warning("could not refresh interpreters: %s", exc)

    async def on_changed(self, event: Received[events.ConfigChanged]) -> None:
        payload = event.payload
        if payload.ref.api_version != API_VERSION or payload.ref.kind != INTERPRETER_KIND:
            return
        previous = self._interpreter_types.pop(payload.ref.name, None)
        if previous is not None:
            self.registry.unregister(previous)
        if not payload.deleted:
            await self._register(payload.object)

    async def _register(self, obj: JsonObject) -> None:
        try:
            interpreter = self.registry.register(parse_as(ResourceInterpreter, obj))
        except (InvalidObjectError, InvalidInterpreterError, DuplicateInterpreterError) as exc:
            raise InvalidObject(str(exc), reason="InvalidInterpreter") from exc
        name = str(_metadata(obj).get("name"))
        self._interpreter_types[name] = interpreter.gvk
        log.info("interpreter %s registered for %s", name, interpreter.gvk)

    # -- resources -------------------------------------------------------------------

    async def on_resource_observed(self, event: Received[events.ResourceObserved]) -> None:
        envelope, observed = event.envelope, event.payload
        obj = observed.object
        interpreter = await self._interpreter(observed)
        if observed.deleted:
            deleted = events.ResourceAnalyzed(
                ref=observed.ref,
                object=obj,
                deleted=True,
                strategy=interpreter.spec.strategy,
                policy=observed.policy,
                policy_spec=observed.policy_spec,
                interpreter=interpreter.spec,
            )
            await self._publish(envelope, deleted)
            return
        try:
            interpretation = interpreter.interpret(obj, observed.policy_spec)
        except InterpretationError as exc:
            raise InvalidObject(str(exc), reason="InvalidObject") from exc
        try:
            user_entries = detection.user_dependencies(obj)
        except ValueError as exc:
            raise InvalidObject(
                f'{exc}; write a JSON list of {{"apiVersion","kind","name","namespace"?}} objects',
                reason="InvalidDependencies",
            ) from exc
        merged = self._merge(obj, user_entries, interpreter)
        allowed, refused = self._scoped(obj, merged)
        await self._write_annotation(
            observed.ref, obj, dump_dependencies(_written(merged, refused)), interpreter
        )
        await self._report_refused(obj, refused)
        await self._report_missing(obj, allowed)
        await self._publish(envelope, analysis(observed, interpreter, interpretation, allowed))

    async def _interpreter(self, observed: events.ResourceObserved) -> Interpreter:
        """The interpreter the event carries, else the registry's for the type."""
        if observed.interpreter is None:
            return self.registry.for_object(observed.object)
        try:
            return _compiled(json.dumps(observed.interpreter, sort_keys=True))
        except (ValidationError, InvalidInterpreterError, KeyError) as exc:
            raise InvalidObject(str(exc), reason="InvalidInterpreter") from exc

    @staticmethod
    def _merge(
        obj: Mapping[str, Any], user_entries: list[DependencyEntry], interpreter: Interpreter
    ) -> list[DependencyEntry]:
        namespace = _metadata(obj).get("namespace")
        return detection.merge_dependencies(
            user_entries,
            detection.detect(obj, interpreter),
            namespace=namespace if isinstance(namespace, str) else None,
        )

    async def _publish(self, observed: Envelope, payload: events.ResourceAnalyzed) -> None:
        await self.bus.publish(
            events.envelope(
                payload,
                key=observed.key,
                producer=self.bus.producer,
                uid=observed.uid,
                generation=observed.generation,
                revision=observed.revision,
                dedupe=(observed.id,),
            )
        )

    # -- hub I/O ---------------------------------------------------------------------

    async def _write_annotation(
        self, ref: ObjectRef, obj: Mapping[str, Any], value: str, interpreter: Interpreter
    ) -> None:
        """Merge-patch the annotation when it differs, retrying conflicts on a fresh read."""
        resource = await kube.resource_for(self.dyn, ref.api_version, ref.kind)
        current: Mapping[str, Any] = obj
        for _ in range(WRITE_ATTEMPTS):
            if _annotation(current) == value:
                return
            patch = {
                "metadata": {
                    "annotations": {DEPENDENCIES_ANNOTATION: value},
                    "resourceVersion": _metadata(current).get("resourceVersion"),
                }
            }
            try:
                kube.checked(
                    await self.dyn.patch(
                        resource,
                        patch,
                        name=ref.name,
                        namespace=ref.namespace,
                        content_type=MERGE_PATCH,
                    )
                )
                return
            except ApiException as exc:
                if exc.status == 404:
                    return  # deleted meanwhile; its deletion event follows
                if exc.status != 409:
                    raise kube.translate(exc) from exc
            except Exception as exc:
                raise kube.translate(exc) from exc
            fresh = await self._get(resource, ref.name, ref.namespace)
            if fresh is None:
                return
            try:
                user_entries = detection.user_dependencies(fresh)
            except ValueError:
                return  # the user is editing it; that edit is its own observation
            current = fresh
            merged = self._merge(fresh, user_entries, interpreter)
            value = dump_dependencies(_written(merged, self._scoped(fresh, merged)[1]))
        raise Unavailable(f"{ref.key}: the object kept changing under the annotation write")

    async def _get(self, resource: Any, name: str, namespace: str | None) -> JsonObject | None:
        try:
            return kube.checked(
                await self.dyn.get(
                    resource, name=name, namespace=namespace if resource.namespaced else None
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise kube.translate(exc) from exc
        except Exception as exc:
            raise kube.translate(exc) from exc

    def _scoped(
        self, obj: Mapping[str, Any], entries: list[DependencyEntry]
    ) -> tuple[list[DependencyEntry], list[tuple[DependencyEntry, str]]]:
        namespace = _metadata(obj).get("namespace")
        return detection.within_scope(
            entries,
            kind=str(obj.get("kind")),
            namespace=namespace if isinstance(namespace, str) and namespace else None,
            system_namespace=self.system_namespace,
        )

    async def _report_refused(
        self, obj: Mapping[str, Any], refused: list[tuple[DependencyEntry, str]]
    ) -> None:
        if refused:
            reasons = "; ".join(f"{_describe(entry)}: {why}" for entry, why in refused)
            await self.recorder.warning(
                dict(obj),
                "DependencyRefused",
                f"these references are not synced with the object: {reasons}",
            )

    async def _report_missing(self, obj: Mapping[str, Any], entries: list[DependencyEntry]) -> None:
        """A Warning Event naming the dependencies the hub does not have (best effort:
        a hub that cannot say is logged, and the analysis goes on)."""
        missing = []
        try:
            for entry in entries:
                try:
                    resource = await kube.resource_for(self.dyn, entry.api_version, entry.kind)
                except InvalidObject:
                    missing.append(f"{_describe(entry)} (the hub does not serve this type)")
                    continue
                if await self._get(resource, entry.name, entry.namespace) is None:
                    missing.append(_describe(entry))
        except FlotillaError as exc:
            log.warning("could not check the dependencies of %s: %s", _describe_object(obj), exc)
            return
        if missing:
            await self.recorder.warning(
                dict(obj),
                "DependencyMissing",
                "depends on objects that do not exist in the hub, so they cannot be synced "
                f"to its clusters: {', '.join(missing)}",
            )


@functools.lru_cache(maxsize=256)
def _compiled(interpreter_json: str) -> Interpreter:
    """Compile an interpreter carried by an event once per distinct body."""
    body = json.loads(interpreter_json)
    spec = ResourceInterpreterSpec.model_validate(body["spec"])
    return Interpreter.compile(spec, f"ResourceInterpreter/{body['metadata']['name']}")


def _written(
    merged: list[DependencyEntry], refused: list[tuple[DependencyEntry, str]]
) -> list[DependencyEntry]:
    """What goes into the annotation: refused detected entries are left out (the user's
    own stay as written; the Warning Event says why they are not synced)."""
    dropped = {entry.key for entry, _ in refused if entry.detected}
    return [entry for entry in merged if not (entry.detected and entry.key in dropped)]


def _describe_object(obj: Mapping[str, Any]) -> str:
    metadata = _metadata(obj)
    where = f"{metadata.get('namespace')}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind')} {where}{metadata.get('name')}"


def _describe(entry: DependencyEntry) -> str:
    where = f"{entry.namespace}/" if entry.namespace else ""
    return f"{entry.kind} {where}{entry.name} ({entry.api_version})"


class DetectorSettings(Settings):
    """The detector's own settings on top of the common ones."""

    interpreter_refresh: float = Field(
        default=INTERPRETER_REFRESH,
        gt=0,
        description="seconds between reloads of the hub's ResourceInterpreters",
    )


async def setup(rt: Runtime) -> Detector:
    """Compose one replica: the hub client, the interpreters, the handlers."""
    settings = rt.settings_as(DetectorSettings)
    api = await kube.hub_client(settings)
    rt.on_close(api.close)  # after the consumer has drained its in-flight handlers
    dyn = await DynamicClient(api)
    detector = Detector(rt.bus, api, dyn, system_namespace=rt.settings.system_namespace)
    await detector.load_interpreters()
    rt.serve(detector.router(), reporter=detector.recorder)
    rt.spawn("interpreters", lambda: detector.refresh_interpreters(settings.interpreter_refresh))
    return detector
