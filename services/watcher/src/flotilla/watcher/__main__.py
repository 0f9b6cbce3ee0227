"""``python -m flotilla.watcher``: the watcher service process."""

from flotilla.common import service
from flotilla.watcher.service import setup


def main() -> None:
    service.main("watcher", setup)


if __name__ == "__main__":
    main()
