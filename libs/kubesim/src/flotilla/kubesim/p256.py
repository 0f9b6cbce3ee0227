"""NIST P-256 keys and ECDSA-SHA256 signatures in plain Python, for kubesim's own CA.

kubesim signs two certificates when it starts (its CA's and its serving one) and
never verifies anything itself: Python's `ssl` does the handshakes. Loading a full
crypto library for those two signatures cost a sixth of an idle server's memory, so
the curve arithmetic lives here (a few milliseconds per signature). Nonces come from
`secrets`; the arithmetic is not constant-time, which is acceptable for a local
simulator's throwaway CA and nothing else.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

# SEC 2 / FIPS 186-4 curve parameters (a = p - 3).
P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)

Point = tuple[int, int] | None  # None is the point at infinity
# Jacobian coordinates (X, Y, Z) stand for (X/Z², Y/Z³): no inversion per step.
_Jacobian = tuple[int, int, int]
_INFINITY: _Jacobian = (1, 1, 0)


def _double(point: _Jacobian) -> _Jacobian:
    x, y, z = point
    if z == 0 or y == 0:
        return _INFINITY
    delta, gamma = z * z % P, y * y % P
    beta = x * gamma % P
    alpha = 3 * (x - delta) * (x + delta) % P  # a = -3
    x3 = (alpha * alpha - 8 * beta) % P
    z3 = ((y + z) * (y + z) - gamma - delta) % P
    return x3, (alpha * (4 * beta - x3) - 8 * gamma * gamma) % P, z3


def _add(first: _Jacobian, second: _Jacobian) -> _Jacobian:
    x1, y1, z1 = first
    x2, y2, z2 = second
    if z1 == 0:
        return second
    if z2 == 0:
        return first
    z1z1, z2z2 = z1 * z1 % P, z2 * z2 % P
    u1, u2 = x1 * z2z2 % P, x2 * z1z1 % P
    s1, s2 = y1 * z2 * z2z2 % P, y2 * z1 * z1z1 % P
    if u1 == u2:
        return _double(first) if s1 == s2 else _INFINITY
    h, r = (u2 - u1) % P, (s2 - s1) % P
    hh = h * h % P
    hhh, v = h * hh % P, u1 * hh % P
    x3 = (r * r - hhh - 2 * v) % P
    return x3, (r * (v - x3) - s1 * hhh) % P, h * z1 * z2 % P


def multiply(scalar: int, point: Point = G) -> Point:
    """scalar * point (double-and-add)."""
    if point is None:
        return None
    result, addend = _INFINITY, (point[0], point[1], 1)
    while scalar:
        if scalar & 1:
            result = _add(result, addend)
        addend = _double(addend)
        scalar >>= 1
    x, y, z = result
    if z == 0:
        return None
    inverse = pow(z, -1, P)
    square = inverse * inverse % P
    return x * square % P, y * square * inverse % P


def on_curve(point: Point) -> bool:
    if point is None:
        return False
    x, y = point
    return (y * y - (x * x * x + A * x + B)) % P == 0


@dataclass(frozen=True)
class PrivateKey:
    """A P-256 private scalar and its public point."""

    secret: int

    @classmethod
    def generate(cls) -> PrivateKey:
        return cls(secrets.randbelow(N - 1) + 1)

    @property
    def public_point(self) -> tuple[int, int]:
        point = multiply(self.secret)
        assert point is not None  # a scalar in [1, N) never lands on infinity
        return point

    def public_bytes(self) -> bytes:
        """The uncompressed point (0x04 || X || Y), as SubjectPublicKeyInfo carries it."""
        x, y = self.public_point
        return b"\x04" + x.to_bytes(32, "big") + y.to_bytes(32, "big")

    def sign(self, message: bytes) -> tuple[int, int]:
        """ECDSA over SHA-256 of `message`: (r, s)."""
        digest = int.from_bytes(hashlib.sha256(message).digest(), "big")
        while True:
            nonce = secrets.randbelow(N - 1) + 1
            point = multiply(nonce)
            assert point is not None
            r = point[0] % N
            if r == 0:
                continue
            s = pow(nonce, -1, N) * (digest + r * self.secret) % N
            if s:
                return r, s
