"""``python -m flotilla.watcher``: the watcher service process."""

from flotilla.common import service
from flotilla.watcher.service import WatcherSettings, setup


def main() -> None:
    service.main("watcher", setup, WatcherSettings)


if __name__ == "__main__":
    main()
