"""``python -m flotilla.aggregator``: run one status aggregator replica."""

from flotilla.aggregator.service import AggregatorSettings, setup
from flotilla.common import service


def main() -> None:
    service.main("aggregator", setup, AggregatorSettings)


if __name__ == "__main__":
    main()
