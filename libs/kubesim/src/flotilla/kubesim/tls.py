"""The certificate authority and serving certificate of a kubesim API server.

client-go (and so kubectl) sends a bearer token only over https, so kubesim serves
TLS by default, like every real API server. Each instance gets a CA of its own —
generated fresh, or loaded from a directory so a restarted server keeps the CA that
kubeconfigs written earlier trust — and a serving certificate for the addresses it
listens on. The kubeconfig carries the CA as `certificate-authority-data`, so a
client needs nothing but that file.

The two certificates are X.509 v3 with EC P-256 keys, encoded here in DER (the few
structures they need) and signed by `p256`: a crypto library would stay loaded for
the server's whole life to sign twice at start. Python's `ssl` (OpenSSL) loads and
serves them.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import secrets
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from flotilla.kubesim.p256 import PrivateKey

_VALIDITY = datetime.timedelta(days=3650)
_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"

# -- DER (X.690) ------------------------------------------------------------------------

_BOOLEAN, _INTEGER, _BIT_STRING, _OCTET_STRING, _OID = 0x01, 0x02, 0x03, 0x04, 0x06
_UTF8_STRING, _UTC_TIME, _GENERALIZED_TIME = 0x0C, 0x17, 0x18
_SEQUENCE, _SET = 0x30, 0x31


def _tlv(tag: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes((tag, size)) + body
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(length))) + length + body


def _seq(*items: bytes) -> bytes:
    return _tlv(_SEQUENCE, b"".join(items))


def _int(value: int) -> bytes:
    return _tlv(_INTEGER, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def _oid(dotted: str) -> bytes:
    arcs = [int(arc) for arc in dotted.split(".")]
    body = bytearray()
    for arc in [arcs[0] * 40 + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        body.extend(reversed(chunk))
    return _tlv(_OID, bytes(body))


def _bits(data: bytes, unused: int = 0) -> bytes:
    return _tlv(_BIT_STRING, bytes((unused,)) + data)


def _time(moment: datetime.datetime) -> bytes:
    # RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050.
    if moment.year < 2050:
        return _tlv(_UTC_TIME, moment.strftime("%y%m%d%H%M%SZ").encode())
    return _tlv(_GENERALIZED_TIME, moment.strftime("%Y%m%d%H%M%SZ").encode())


def _read(data: bytes, offset: int = 0) -> tuple[int, bytes, int]:
    """(tag, body, offset after) of the DER element at `offset`."""
    if offset + 2 > len(data):
        raise ValueError("truncated DER")
    tag, size = data[offset], data[offset + 1]
    offset += 2
    if size & 0x80:
        count = size & 0x7F
        size = int.from_bytes(data[offset : offset + count], "big")
        offset += count
    if offset + size > len(data):
        raise ValueError("truncated DER")
    return tag, data[offset : offset + size], offset + size


def _children(body: bytes) -> list[tuple[int, bytes, bytes]]:
    """(tag, body, whole element) of each element in a constructed body."""
    out, offset = [], 0
    while offset < len(body):
        tag, inner, end = _read(body, offset)
        out.append((tag, inner, body[offset:end]))
        offset = end
    return out


_EC_PUBLIC_KEY = _oid("1.2.840.10045.2.1")
_PRIME256V1 = _oid("1.2.840.10045.3.1.7")
_EC_ALGORITHM = _seq(_EC_PUBLIC_KEY, _PRIME256V1)
_ECDSA_SHA256 = _seq(_oid("1.2.840.10045.4.3.2"))
_COMMON_NAME = "2.5.4.3"
_SUBJECT_KEY_ID = "2.5.29.14"
_KEY_USAGE = "2.5.29.15"
_SUBJECT_ALT_NAME = "2.5.29.17"
_BASIC_CONSTRAINTS = "2.5.29.19"
_EXTENDED_KEY_USAGE = "2.5.29.37"
_SERVER_AUTH = "1.3.6.1.5.5.7.3.1"
# KeyUsage bits digitalSignature(0), keyCertSign(5), cRLSign(6): 0b1000_0110, bit 7 unused.
_CA_KEY_USAGE = _bits(b"\x86", unused=1)


def _name(common_name: str) -> bytes:
    attribute = _seq(_oid(_COMMON_NAME), _tlv(_UTF8_STRING, common_name.encode()))
    return _seq(_tlv(_SET, attribute))


def _extension(oid: str, value: bytes, *, critical: bool) -> bytes:
    flag = _tlv(_BOOLEAN, b"\xff") if critical else b""
    return _seq(_oid(oid), flag, _tlv(_OCTET_STRING, value))


def _pem(label: str, der: bytes) -> bytes:
    text = base64.b64encode(der).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----", ""]).encode()


def _unpem(label: str, pem: bytes) -> bytes:
    text = pem.decode("ascii", "replace")
    begin, end = f"-----BEGIN {label}-----", f"-----END {label}-----"
    if begin not in text or end not in text:
        raise ValueError(f"no PEM {label} found")
    body = text.split(begin, 1)[1].split(end, 1)[0]
    return base64.b64decode("".join(body.split()))


def _certificate(
    key: PrivateKey,
    subject: bytes,
    issuer: bytes,
    issuer_key: PrivateKey,
    extensions: list[bytes],
) -> bytes:
    """A signed X.509 v3 certificate (PEM) for `key`'s public key."""
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    spki = _seq(_EC_ALGORITHM, _bits(key.public_bytes()))
    tbs = _seq(
        _tlv(0xA0, _int(2)),  # [0] EXPLICIT version v3
        _int(secrets.randbits(159) | 1),  # positive, at most 20 octets (RFC 5280 4.1.2.2)
        _ECDSA_SHA256,
        issuer,
        _seq(_time(now - datetime.timedelta(minutes=5)), _time(now + _VALIDITY)),
        subject,
        spki,
        _tlv(0xA3, _seq(*extensions)),  # [3] EXPLICIT extensions
    )
    r, s = issuer_key.sign(tbs)
    return _pem("CERTIFICATE", _seq(tbs, _ECDSA_SHA256, _bits(_seq(_int(r), _int(s)))))


def _pem_key(key: PrivateKey) -> bytes:
    """PKCS#8 `PRIVATE KEY` holding an RFC 5915 ECPrivateKey."""
    inner = _seq(
        _int(1),
        _tlv(_OCTET_STRING, key.secret.to_bytes(32, "big")),
        _tlv(0xA1, _bits(key.public_bytes())),  # [1] EXPLICIT publicKey
    )
    return _pem("PRIVATE KEY", _seq(_int(0), _EC_ALGORITHM, _tlv(_OCTET_STRING, inner)))


def _load_key(pem: bytes) -> PrivateKey:
    """The P-256 key of a PKCS#8 PEM (as written by `_pem_key` or by OpenSSL)."""
    try:
        _, body, _ = _read(_unpem("PRIVATE KEY", pem))
        fields = _children(body)
        if len(fields) < 3 or fields[1][2] != _EC_ALGORITHM:
            raise ValueError("not an EC P-256 key")
        _, ec_key, _ = _read(fields[2][1])
        secret = _children(ec_key)[1]
        if secret[0] != _OCTET_STRING:
            raise ValueError("no private scalar")
    except (ValueError, IndexError) as exc:
        raise ValueError(f"the kubesim CA key must be an EC P-256 key: {exc}") from exc
    return PrivateKey(int.from_bytes(secret[1], "big"))


def _subject_of(cert_pem: bytes) -> bytes:
    """The subject Name (DER) of a PEM certificate: its issued certificates' issuer."""
    _, certificate, _ = _read(_unpem("CERTIFICATE", cert_pem))
    _, tbs, _ = _read(certificate)
    fields = _children(tbs)
    if fields and fields[0][0] == 0xA0:  # explicit version
        fields = fields[1:]
    return fields[4][2]  # serial, signature, issuer, validity, subject


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, name: str) -> Authority:
        key = PrivateKey.generate()
        # RFC 5280 4.2.1.2 method (1): SHA-1 of the public key, an identifier, not a MAC.
        key_id = hashlib.sha1(key.public_bytes(), usedforsecurity=False).digest()
        subject = _name(f"kubesim-ca-{name}")
        extensions = [
            _extension(_BASIC_CONSTRAINTS, _seq(_tlv(_BOOLEAN, b"\xff"), _int(0)), critical=True),
            _extension(_KEY_USAGE, _CA_KEY_USAGE, critical=True),
            _extension(_SUBJECT_KEY_ID, _tlv(_OCTET_STRING, key_id), critical=False),
        ]
        return cls(_certificate(key, subject, subject, key, extensions), _pem_key(key))

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
        ca_key = _load_key(self.key_pem)
        key = PrivateKey.generate()
        names = []
        for host in dict.fromkeys(hosts):
            try:
                names.append(_tlv(0x87, ipaddress.ip_address(host).packed))  # [7] iPAddress
            except ValueError:
                names.append(_tlv(0x82, host.encode("idna")))  # [2] dNSName
        extensions = [
            _extension(_SUBJECT_ALT_NAME, _seq(*names), critical=False),
            _extension(_BASIC_CONSTRAINTS, _seq(), critical=True),
            _extension(_EXTENDED_KEY_USAGE, _seq(_oid(_SERVER_AUTH)), critical=False),
        ]
        cert = _certificate(
            key, _name("kubesim-apiserver"), _subject_of(self.cert_pem), ca_key, extensions
        )
        return cert + self.cert_pem, _pem_key(key)

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
