"""Decoding logtail records for the Spark CN when a table's schema moves on (ALTER TABLE):
pure pyarrow, no Spark, no broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from consumers.core.exceptions import SchemaMismatchError
from consumers.spark.batch_writer import _decodable
from consumers.spark.decode import (
    HEARTBEAT,
    INSERT,
    META,
    OP,
    RAW,
    RAW_RECORD,
    DecodePlan,
    change_schema,
    changed_columns,
    decode_all,
    decode_changes,
    wide_name,
)
from consumers.spark.kafka_io import KafkaSourceError
from consumers.spark.progress import Incarnation, TableProgress
from consumers.spark.source import KwalKafkaDataSource, SourceOptions, decode_plan
from schemas.arrow_ipc import table_to_ipc
from schemas.logtail import COMMIT_TS, ROW_ID, Changes, Heartbeat, LogtailRecord, encode_logtail
from schemas.wal import ColumnDef, ColumnType, TableSchema

V1 = TableSchema((ColumnDef(1, "id", ColumnType.INT64, False), ColumnDef(2, "v", ColumnType.STRING)), "id")
V2 = TableSchema((*V1.columns, ColumnDef(3, "extra", ColumnType.INT64)), "id")


def _record(ts: int, extra: bool) -> bytes:
    cols: dict[str, pa.Array] = {
        ROW_ID: pa.array([ts], pa.int64()),
        COMMIT_TS: pa.array([ts], pa.int64()),
        "id": pa.array([ts], pa.int64()),
        "v": pa.array([f"v{ts}"]),
    }
    if extra:
        cols["extra"] = pa.array([ts * 10], pa.int64())
    body = Changes(table_to_ipc(pa.table(cols)), None)
    return encode_logtail(LogtailRecord("db", "t", ts, body, 1, ts))


def _kafka(values: list[bytes]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "topic": pa.array(["t"] * len(values)),
            "offset": pa.array(range(len(values)), pa.int64()),
            "value": pa.array(values, pa.binary()),
        }
    )


def test_a_record_with_a_column_the_plan_lacks_is_kept_whole_with_its_columns() -> None:
    values = [_record(10, extra=False), _record(11, extra=True)]
    out = pa.Table.from_batches(list(decode_all([_kafka(values)], DecodePlan({"t": 0}, {0: list(V1.columns)}))))
    rows = out.to_pylist()
    decoded = [r for r in rows if r[OP] == INSERT]
    kept = [r for r in rows if r[OP] == RAW_RECORD]
    assert [r[wide_name(0, "id")] for r in decoded] == [10]
    assert len(kept) == 1 and kept[0][RAW] == values[1]
    assert json.loads(kept[0][META]) == ["extra", "id", "v"]
    # with the altered schema in the plan, the same record decodes, its value kept
    out = pa.Table.from_batches(list(decode_all([_kafka(values)], DecodePlan({"t": 0}, {0: list(V2.columns)}))))
    assert out.column(wide_name(0, "extra")).to_pylist() == [None, 110]


def test_records_spliced_into_one_stream_keep_their_own_lsn_offset_and_heartbeats() -> None:
    """The decoder reads a table's records of one schema as one spliced Arrow stream: each
    row keeps its record's LSN and offset; a record whose stream holds two batches, or an
    empty one (kept as a heartbeat), is read on its own, as before; a garbled one fails."""
    from consumers.spark.decode import LSN, OFFSET
    from schemas.exceptions import DecodeError

    def stream(batches: list[pa.RecordBatch]) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as w:
            for b in batches:
                w.write_batch(b)
        return sink.getvalue().to_pybytes()

    def rows(ts: int, n: int) -> pa.RecordBatch:
        ids = [ts * 10 + i for i in range(n)]
        return pa.record_batch({ROW_ID: ids, COMMIT_TS: [ts] * n, "id": ids, "v": ["x"] * n})

    def record(ts: int, inserts: bytes) -> bytes:
        return encode_logtail(LogtailRecord("db", "t", ts, Changes(inserts, None), 1, ts * 7))

    values = [
        _record(10, extra=False),
        record(11, stream([rows(11, 2), rows(11, 1)])),  # two batches in one record
        record(12, stream([rows(12, 0)])),  # an empty batch: a heartbeat
        record(13, stream([rows(13, 3)])),
    ]
    plan = DecodePlan({"t": 0}, {0: list(V1.columns)})
    out = pa.Table.from_batches(list(decode_all([_kafka(values)], plan))).to_pylist()
    got = sorted((r[OP], r[COMMIT_TS], r[LSN], r[OFFSET]) for r in out)
    assert got == sorted(
        [(INSERT, 10, 10, 0)] + [(INSERT, 11, 77, 1)] * 3 + [(HEARTBEAT, 12, 84, 2)]
        + [(INSERT, 13, 91, 3)] * 3
    )
    garbled = record(14, stream([rows(14, 2)])[:-30] + stream([rows(14, 2)])[-8:])
    with pytest.raises(DecodeError):
        list(decode_all([_kafka([_record(10, extra=False), garbled])], plan))


def test_decode_changes_refuses_a_record_its_schema_cannot_hold() -> None:
    batch = _kafka([_record(11, extra=True)]).select(["value", "offset"])
    with pytest.raises(SchemaMismatchError, match=r"db\.t: .*offset 0.*\['extra'\]"):
        list(decode_changes([batch], change_schema(V1.columns)))
    assert changed_columns(LogtailRecord("db", "t", 1, Changes(None, None))) == []


def test_undecoded_records_wait_for_their_alter_then_fail_loudly_without_it() -> None:
    tp = TableProgress("db.t", "t", watermark=30, pending=[4], pending_columns=["extra", "id"])
    tp.pending_ts = (20, 25)
    assert not _decodable(tp, catalog_watermark=30)  # no create_table yet
    assert tp.applied_ts == 19  # held below the first undecoded record
    tp.incarnations.append(Incarnation(5, 1, 0, [(5, V1)]))
    assert not _decodable(tp, catalog_watermark=24)  # the alter may still come
    tp.current.schemas.append((18, V2))  # type: ignore[union-attr]
    assert _decodable(tp, catalog_watermark=24)
    tp.current.schemas.pop()  # type: ignore[union-attr]
    with pytest.raises(SchemaMismatchError, match=r"db\.t: .*ts 25.*\['extra'\]"):
        _decodable(tp, catalog_watermark=25)


def test_a_decoding_plan_round_trips_and_the_source_refuses_a_bad_one() -> None:
    topics = {"catalog": -1, "t": 0, "u": 1}
    plan: dict[int, list[ColumnDef] | None] = {0: list(V2.columns), 1: None}
    decode = DecodePlan(topics, plan, horizon=7)
    assert DecodePlan.from_json(decode.to_json()) == decode
    opts = {"bootstrap": "127.0.0.1:9", "topics": "t", "decode": decode.to_json()}
    assert decode_plan(SourceOptions.parse(opts, streaming=True).decode) == decode
    bad = {**opts, "decode": '{"plan": {}}'}
    with pytest.raises(KafkaSourceError, match="'decode' option is not a decoding plan"):
        KwalKafkaDataSource(bad).schema()  # on the driver, when the DataFrame is loaded
    with pytest.raises(KafkaSourceError, match="'decode' option is not a decoding plan"):
        decode_plan(SourceOptions.parse(bad, streaming=False).decode)  # by each read


def test_the_stream_readers_offset_planning_does_not_import_the_decoder() -> None:
    """Spark runs a stream reader's offset planning in a Python process it starts for each
    query: that process must not pay for importing the decoder (see `source`'s note)."""
    decode = DecodePlan({"t": 0}, {0: list(V1.columns)})
    script = (
        "import sys\n"
        "from consumers.spark.source import KwalKafkaDataSource, SOURCE_SCHEMA\n"
        f"opts = {{'bootstrap': '127.0.0.1:9', 'topics': 't', 'decode': {decode.to_json()!r}}}\n"
        "reader = KwalKafkaDataSource(opts).streamReader(SOURCE_SCHEMA)\n"
        "reader.getDefaultReadLimit()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('consumers', 'schemas'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout
    assert "consumers.spark.source" in loaded
    assert "consumers.spark.decode" not in loaded and "schemas.logtail" not in loaded, loaded


def test_records_at_or_below_the_horizon_are_dropped_but_heartbeats() -> None:
    """A job started from a checkpoint at ts 11 has those rows from the objects already."""
    beat = encode_logtail(LogtailRecord("db", "t", 11, Heartbeat()))
    values = [_record(10, extra=False), _record(11, extra=False), beat, _record(12, extra=False)]
    plan = DecodePlan({"t": 0}, {0: list(V1.columns)}, horizon=11)
    rows = pa.Table.from_batches(list(decode_all([_kafka(values)], plan))).to_pylist()
    assert sorted((r[OP], r[COMMIT_TS]) for r in rows) == [(HEARTBEAT, 11), (INSERT, 12)]
    everything = DecodePlan({"t": 0}, {0: list(V1.columns)})
    assert len(pa.Table.from_batches(list(decode_all([_kafka(values)], everything)))) == 4
