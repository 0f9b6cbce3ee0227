"""The CronJob controller: Jobs on a schedule, as upstream's cronjob controller (v2) runs them.

On every reconcile it brings `status.active` up to date with the CronJob's Jobs,
trims finished Jobs to `successfulJobsHistoryLimit`/`failedJobsHistoryLimit`, and
then (unless `suspend`) looks for the most recent schedule time it has not acted on
yet (after `lastScheduleTime`, or creation, and within `startingDeadlineSeconds`):
it starts a Job named `<cronjob>-<minutes since the epoch>` for it, unless
`concurrencyPolicy` is Forbid and a Job is still running (skipped) or Replace (the
running ones are deleted first). It then asks to be woken at the next schedule time.

Schedules are standard five-field cron expressions or the `@hourly`-style macros,
read by `croniter` in the CronJob's `timeZone` (UTC when unset). The clock is a
parameter so tests move time instead of waiting for it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flotilla.kubesim.errors import ApiError
from flotilla.kubesim.sim import pods
from flotilla.kubesim.sim.controllers import Context, write_status
from flotilla.kubesim.sim.state import Key

SCHEDULED_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"
_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
# Upstream gives up (with an event) rather than walk more missed times than this.
_MAX_MISSED = 100
_STAMP = "%Y-%m-%dT%H:%M:%SZ"
Record = Callable[[dict[str, str], str, str, str, str], None]
COMPONENT = "cronjob-controller"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _parse_stamp(stamp: Any) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(_STAMP)


def _finished(job: dict[str, Any]) -> str | None:
    """ "Complete" or "Failed" once the Job has finished, else None."""
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def _job_ref(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "kind": "Job",
        "namespace": meta.get("namespace", ""),
        "name": meta["name"],
        "uid": meta["uid"],
        "apiVersion": "batch/v1",
        "resourceVersion": meta.get("resourceVersion", ""),
    }


class ScheduleError(ValueError):
    """A schedule or time zone the controller cannot use (reported as an Event)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def schedule_times(
    spec: dict[str, Any], after: datetime, now: datetime
) -> tuple[datetime | None, int, datetime]:
    """(latest schedule time in (after, now], how many were missed, the next one after now)."""
    # Imported on first use: croniter and dateutil cost a server that runs no CronJob
    # ~0.6 MiB and ~0.1 s at start.
    from croniter import croniter  # type: ignore[import-untyped]

    schedule = str(spec.get("schedule") or "").strip()
    if not (schedule in _MACROS or len(schedule.split()) == 5) or not croniter.is_valid(schedule):
        raise ScheduleError("InvalidSchedule", f"invalid schedule: {schedule!r}")
    zone_name = spec.get("timeZone")
    try:
        zone = ZoneInfo(zone_name) if zone_name else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("UnknownTimeZone", f"invalid timeZone: {zone_name!r}") from None
    times = croniter(schedule, after.astimezone(zone))
    latest: datetime | None = None
    missed = 0
    while True:
        moment: datetime = times.get_next(datetime)
        if moment > now:
            return latest, missed, moment
        latest = moment
        missed += 1
        if missed > _MAX_MISSED:
            # Jump ahead instead of walking every missed time (upstream warns the same way).
            times = croniter(schedule, now.astimezone(zone))
            latest = times.get_prev(datetime)
            times = croniter(schedule, now.astimezone(zone))
            return latest, missed, times.get_next(datetime)


class CronJobController:
    """Creates Jobs on schedule and keeps CronJob status (see the module docstring)."""

    kind = "CronJob"

    def __init__(self, ctx: Context, record: Record, clock: Callable[[], datetime] = _utcnow):
        self.ctx = ctx
        self.record = record
        self.clock = clock
        self.rt = ctx.types[self.kind]
        self.job_rt = ctx.types["Job"]

    def reconcile(self, key: Key) -> None:
        cronjob = self.ctx.state.cache(self.kind).get(key)
        if cronjob is None or cronjob["metadata"].get("deletionTimestamp"):
            return
        spec = cronjob.get("spec") or {}
        previous = cronjob.get("status") or {}
        status: dict[str, Any] = {
            k: v for k, v in previous.items() if k in ("lastScheduleTime", "lastSuccessfulTime")
        }
        jobs = list(self.ctx.state.cache("Job").owned_by(cronjob["metadata"]["uid"]))
        active = [job for job in jobs if _finished(job) is None]
        for job in jobs:
            completed = _parse_stamp((job.get("status") or {}).get("completionTime"))
            last = _parse_stamp(status.get("lastSuccessfulTime"))
            if _finished(job) == "Complete" and completed and (last is None or completed > last):
                status["lastSuccessfulTime"] = _stamp(completed)
        self._trim_history(spec, jobs)
        try:
            if not spec.get("suspend"):
                active = self._run_schedule(cronjob, key, spec, status, active)
        finally:
            if active:
                # A Job keeps the reference taken when it started (upstream does not refresh it).
                known = {ref.get("uid"): ref for ref in previous.get("active") or ()}
                status["active"] = [
                    known.get(job["metadata"]["uid"]) or _job_ref(job) for job in active
                ]
            write_status(self.ctx.store, self.rt, cronjob, status)

    def _run_schedule(
        self,
        cronjob: dict[str, Any],
        key: Key,
        spec: dict[str, Any],
        status: dict[str, Any],
        active: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        now = self.clock()
        earliest = _parse_stamp(status.get("lastScheduleTime")) or _parse_stamp(
            cronjob["metadata"].get("creationTimestamp")
        )
        earliest = earliest or now
        deadline = spec.get("startingDeadlineSeconds")
        if deadline is not None:
            earliest = max(earliest, now - timedelta(seconds=int(deadline)))
        involved = {
            "kind": self.kind,
            "namespace": key[0],
            "name": key[1],
            "uid": cronjob["metadata"]["uid"],
            "apiVersion": "batch/v1",
        }
        try:
            scheduled, missed, upcoming = schedule_times(spec, earliest, now)
        except ScheduleError as exc:
            self.record(involved, "Warning", exc.reason, str(exc), COMPONENT)
            return active
        self.ctx.requeue(self.kind, key, (upcoming - now).total_seconds() + 0.01)
        if scheduled is None:
            return active
        if missed > _MAX_MISSED:
            self.record(
                involved,
                "Warning",
                "TooManyMissedTimes",
                f"too many missed start times: {missed}. Set or decrease .spec."
                "startingDeadlineSeconds or check clock skew",
                COMPONENT,
            )
        policy = spec.get("concurrencyPolicy") or "Allow"
        if active and policy == "Forbid":
            self.record(
                involved,
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy "
                "is Forbid",
                COMPONENT,
            )
            return active
        if active and policy == "Replace":
            for job in active:
                self._delete(job)
            active = []
        created = self._create_job(cronjob, key, scheduled)
        status["lastScheduleTime"] = _stamp(scheduled)
        return [*active, created] if created is not None else active

    def _create_job(
        self, cronjob: dict[str, Any], key: Key, scheduled: datetime
    ) -> dict[str, Any] | None:
        template = (cronjob.get("spec") or {}).get("jobTemplate") or {}
        template_meta = template.get("metadata") or {}
        name = f"{key[1]}-{int(scheduled.timestamp()) // 60}"
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": key[0],
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": {
                    **(template_meta.get("annotations") or {}),
                    SCHEDULED_ANNOTATION: scheduled.isoformat().replace("+00:00", "Z"),
                },
                "ownerReferences": [pods.owner_reference(cronjob)],
            },
            "spec": template.get("spec") or {},
        }
        try:
            return self.ctx.store.create(self.job_rt, job)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
        existing = self.ctx.store.get(self.job_rt, key[0], name)
        owners = existing["metadata"].get("ownerReferences") or ()
        if any(ref.get("uid") == cronjob["metadata"]["uid"] for ref in owners):
            return existing
        return None

    def _trim_history(self, spec: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        for outcome, field, default in (
            ("Complete", "successfulJobsHistoryLimit", 3),
            ("Failed", "failedJobsHistoryLimit", 1),
        ):
            limit = spec.get(field)
            limit = default if limit is None else max(int(limit), 0)
            done = sorted(
                (job for job in jobs if _finished(job) == outcome),
                key=lambda job: (
                    (job.get("status") or {}).get("startTime") or "",
                    job["metadata"].get("creationTimestamp") or "",
                    job["metadata"]["name"],
                ),
            )
            for job in done[: max(len(done) - limit, 0)]:
                self._delete(job)

    def _delete(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        try:
            self.ctx.store.delete(
                self.job_rt, meta.get("namespace"), meta["name"], propagation="Background"
            )
        except ApiError as exc:
            if exc.code != 404:
                raise
