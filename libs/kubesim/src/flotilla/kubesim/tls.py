"""The certificate authority and serving certificate of a kubesim API server.

client-go (and so kubectl) sends a bearer token only over https, so kubesim serves
TLS by default, like every real API server. Each instance gets a CA of its own —
generated fresh, or loaded from a directory so a restarted server keeps the CA that
kubeconfigs written earlier trust — and a serving certificate for the addresses it
listens on. The kubeconfig carries the CA as `certificate-authority-data`, so a
client needs nothing but that file.

The certificates are made by `python -m flotilla.kubesim.certs` in a child process
(`provision`), so the server never imports the `cryptography` package: it would stay
resident (about 9 MiB) for work done once at start. This module only passes PEM
around and builds `ssl` contexts from it with the standard library; the child is
shared by the servers one process starts and exits once idle (see `certs.py`).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import json
import os
import select
import ssl
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"
# Generous: the helper starts an interpreter and imports cryptography (~0.2 s idle).
TIMEOUT_SECONDS = 60.0
# The helper exits after this long without a request.
IDLE_SECONDS = 10.0


class CertificateError(RuntimeError):
    """The certificate helper refused a request (the reason is in the message) or went
    away without answering (a crash prints its traceback on this process's stderr)."""


@dataclass(frozen=True)
class Serving:
    """A serving certificate: the PEM chain (certificate, then CA) and its key."""

    chain_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def load(cls, directory: str | Path) -> Authority | None:
        """The CA kept in `directory`, or None when it holds none (yet)."""
        folder = Path(directory)
        cert_path, key_path = folder / _CA_CERT, folder / _CA_KEY
        if cert_path.exists() and key_path.exists():
            return cls(cert_path.read_bytes(), key_path.read_bytes())
        return None

    def save(self, directory: str | Path) -> None:
        """Keep the CA in `directory`, both files readable by their owner only."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        # The key first: `load` wants both, so a crash in between leaves no half CA.
        _write_private(folder / _CA_KEY, self.key_pem)
        _write_private(folder / _CA_CERT, self.cert_pem)

    @property
    def cert_data(self) -> str:
        """The CA as kubeconfig's `certificate-authority-data` (base64 of the PEM)."""
        return base64.b64encode(self.cert_pem).decode()

    def client_context(self) -> ssl.SSLContext:
        """What a client needs to trust servers of this CA (for raw aiohttp sessions)."""
        return ssl.create_default_context(cadata=self.cert_pem.decode())


async def provision(
    name: str,
    hosts: list[str],
    authority: Authority | None = None,
    directory: str | Path | None = None,
) -> tuple[Authority, Serving]:
    """The CA (`authority`, else the one kept in `directory`, else a new one, then kept
    there) and a fresh serving certificate for `hosts` (IPs or DNS names), made by one
    run of the certificate helper process."""
    if authority is None and directory is not None:
        authority = Authority.load(directory)
    request: dict[str, Any] = {"name": name, "hosts": hosts, "ca": None}
    if authority is not None:
        request["ca"] = {"cert": authority.cert_pem.decode(), "key": authority.key_pem.decode()}
    answer = await _run_helper(request)
    if authority is None:
        authority = Authority(answer["ca"]["cert"].encode(), answer["ca"]["key"].encode())
        if directory is not None:
            authority.save(directory)
    return authority, Serving(answer["cert"].encode(), answer["key"].encode())


class _Helper:
    """The certificate helper process (`certs.py`), started on demand and shared by every
    server of this process. It exits by itself once idle; a request that finds it gone
    (or racing its exit) starts another. Requests are blocking pipe round trips, made
    from a worker thread so any event loop can use the same helper."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        line = (json.dumps(request) + "\n").encode()
        with self._lock:
            reply = self._round_trip(line) or self._round_trip(line)
        if not reply:
            raise CertificateError("the certificate helper process exited without answering")
        answer: dict[str, Any] = json.loads(reply)
        if "error" in answer:
            raise CertificateError(f"making the TLS certificates failed: {answer['error']}")
        return answer

    def _round_trip(self, line: bytes) -> bytes:
        """The helper's answer to `line`, or b"" when the helper had gone away."""
        process = self._process
        if process is not None and process.poll() is not None:
            self._stop(process)  # it exited once idle
            process = None
        if process is None:
            process = self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flotilla.kubesim.certs",
                    "--idle-seconds",
                    str(IDLE_SECONDS),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(line)
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], TIMEOUT_SECONDS)
            reply = process.stdout.readline() if ready else b""
        except OSError:  # BrokenPipeError: it exited before reading the request
            reply = b""
        if not reply:
            self._stop(process)
        return reply

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        if self._process is process:
            self._process = None
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            process.wait(1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the helper now (it would exit once idle anyway)."""
        with self._lock:
            if self._process is not None:
                self._stop(self._process)


_helper = _Helper()
atexit.register(_helper.close)


async def _run_helper(request: dict[str, Any]) -> dict[str, Any]:
    return await asyncio.to_thread(_helper.ask, request)


def server_context(serving: Serving) -> ssl.SSLContext:
    """An SSL context serving `serving`, offering h1 only."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # `load_cert_chain` reads files only; they live just long enough to be read.
    with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as folder:
        cert_path, key_path = Path(folder) / "tls.crt", Path(folder) / "tls.key"
        _write_private(cert_path, serving.chain_pem)
        _write_private(key_path, serving.key_pem)
        context.load_cert_chain(cert_path, key_path)
    # kubectl would pick HTTP/2 if offered; aiohttp speaks HTTP/1.1 only.
    context.set_alpn_protocols(["http/1.1"])
    return context


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
