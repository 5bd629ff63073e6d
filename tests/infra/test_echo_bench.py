"""The commit bench's ceiling (`ops.bench.echo`): a real round trip through the broker."""

from __future__ import annotations

from infra.config import KwalConfig
from ops.bench.echo import EchoClients, EchoServer


def test_every_request_comes_back_once_and_the_server_stops(kwal_config: KwalConfig) -> None:
    server = EchoServer(kwal_config)
    with server:
        clients = EchoClients(kwal_config)
        try:
            futures = [clients.send() for _ in range(200)]
            for f in futures:
                assert f.result(30) is None
            assert clients.pending() == 0
        finally:
            clients.close()
    assert server.exit_code() is not None

