"""kubesim's own certificates and keys, checked against a maintained X.509 library.

`tls` encodes the DER and `p256` does the curve arithmetic itself (so a running server
does not keep a crypto library loaded); `cryptography` here is the reference that
parses, verifies and re-derives what they produce.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from flotilla.kubesim import p256, tls


def test_public_points_match_the_reference_derivation() -> None:
    for _ in range(8):
        key = p256.PrivateKey.generate()
        reference = ec.derive_private_key(key.secret, ec.SECP256R1()).public_key()
        numbers = reference.public_numbers()
        assert key.public_point == (numbers.x, numbers.y)
        assert p256.on_curve(key.public_point)
    assert p256.multiply(p256.N) is None


def test_signatures_verify_with_the_reference_library() -> None:
    key = p256.PrivateKey.generate()
    public = ec.derive_private_key(key.secret, ec.SECP256R1()).public_key()
    r, s = key.sign(b"kubesim")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    public.verify(encode_dss_signature(r, s), b"kubesim", ec.ECDSA(hashes.SHA256()))


def test_the_ca_and_serving_certificate_parse_and_chain() -> None:
    authority = tls.Authority.generate("hub")
    chain, key_pem = authority.issue(["127.0.0.1", "localhost", "::1", "127.0.0.1"])
    ca = x509.load_pem_x509_certificate(authority.cert_pem)
    leaf, trailing_ca = x509.load_pem_x509_certificates(chain)
    assert trailing_ca == ca
    ca.verify_directly_issued_by(ca)
    leaf.verify_directly_issued_by(ca)
    assert ca.subject.rfc4514_string() == "CN=kubesim-ca-hub"
    assert leaf.issuer == ca.subject
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and usage.digital_signature
    assert not usage.key_encipherment
    key_id = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert key_id == x509.SubjectKeyIdentifier.from_public_key(ca.public_key())  # type: ignore[arg-type]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert 0 < leaf.serial_number < 2**159
    assert leaf.not_valid_before_utc < ca.not_valid_after_utc
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]
    # Byte-for-byte the PKCS#8 encoding the reference writes.
    ca_key = serialization.load_pem_private_key(authority.key_pem, password=None)
    assert authority.key_pem == ca_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_a_ca_written_by_the_reference_library_issues_certificates(tmp_path: Path) -> None:
    """tls dirs written before kubesim signed for itself keep working."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "kubesim-ca-old")])
    import datetime

    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    authority = tls.Authority.load_or_create(tmp_path, "old")
    chain, _ = authority.issue(["127.0.0.1"])
    x509.load_pem_x509_certificates(chain)[0].verify_directly_issued_by(ca)
    # OpenSSL accepts the chain and key as a server identity.
    assert isinstance(authority.server_context(["127.0.0.1"]), ssl.SSLContext)


def test_a_ca_key_of_another_kind_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    other = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    authority = tls.Authority(tls.Authority.generate("x").cert_pem, other)
    with pytest.raises(ValueError, match="EC P-256"):
        authority.issue(["127.0.0.1"])


def test_serving_without_loading_a_crypto_library() -> None:
    """The point of signing in-house: a server process never imports `cryptography`."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from flotilla.kubesim.server import KubeSim\n"
        "KubeSim('x', hub=True)\n"
        "print(sorted(m for m in sys.modules if m.startswith('cryptography')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
