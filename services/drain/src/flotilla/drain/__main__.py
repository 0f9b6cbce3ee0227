"""``python -m flotilla.drain``: run one drain coordinator replica."""

from flotilla.common import service
from flotilla.drain.service import DrainSettings, setup


def main() -> None:
    service.main("drain", setup, DrainSettings)


if __name__ == "__main__":
    main()
