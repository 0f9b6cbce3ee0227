"""``python -m flotilla.syncer``: the syncer service process."""

from flotilla.common import service
from flotilla.syncer.service import SyncerSettings, setup


def main() -> None:
    service.main("syncer", setup, SyncerSettings)


if __name__ == "__main__":
    main()
