from fractions import Fraction

import pytest

from flotilla.common import quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("32Gi", Fraction(32 * 2**30)),
        ("1k", Fraction(1000)),
        ("2e3", Fraction(2000)),
        ("100n", Fraction(1, 10**7)),
        (".5", Fraction(1, 2)),
        (3, Fraction(3)),
    ],
    ids=lambda v: str(v),
)
def test_parse(text: str, expected: Fraction) -> None:
    assert quantity.parse(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "1Gb", "--1", "1..2", "Gi"])
def test_parse_rejects_garbage(bad: str) -> None:
    with pytest.raises(quantity.QuantityError, match="not a Kubernetes quantity"):
        quantity.parse(bad)


@pytest.mark.parametrize(
    ("resource", "text", "units", "formatted"),
    [
        ("cpu", "250m", 250, "250m"),
        ("cpu", "2", 2000, "2"),
        ("cpu", "0.1", 100, "100m"),
        ("memory", "64Mi", 64 * 2**20, "64Mi"),
        ("memory", "1000", 1000, "1000"),
        ("pods", "110", 110, "110"),
        ("nvidia.com/gpu", "4", 4, "4"),
    ],
)
def test_units_round_trip(resource: str, text: str, units: int, formatted: str) -> None:
    assert quantity.to_units(resource, text) == units
    assert quantity.format_units(resource, units) == formatted


def test_cpu_rounds_up_like_the_scheduler() -> None:
    assert quantity.to_units("cpu", "0.0001") == 1
