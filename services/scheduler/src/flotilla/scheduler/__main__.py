"""``python -m flotilla.scheduler`` (or ``flotilla-scheduler``): one scheduler replica."""

from flotilla.common import service
from flotilla.scheduler.service import SchedulerSettings, setup


def run() -> None:
    service.main("scheduler", setup, SchedulerSettings)


if __name__ == "__main__":
    run()
