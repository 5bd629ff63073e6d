"""The fixtures start real components: TCP Kafka, a real S3 API, a real SparkSession."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.objectstore import S3Store
from tests.conftest import unique


def test_kafka_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = unique("roundtrip-")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=10)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i in range(5):
        producer.produce(topic, key=b"k", value=f"v{i}".encode())
    assert producer.flush(10) == 0
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": unique("g-"), "fetch.wait.max.ms": 50}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    for _ in range(50):
        got += [m.value() for m in consumer.consume(5 - len(got), 0.2) if not m.error()]
        if len(got) == 5:
            break
    consumer.close()
    assert got == [f"v{i}".encode() for i in range(5)]


def test_s3_put_get_through_boto3(s3_store: S3Store) -> None:
    s3_store.put("a/b.bin", b"hello")
    assert s3_store.get("a/b.bin") == b"hello"
    assert s3_store.exists("a/b.bin")
    assert s3_store.list("a/") == ["a/b.bin"]
    s3_store.delete("a/b.bin")
    assert not s3_store.exists("a/b.bin")


@pytest.mark.spark
def test_spark_one_row_dataframe(spark: Any) -> None:
    df = spark.createDataFrame([(1, "x")], "id long, v string")
    assert df.collect()[0].asDict() == {"id": 1, "v": "x"}
