"""``python -m flotilla.depdetector``: the dependency detector service process."""

from flotilla.common import service
from flotilla.depdetector.service import DetectorSettings, setup


def main() -> None:
    service.main("depdetector", setup, DetectorSettings)


if __name__ == "__main__":
    main()
