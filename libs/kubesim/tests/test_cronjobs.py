"""The CronJob controller, driven by a controllable clock (no waiting for schedules)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla.kubesim.sim import cronjobs

from .simcluster import Cluster, eventually, template


class Clock:
    """The controller's notion of now; tests move it and then ask for a reconcile."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def to_next_hour(self, plus: timedelta = timedelta(seconds=5)) -> datetime:
        """Move past the next full hour; returns that hour (the schedule time)."""
        hour = (self.now + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
        self.now = hour + plus
        return hour


@pytest.fixture
async def timed(cluster_factory: Callable[..., Any]) -> tuple[Cluster, Clock]:
    cluster: Cluster = await cluster_factory(nodes=2)
    clock = Clock()
    cluster.sim.cronjobs.clock = clock
    return cluster, clock


def cronjob(name: str = "tick", schedule: str = "@hourly", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": schedule,
            "jobTemplate": {
                "metadata": {"labels": {"team": "ops"}},
                "spec": {"template": template(name, restartPolicy="OnFailure")},
            },
            **spec,
        },
    }


def jobs(cluster: Cluster) -> dict[str, dict[str, Any]]:
    items = cluster.store.list(cluster.rt("Job"), "default")[0]
    return {job["metadata"]["name"]: job for job in items}


def reconcile(cluster: Cluster, name: str = "tick") -> None:
    cluster.sim.queues["CronJob"].add(("default", name))


def reasons(cluster: Cluster, name: str = "tick") -> list[str]:
    rt = cluster.store.resource_type("v1", "Event")
    selector = f"involvedObject.kind=CronJob,involvedObject.name={name}"
    return [e["reason"] for e in cluster.store.list(rt, None, None, selector)[0]]


def job_name(name: str, at: datetime) -> str:
    return f"{name}-{int(at.timestamp()) // 60}"


async def test_a_job_is_created_at_the_schedule_and_its_success_recorded(
    timed: tuple[Cluster, Clock],
) -> None:
    cluster, clock = timed
    cluster.create(cronjob())
    reconcile(cluster)
    await eventually(lambda: cluster.get("CronJob", "tick").get("status") is not None)
    assert jobs(cluster) == {}

    hour = clock.to_next_hour()
    reconcile(cluster)
    name = job_name("tick", hour)
    await eventually(lambda: name in jobs(cluster))
    job = jobs(cluster)[name]
    assert job["metadata"]["labels"] == {"team": "ops"}
    assert job["metadata"]["annotations"][cronjobs.SCHEDULED_ANNOTATION] == hour.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("CronJob", "tick", True)
    status = cluster.status("CronJob", "tick")
    assert status["lastScheduleTime"] == hour.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [ref["name"] for ref in status.get("active", [])] in ([name], [])

    done = await eventually(
        lambda: "lastSuccessfulTime" in (s := cluster.status("CronJob", "tick")) and s
    )
    assert "active" not in done
    await eventually(lambda: {"SuccessfulCreate", "SawCompletedJob"} <= set(reasons(cluster)))

    reconcile(cluster)  # nothing new is due within the same hour
    await eventually(lambda: len(cluster.sim.queues["CronJob"]) == 0)
    assert list(jobs(cluster)) == [name]


@pytest.mark.parametrize(
    ("policy", "running", "event"),
    [("Allow", 2, None), ("Forbid", 1, "JobAlreadyActive"), ("Replace", 1, "SuccessfulDelete")],
)
async def test_concurrency_policy(
    cluster_factory: Callable[..., Any], policy: str, running: int, event: str | None
) -> None:
    cluster: Cluster = await cluster_factory(nodes=2, job_seconds=600)
    clock = Clock()
    cluster.sim.cronjobs.clock = clock
    cluster.create(cronjob(concurrencyPolicy=policy))
    first = job_name("tick", clock.to_next_hour())
    reconcile(cluster)
    await eventually(lambda: first in jobs(cluster))
    second = job_name("tick", clock.to_next_hour())
    reconcile(cluster)
    if policy == "Forbid":
        await eventually(lambda: "JobAlreadyActive" in reasons(cluster))
        assert list(jobs(cluster)) == [first]
    else:
        await eventually(lambda: second in jobs(cluster))
    await eventually(lambda: len(cluster.status("CronJob", "tick").get("active", [])) == running)
    if policy == "Replace":
        await eventually(lambda: first not in jobs(cluster))
    if event is not None:
        await eventually(lambda: event in reasons(cluster))


async def test_suspended_cronjobs_start_nothing(timed: tuple[Cluster, Clock]) -> None:
    cluster, clock = timed
    cluster.create(cronjob(suspend=True))
    clock.to_next_hour()
    reconcile(cluster)
    await eventually(lambda: cluster.get("CronJob", "tick").get("status") is not None)
    assert jobs(cluster) == {}
    cluster.update_spec("CronJob", "tick", lambda c: c["spec"].update(suspend=False))
    await eventually(lambda: len(jobs(cluster)) == 1)


async def test_a_run_missed_by_more_than_the_starting_deadline_is_skipped(
    timed: tuple[Cluster, Clock],
) -> None:
    cluster, clock = timed
    cluster.create(cronjob(startingDeadlineSeconds=60))
    clock.to_next_hour(plus=timedelta(minutes=5))
    reconcile(cluster)
    await eventually(lambda: cluster.get("CronJob", "tick").get("status") is not None)
    assert jobs(cluster) == {}
    hour = clock.to_next_hour(plus=timedelta(seconds=30))
    reconcile(cluster)
    await eventually(lambda: job_name("tick", hour) in jobs(cluster))


async def test_history_limits_keep_only_the_newest_finished_jobs(
    timed: tuple[Cluster, Clock],
) -> None:
    cluster, clock = timed
    cluster.create(cronjob(successfulJobsHistoryLimit=1))
    names = []
    for _ in range(3):
        names.append(job_name("tick", clock.to_next_hour()))
        reconcile(cluster)
        await eventually(lambda: names[-1] in jobs(cluster))
        await eventually(lambda: "active" not in cluster.status("CronJob", "tick"))
    reconcile(cluster)
    await eventually(lambda: list(jobs(cluster)) == [names[-1]])


async def test_time_zone_and_macros_follow_the_schedule(timed: tuple[Cluster, Clock]) -> None:
    cluster, clock = timed
    cluster.create(cronjob(schedule="0 9 * * *", timeZone="Asia/Tokyo"))
    tokyo_nine = (clock.now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    clock.now = tokyo_nine + timedelta(seconds=1)
    reconcile(cluster)
    name = job_name("tick", tokyo_nine)
    await eventually(lambda: name in jobs(cluster))
    annotation = jobs(cluster)[name]["metadata"]["annotations"][cronjobs.SCHEDULED_ANNOTATION]
    assert annotation.endswith("09:00:00+09:00")


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"schedule": "not a schedule"}, "InvalidSchedule"),
        ({"schedule": "* * * * * *"}, "InvalidSchedule"),
        ({"timeZone": "Mars/Olympus"}, "UnknownTimeZone"),
    ],
    ids=["garbage", "six-fields", "unknown-zone"],
)
async def test_bad_schedules_are_reported_as_warnings(
    timed: tuple[Cluster, Clock], spec: dict[str, Any], reason: str
) -> None:
    cluster, clock = timed
    cluster.create(cronjob(**spec))
    clock.to_next_hour()
    reconcile(cluster)
    await eventually(lambda: reason in reasons(cluster))
    assert jobs(cluster) == {}


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("@hourly", "2026-01-01T10:30:00", "2026-01-01T11:00:00"),
        ("@daily", "2026-01-01T10:30:00", "2026-01-02T00:00:00"),
        ("*/15 * * * *", "2026-01-01T10:31:00", "2026-01-01T10:45:00"),
    ],
)
def test_schedule_times(schedule: str, after: str, expected: str) -> None:
    start = datetime.fromisoformat(after).replace(tzinfo=UTC)
    latest, missed, upcoming = cronjobs.schedule_times(
        {"schedule": schedule}, start, start + timedelta(seconds=1)
    )
    assert (latest, missed) == (None, 0)
    assert upcoming == datetime.fromisoformat(expected).replace(tzinfo=UTC)
    latest, missed, _ = cronjobs.schedule_times(
        {"schedule": schedule}, start, upcoming + timedelta(seconds=1)
    )
    assert (latest, missed) == (upcoming, 1)


async def test_a_manual_job_from_the_cronjob_is_not_reported_as_scheduled(
    timed: tuple[Cluster, Clock],
) -> None:
    cluster, _ = timed
    owner = cluster.create(cronjob())
    cluster.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "manual",
                "namespace": "default",
                "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "CronJob",
                        "name": "tick",
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": owner["spec"]["jobTemplate"]["spec"],
        }
    )
    await eventually(lambda: "SawCompletedJob" in reasons(cluster))
    assert "SuccessfulCreate" not in reasons(cluster)
