"""Kubernetes resource quantities ("500m", "32Gi", "1.5", "2e3") as exact numbers.

Capacity arithmetic must not drift, so quantities become `Fraction`s and are
converted to integers only at the edge: CPU in millicores, everything else in base
units (bytes, pods, GPUs). Written by hand because the one maintained parser
(`kubernetes.utils.parse_quantity`) lives in the synchronous client, which the
services do not otherwise need.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import ceil

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)

CPU = "cpu"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse(value: str | int | float) -> Fraction:
    """Parse a quantity into an exact number of base units."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or number, not {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (e.g. '500m', '2', '32Gi')")
    number = Fraction(match["number"])
    if match["sign"] == "-":
        number = -number
    if match["exp"]:
        return number * Fraction(10) ** int(match["exp"][1:])
    suffix = match["suffix"] or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def to_units(resource: str, value: str | int | float) -> int:
    """A quantity as an integer in the unit Flotilla counts that resource in.

    CPU is counted in millicores, every other resource in its base unit. Rounds up,
    like the Kubernetes scheduler does for requests.
    """
    amount = parse(value)
    if resource == CPU:
        amount *= 1000
    return ceil(amount)


def format_units(resource: str, units: int) -> str:
    """The inverse of `to_units`, in the shortest exact form a person reads easily."""
    if resource == CPU:
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if units and units % _BINARY[suffix] == 0:
            return f"{units // _BINARY[suffix]}{suffix}"
    return str(units)
