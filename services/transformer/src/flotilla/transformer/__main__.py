"""``python -m flotilla.transformer``: the transformer service process."""

from flotilla.common import service
from flotilla.transformer.service import TransformerSettings, setup


def main() -> None:
    service.main("transformer", setup, TransformerSettings)


if __name__ == "__main__":
    main()
