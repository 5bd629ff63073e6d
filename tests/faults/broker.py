"""A broker of a test's own that can be stopped and started again without losing its
topics: Apache Kafka keeps its data on local disk and comes back on the same ports;
the embedded broker keeps it in a bucket on the session's loopback S3 server."""

from __future__ import annotations

from infra.brokers.apache_kafka import KafkaNode
from infra.brokers.tansu import start_broker
from infra.config import ObjectStoreConfig
from infra.objectstore import S3Store
from infra.processes import ServerProcess
from infra.s3server import ACCESS_KEY, SECRET_KEY
from tests.conftest import TEST_BROKER, _log_dir, server_dir, unique


class RestartableBroker:
    def __init__(self, s3_server: ServerProcess) -> None:
        self.kafka: KafkaNode | None = None
        if TEST_BROKER == "kafka":
            self.kafka = KafkaNode(server_dir("restartable-"))
        else:
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
        if self.kafka is not None:
            return self.kafka.start()  # same node, same ports, same data
        return start_broker(
            _log_dir(),
            storage=f"s3://{self.bucket}/",
            s3_endpoint=self.endpoint,
            s3_access_key=ACCESS_KEY,
            s3_secret_key=SECRET_KEY,
            port=port,
        )

    def stop(self) -> None:
        self.process.stop(timeout_s=30)

    def restart(self) -> None:
        """Start it again on the same port (after `stop`)."""
        self.process = self._start(int(self.address.rsplit(":", 1)[1]))
