"""An embedded broker of a test's own that can be stopped and started again without
losing its topics: its data lives in a bucket on the session's loopback S3 server."""

from __future__ import annotations

from infra.broker import start_broker
from infra.config import ObjectStoreConfig
from infra.objectstore import S3Store
from infra.processes import ServerProcess
from infra.s3server import ACCESS_KEY, SECRET_KEY
from tests.conftest import LOG_DIR, unique


class RestartableBroker:
    def __init__(self, s3_server: ServerProcess) -> None:
        self.endpoint = f"http://{s3_server.address}"
        self.bucket = unique("tansu-")
        S3Store(
            self.bucket,
            "",
            ObjectStoreConfig(
                endpoint_url=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY
            ),
        ).ensure_bucket()
        self.process = self._start(None)
        self.address = self.process.address

    def _start(self, port: int | None) -> ServerProcess:
        return start_broker(
            LOG_DIR,
            storage=f"s3://{self.bucket}/",
            s3_endpoint=self.endpoint,
            s3_access_key=ACCESS_KEY,
            s3_secret_key=SECRET_KEY,
            port=port,
        )

    def stop(self) -> None:
        self.process.stop()

    def restart(self) -> None:
        """Start it again on the same port (after `stop`)."""
        self.process = self._start(int(self.address.rsplit(":", 1)[1]))
