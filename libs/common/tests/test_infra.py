import socket

import pytest

from flotilla.common.infra import NatsServer, RedisServer

pytestmark = pytest.mark.integration


def _ping_redis(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16)


def test_redis_starts_restarts_on_the_same_port() -> None:
    with RedisServer() as server:
        assert _ping_redis(server.port).startswith(b"+PONG")
        port = server.port
        server.kill()
        with pytest.raises(ConnectionRefusedError):
            _ping_redis(port)
        server.start()
        assert server.port == port
        assert _ping_redis(port).startswith(b"+PONG")


def test_nats_runs_jetstream_and_keeps_its_data_dir() -> None:
    with NatsServer() as server:
        assert server.ready()
        assert (server.data_dir / "jetstream").is_dir()
        server.kill()
        assert not server.ready()
        server.start()
        assert server.ready()
