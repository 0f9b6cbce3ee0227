"""Makes kubesim's CA and serving certificates, in a process of its own.

    python -m flotilla.kubesim.certs [--idle-seconds 10]

The `cryptography` package (with the OpenSSL it bundles) adds about 9 MiB to the
resident memory of whatever process imports it, for the rest of that process's life,
and a server needs it only for a few milliseconds at start. So the server (`tls.py`)
never imports it: it runs this module as a child and reads the PEM it answers over a
pipe (nothing touches the disk here; the server writes what it keeps). Starting the
child costs ~0.1 s of CPU (an interpreter and the import), so one child answers the
requests of every server its parent starts and exits once no request came for
`--idle-seconds` (or when its stdin closes): test suites start hundreds of servers.

One request per line on stdin, one answer per line on stdout, both JSON:
    {"name": "hub", "hosts": ["127.0.0.1", "localhost"], "ca": null}
    {"ca": {"cert": PEM, "key": PEM}, "cert": PEM chain (serving cert + CA), "key": PEM}
`ca` is null to generate a new CA (named after `name`), or {"cert": PEM, "key": PEM}
to issue from an existing one. A malformed request is answered {"error": reason}.

EC P-256 keys: generating one takes well under a millisecond.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import select
import sys
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def generate_ca(name: str) -> tuple[str, str]:
    """A new self-signed CA: (certificate PEM, key PEM)."""
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
    return cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key)


def issue(ca_cert_pem: str, ca_key_pem: str, hosts: list[str]) -> tuple[str, str]:
    """A serving certificate for `hosts` (IPs or DNS names): (PEM chain, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
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
    return cert.public_bytes(serialization.Encoding.PEM).decode() + ca_cert_pem, _pem_key(key)


def answer(request: Any) -> dict[str, Any]:
    """The answer to one request (see the module docstring); ValueError if it is malformed."""
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object")
    name, hosts, ca = request.get("name"), request.get("hosts"), request.get("ca")
    if not isinstance(name, str) or not name:
        raise ValueError("`name` must be a non-empty string")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ValueError("`hosts` must be a non-empty list of strings")
    if ca is None:
        ca_cert, ca_key = generate_ca(name)
    elif isinstance(ca, dict) and all(isinstance(ca.get(k), str) for k in ("cert", "key")):
        ca_cert, ca_key = ca["cert"], ca["key"]
    else:
        raise ValueError("`ca` must be null or {cert: PEM, key: PEM}")
    chain, key = issue(ca_cert, ca_key, hosts)
    return {"ca": {"cert": ca_cert, "key": ca_key}, "cert": chain, "key": key}


def serve(idle_seconds: float) -> None:
    """Answer requests from stdin until it closes or stays silent for `idle_seconds`."""
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        # Unbuffered reads, so `select` sees every byte not yet taken.
        while b"\n" not in pending:
            ready, _, _ = select.select([stdin], [], [], idle_seconds)
            chunk = os.read(stdin, 65536) if ready else b""
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        try:
            result = answer(json.loads(line))
        except ValueError as exc:  # json.JSONDecodeError included
            result = {"error": str(exc)}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    serve(parser.parse_args().idle_seconds)


if __name__ == "__main__":
    main()
