"""WAL record format versions on a real Kafka WAL topic: records written in the old
formats (version 1, one Avro + Arrow payload per entry; version 2, one columnar payload
per record) replay beside version 3 records (one-block appends as int64 columns; these
compressed, `wal.compression`), and a record of an unknown version stops the opening
with an error naming the version and the record."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from infra.config import KwalConfig
from schemas.exceptions import DecodeError, UnsupportedFormatError
from schemas.wal_record import RECORD_V1, RECORD_V2, RECORD_V3
from tests.logstore_kafka.conftest import RawWal
from tests.tn.helpers import setup_table
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.logstore.kafka_backend.headers import H_VERSION, decode_headers, entries_headers
from tn.logstore.kafka_backend.kio import reader_conf
from tn.replay import physical_state


def _commit_concurrently(engine: Engine, base: int, clients: int = 4, each: int = 3) -> None:
    """Inserts, updates and deletes from several threads at once, so that the writer
    groups several entries into one record."""
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            for j in range(each):
                k = base + i * 1000 + j
                txn = engine.begin()
                txn.insert("db", "t", [{"id": k, "v": f"{i}.{j}"}, {"id": -k, "v": "pair"}])
                txn.commit().result(30)
                txn = engine.begin()
                txn.update("db", "t", [{"id": k, "v": "updated"}])
                txn.delete("db", "t", [-k])
                txn.commit().result(30)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _versions(cfg: KwalConfig) -> list[tuple[int, int]]:
    """(record format version, entry count) of every `entries` record on the WAL topic."""
    c = Consumer(reader_conf(cfg.kafka_client()))
    try:
        tp = TopicPartition(cfg.topics.wal, 0)
        _, end = c.get_watermark_offsets(tp, timeout=10)
        c.assign([TopicPartition(cfg.topics.wal, 0, 0)])
        out = []
        deadline = time.monotonic() + 30
        # offsets have gaps (transaction markers): the end is the position reaching `end`
        while c.position([tp])[0].offset < end:
            assert time.monotonic() < deadline, f"WAL topic read stalled before offset {end}"
            msg = c.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            header = decode_headers(msg.headers())
            if header.count:
                out.append((header.version, header.count))
        return out
    finally:
        c.close()


def test_old_format_records_replay_beside_new_ones(wal_config: KwalConfig) -> None:
    # 1. an old writer: every record in format version 1
    log = LogStore(KafkaDriver(wal_config, delete_records=False, record_version=RECORD_V1))
    engine = Engine(log)
    setup_table(engine)
    _commit_concurrently(engine, 1)
    state_v1 = physical_state(engine.catalog)
    engine.close()
    log.close()
    assert {v for v, _ in _versions(wal_config)} == {RECORD_V1}
    # 2. a version 2 writer replays them, then appends version 2 records
    log = LogStore(KafkaDriver(wal_config, delete_records=False, record_version=RECORD_V2))
    engine = Engine.recover(log)
    assert physical_state(engine.catalog) == state_v1
    _commit_concurrently(engine, 100_000)
    state_v2 = physical_state(engine.catalog)
    engine.close()
    log.close()
    # 3. today's writer replays both, then appends version 3 records, lz4-compressed
    # (`wal.compression`; readers need no setting)
    lz4 = dataclasses.replace(wal_config, wal=dataclasses.replace(wal_config.wal, compression="lz4"))
    log = LogStore(KafkaDriver(lz4, delete_records=False))
    engine = Engine.recover(log)
    assert physical_state(engine.catalog) == state_v2
    _commit_concurrently(engine, 200_000)
    state_all = physical_state(engine.catalog)
    read_all = engine.read("db", "t")
    engine.close()
    log.close()
    versions = _versions(wal_config)
    assert {v for v, _ in versions} == {RECORD_V1, RECORD_V2, RECORD_V3}
    # the new records did group several entries into one columnar payload
    assert max(n for v, n in versions if v == RECORD_V2) > 1
    assert max(n for v, n in versions if v == RECORD_V3) > 1
    # 4. the three versions, compressed or not, replay into the same state, rows and all
    log = LogStore(KafkaDriver(wal_config, delete_records=False))
    engine = Engine.recover(log)
    try:
        assert physical_state(engine.catalog) == state_all
        assert engine.read("db", "t").equals(read_all)
        assert read_all.num_rows == 3 * 4 * 3  # of each insert's two rows, one survives
    finally:
        engine.close()
        log.close()


def test_unknown_record_version_stops_the_opening_naming_it(
    wal_config: KwalConfig, raw_wal: RawWal
) -> None:
    headers = entries_headers(1, 1, 1, 0, "raw1") + [(H_VERSION, (9).to_bytes(8, "big"))]
    raw_wal.producer.produce(
        wal_config.topics.wal, value=b"\x00" * 12, partition=0, headers=headers
    )
    assert raw_wal.producer.flush(10) == 0
    with pytest.raises(UnsupportedFormatError) as err:
        KafkaDriver(wal_config, delete_records=False)
    msg = str(err.value)
    assert "format version 9" in msg and f"{wal_config.topics.wal}/0@0" in msg, msg


def test_garbled_version_2_record_is_refused_naming_it(
    wal_config: KwalConfig, raw_wal: RawWal
) -> None:
    raw_wal.meta("epoch/1/raw1", {"epoch": 1, "writer": "raw1"})
    headers = entries_headers(1, 1, 2, 0, "raw1", RECORD_V2)
    # a wal_group envelope whose body is cut short: the opening reads headers and
    # envelopes only; the entries are decoded when first read, and refused then
    value = b"KW\x01\x09wal_group\x02\x00"
    raw_wal.producer.produce(wal_config.topics.wal, value=value, partition=0, headers=headers)
    assert raw_wal.producer.flush(10) == 0
    driver = KafkaDriver(wal_config, delete_records=False)
    try:
        assert driver.last_lsn() == 2
        with pytest.raises(DecodeError) as err:
            Engine.recover(LogStore(driver))
        msg = str(err.value)
        assert "(version 2)" in msg and f"{wal_config.topics.wal}/0@0" in msg, msg
    finally:
        driver.close()
    # a value that is not a wal_group envelope at all stops the opening itself
    raw_wal.producer.produce(wal_config.topics.wal, value=b"junk" * 4, partition=0, headers=headers)
    assert raw_wal.producer.flush(10) == 0
    with pytest.raises(UnsupportedFormatError, match=r"\(version 2\): not a kwal record"):
        KafkaDriver(wal_config, delete_records=False)
