"""The certificate authority and serving certificate of a kubesim API server.

client-go (and so kubectl) sends a bearer token only over https, so kubesim serves
TLS by default, like every real API server. Each instance gets a CA of its own —
generated fresh, or loaded from a directory so a restarted server keeps the CA that
kubeconfigs written earlier trust — and a serving certificate for the addresses it
listens on. The kubeconfig carries the CA as `certificate-authority-data`, so a
client needs nothing but that file.

EC P-256 keys: generating one takes well under a millisecond, which matters because
the test suites start hundreds of servers.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)
_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(f"kubesim-ca-{name}")
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    @classmethod
    def load_or_create(cls, directory: str | Path, name: str) -> Authority:
        """The CA kept in `directory` (created there on first use, key readable by owner only)."""
        folder = Path(directory)
        cert_path, key_path = folder / _CA_CERT, folder / _CA_KEY
        if cert_path.exists() and key_path.exists():
            return cls(cert_path.read_bytes(), key_path.read_bytes())
        authority = cls.generate(name)
        folder.mkdir(parents=True, exist_ok=True)
        _write_private(key_path, authority.key_pem)
        _write_private(cert_path, authority.cert_pem)
        return authority

    @property
    def cert_data(self) -> str:
        """The CA as kubeconfig's `certificate-authority-data` (base64 of the PEM)."""
        return base64.b64encode(self.cert_pem).decode()

    def issue(self, hosts: list[str]) -> tuple[bytes, bytes]:
        """A serving certificate (PEM chain, PEM key) for `hosts` (IPs or DNS names)."""
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError("the kubesim CA key must be an EC key")
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in dict.fromkeys(hosts):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("kubesim-apiserver"))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem, _pem_key(key)

    def server_context(self, hosts: list[str]) -> ssl.SSLContext:
        """An SSL context serving a fresh certificate for `hosts`, offering h1 only."""
        chain, key = self.issue(hosts)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # `load_cert_chain` reads files only; they live just long enough to be read.
        with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as folder:
            cert_path, key_path = Path(folder) / "tls.crt", Path(folder) / "tls.key"
            _write_private(cert_path, chain)
            _write_private(key_path, key)
            context.load_cert_chain(cert_path, key_path)
        # kubectl would pick HTTP/2 if offered; aiohttp speaks HTTP/1.1 only.
        context.set_alpn_protocols(["http/1.1"])
        return context

    def client_context(self) -> ssl.SSLContext:
        """What a client needs to trust servers of this CA (for raw aiohttp sessions)."""
        return ssl.create_default_context(cadata=self.cert_pem.decode())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
