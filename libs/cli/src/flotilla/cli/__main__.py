"""``python -m flotilla.cli``: the same as the ``flotilla`` console script."""

from flotilla.cli.commands import main

if __name__ == "__main__":
    main()
