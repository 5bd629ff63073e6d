"""Issue 34 item 2's acceptance: the per-table change stream (consumers.cdc) is decoded by
the schema registry's standard Avro deserializer (confluent-kafka's `AvroDeserializer`
with its `SchemaRegistryClient`, against a real Apicurio Registry) and by Spark's
`from_avro` with the registered schemas; replaying it (upserts by key, deletes) equals the
TN; the transaction metadata topic's BEGIN/END group each multi-table transaction's
changes; ADD COLUMN registers the next version of the table's value schema; a follower
started again resumes after the last transaction it published (nothing twice, nothing
lost, the `before` image rebuilt from the logtail)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumers.cdc.follower import ChangeStreamPublisher
from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client
from tests.waiting import wait_until
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail
from tn.service.service import TnService

TABLES = ["shop.orders", "shop.stock"]


def _read_all(cfg: KwalConfig, topic: str) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every committed record of `topic`, read as a third party
    does (read_committed, no kwal code)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cfg.bootstrap,
            "group.id": f"{topic}.test",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes, bytes]] = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None, f"{topic}: no end of partition within 10 s"
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, str(err)
                return out
            out.append((msg.offset() or 0, msg.key() or b"", msg.value() or b""))
    finally:
        consumer.close()


def _decode(registry: SchemaRegistryClient, topic: str, records: list[tuple[int, bytes, bytes]]) -> list[tuple[Any, Any]]:
    """(key, value) of each record, by the registry's own deserializer (writer schema by id)."""
    deserialize = AvroDeserializer(registry)
    key_ctx = SerializationContext(topic, MessageField.KEY)
    value_ctx = SerializationContext(topic, MessageField.VALUE)
    return [(deserialize(k, key_ctx), deserialize(v, value_ctx)) for _, k, v in records]


def _tn_rows(engine: Engine, name: str, ts: int) -> dict[Any, dict[str, Any]]:
    db, table = name.split(".")
    return {r["id"]: r for r in engine.read(db, table, ts).to_pylist()}


def _spark_decoded(spark: Any, registry: SchemaRegistryClient, records: list[tuple[int, bytes, bytes]]) -> list[dict[str, Any]]:
    """Each record's value decoded by Spark's `from_avro` with the schema registered under
    its id (bytes 1-4 of the Confluent wire format; the Avro body starts at byte 5)."""
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import col, expr

    by_id: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for offset, _, value in records:
        assert value[0] == 0, "not the Confluent wire format (magic byte 0)"
        by_id[int.from_bytes(value[1:5], "big")].append((offset, value))
    out: dict[int, dict[str, Any]] = {}
    for schema_id, rows in by_id.items():
        schema = registry.get_schema(schema_id).schema_str
        frame = spark.createDataFrame(rows, "offset long, value binary")
        decoded = frame.select(
            col("offset"), from_avro(expr("substring(value, 6)"), schema).alias("e")
        ).collect()
        for row in decoded:
            out[row["offset"]] = row["e"].asDict(recursive=True)
    return [out[offset] for offset, _, _ in records]


def test_change_stream_is_read_by_standard_tools_and_replays_to_the_tn(
    kwal_config: KwalConfig, schema_registry: str, spark: Any, tmp_path: Path
) -> None:
    cfg = kwal_config
    cfg.tn.heartbeat_ms = 20
    cfg.change_stream.tables = ",".join(TABLES)
    cfg.change_stream.registry_url = schema_registry
    ensure_topics(cfg)
    engine = Engine(LogStore(MemoryDriver()))
    logtail = attach_logtail(engine, cfg)
    service = TnService(cfg, engine)
    service.start()
    stream = ChangeStreamPublisher(cfg, schema_registry).start()
    try:
        with Client(cfg, "cdc-test") as client:
            t = client.begin()
            t.create_database("shop")
            t.create_table("shop.orders", [("id", "int64"), ("item", "string"), ("qty", "int64")], "id")
            t.create_table("shop.stock", [("id", "int64"), ("left", "float64")], "id")
            t.insert("shop.stock", [{"id": k, "left": 100.0} for k in range(3)])
            t.commit(timeout=30)
            t = client.begin()
            t.insert("shop.orders", [{"id": k, "item": f"i{k}", "qty": k} for k in range(6)])
            t.commit(timeout=30)
            t = client.begin()  # multi-table: updates on both tables and deletes
            t.update("shop.orders", [{"id": 1, "item": "changed", "qty": 9}])
            t.update("shop.stock", [{"id": 1, "left": 91.0}])
            t.delete("shop.orders", [2, 3])
            multi = t.commit(timeout=30).commit_ts
            t = client.begin()  # a row inserted and deleted by one transaction: no event
            t.insert("shop.orders", [{"id": 500, "item": "gone", "qty": 1}])
            t.delete("shop.orders", [500])
            t.insert("shop.orders", [{"id": 501, "item": "kept", "qty": 1}])
            t.commit(timeout=30)
            t = client.begin()
            t.add_column("shop.orders", "note", "string")
            t.commit(timeout=30)
            t = client.begin()
            t.update("shop.orders", [{"id": 4, "item": "i4", "qty": 4, "note": "after alter"}])
            t.insert("shop.orders", [{"id": 600, "item": "new", "qty": 2, "note": "n"}])
            t.delete("shop.stock", [2])
            final = t.commit(timeout=30).commit_ts
        wait_until("the change stream published the last commit", lambda: stream.published_ts >= final or stream.errors)
        assert stream.errors == [] and stream.follower.errors == []

        registry = SchemaRegistryClient({"url": schema_registry})
        decoded: dict[str, list[tuple[Any, Any]]] = {}
        raw: dict[str, list[tuple[int, bytes, bytes]]] = {}
        for name in TABLES:
            db, table = name.split(".")
            topic = cfg.topics.changes(db, table)
            raw[name] = _read_all(cfg, topic)
            decoded[name] = _decode(registry, topic, raw[name])

        # replaying each table's stream (upserts by key, deletes) equals the TN
        for name in TABLES:
            columns = list(next(iter(_tn_rows(engine, name, final).values())))
            replay: dict[Any, dict[str, Any]] = {}
            for key, value in decoded[name]:
                assert value["source"]["db"] + "." + value["source"]["table"] == name
                assert key == {"id": (value["after"] or value["before"])["id"]}
                if value["op"] == "d":
                    assert value["after"] is None and value["before"] is not None
                    del replay[key["id"]]
                else:
                    assert value["op"] in ("c", "u")
                    replay[key["id"]] = {c: value["after"].get(c) for c in columns}
            assert replay == _tn_rows(engine, name, final), name
        ops = [(k["id"], v["op"]) for k, v in decoded["shop.orders"]]
        assert (1, "u") in ops and (2, "d") in ops and (4, "u") in ops and (600, "c") in ops
        assert 500 not in {k for k, _ in ops}
        update_1 = next(v for k, v in decoded["shop.orders"] if k["id"] == 1 and v["op"] == "u")
        assert update_1["before"]["item"] == "i1" and update_1["after"]["item"] == "changed"

        # ADD COLUMN: the orders value schema has a second registered version
        orders_topic = cfg.topics.changes("shop", "orders")
        assert registry.get_versions(f"{orders_topic}-value") == [1, 2]

        # transaction boundaries: BEGIN, then END with each table's event count
        txn_topic = cfg.topics.changes_transactions
        markers = [v for _, v in _decode(registry, txn_topic, _read_all(cfg, txn_topic))]
        events_by_txn: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for name in TABLES:
            for _, value in decoded[name]:
                events_by_txn[value["transaction"]["id"]][name] += 1
        begun: set[str] = set()
        ended: dict[str, dict[str, int]] = {}
        for m in markers:
            if m["status"] == "BEGIN":
                assert m["id"] not in begun and m["event_count"] is None
                begun.add(m["id"])
            else:
                assert m["status"] == "END" and m["id"] in begun and m["id"] not in ended
                counts = {d["data_collection"]: d["event_count"] for d in m["data_collections"]}
                assert sum(counts.values()) == m["event_count"]
                ended[m["id"]] = counts
        assert begun == set(ended) == set(events_by_txn)
        assert ended == {i: dict(c) for i, c in events_by_txn.items()}
        multi_id = next(
            v["transaction"]["id"] for _, v in decoded["shop.stock"] if v["source"]["commit_ts"] == multi
        )
        assert ended[multi_id] == {"shop.orders": 3, "shop.stock": 1}

        # Spark's from_avro, with the registered schemas, reads the same records
        for name in TABLES:
            via_spark = _spark_decoded(spark, registry, raw[name])
            assert [(e["op"], e["before"], e["after"], e["source"]["lsn"]) for e in via_spark] == [
                (v["op"], v["before"], v["after"], v["source"]["lsn"]) for _, v in decoded[name]
            ], name

        # a follower started again publishes what came after the last END, nothing twice
        stream.close()
        with Client(cfg, "cdc-test-2") as client:
            t = client.begin()
            t.update("shop.stock", [{"id": 0, "left": 1.5}])
            later = t.commit(timeout=30).commit_ts
        stream = ChangeStreamPublisher(cfg, schema_registry).start()
        assert stream.published_ts == final  # where it resumes: the newest END
        wait_until("the restarted follower published", lambda: stream.published_ts >= later or stream.errors)
        assert stream.errors == [] and stream.follower.errors == []
        again = [v for _, v in _decode(registry, txn_topic, _read_all(cfg, txn_topic))]
        assert [(m["status"], m["id"]) for m in again[: len(markers)]] == [
            (m["status"], m["id"]) for m in markers
        ]
        assert [m["status"] for m in again[len(markers):]] == ["BEGIN", "END"]
        stock_topic = cfg.topics.changes("shop", "stock")
        last = _decode(registry, stock_topic, _read_all(cfg, stock_topic))[len(decoded["shop.stock"]):]
        assert [(k["id"], v["op"], v["before"]["left"], v["after"]["left"]) for k, v in last] == [
            (0, "u", 100.0, 1.5)
        ]
    finally:
        stream.close()
        service.stop(drain_timeout_s=5)
        logtail.close()
        engine.close()
