"""A reader of kwal's topics written from `schemas/FORMAT.md` and the files beside it only.

It imports no kwal module (run it as a script: `python third_party_reader.py ...`), only
confluent-kafka, fastavro and pyarrow, as another team would. It follows the catalog
topic and the named tables' topics from their first records until its watermark reaches
`--min-ts`, then prints one JSON document: the watermark, each table at the watermark,
each table at every `--at` ts at or below it, and the modules it had loaded (so a test
can check that no kwal code ran). Section numbers (§) are FORMAT.md's.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

MAGIC = b"KW"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
NS = "kwal.logtail."


class Codec:
    """§3: the envelope; the writer's schema is the `.avsc` file the envelope names."""

    def __init__(self, schemas: Path) -> None:
        self.schemas = schemas
        self.parsed: dict[str, Any] = {}

    def decode(self, data: bytes) -> dict[str, Any]:
        if data[:2] != MAGIC or len(data) < 4:
            raise ValueError(f"not a kwal record: {data[:4]!r}")
        if data[2] != 1:
            raise ValueError(f"envelope version {data[2]} is not one this reader knows")
        end = 4 + data[3]
        name = data[4:end].decode("ascii")
        if name not in self.parsed:
            path = self.schemas / f"{name}.avsc"
            if not path.is_file():
                raise ValueError(f"schema {name!r} is unknown to this reader")
            self.parsed[name] = fastavro.parse_schema(json.loads(path.read_text()))
        buf = io.BytesIO(data[end:])
        record = fastavro.schemaless_reader(
            buf, self.parsed[name], None, return_record_name=True,
            return_record_name_override=True,
        )
        if buf.tell() != len(data) - end:
            raise ValueError(f"{name} record with trailing bytes")
        assert isinstance(record, dict)
        record["__schema"] = name
        return record


def arrow_rows(data: bytes) -> list[dict[str, Any]]:
    """§4: an Arrow IPC stream (with its end-of-stream marker) as rows."""
    if not data.endswith(END_OF_STREAM):
        raise ValueError("truncated Arrow IPC stream")
    rows: list[dict[str, Any]] = pa.ipc.open_stream(data).read_all().to_pylist()
    return rows


@dataclass
class Incarnation:
    table_id: int
    create_ts: int
    drop_ts: int = 0
    schemas: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # row id -> row
    deleted: dict[int, int] = field(default_factory=dict)  # row id -> delete ts


@dataclass
class Table:
    name: str
    mark: int = 0  # §7.4 table mark
    last_lsn: int = 0  # §7.3
    versions: dict[int, Incarnation] = field(default_factory=dict)  # table id -> incarnation

    def version(self, table_id: int) -> Incarnation:
        return self.versions.setdefault(table_id, Incarnation(table_id, 0))

    @property
    def created(self) -> bool:
        return any(v.create_ts for v in self.versions.values())

    def read(self, ts: int) -> list[dict[str, Any]] | None:
        """§7.5; None when the table does not exist at ts."""
        for inc in self.versions.values():
            if inc.create_ts and inc.create_ts <= ts and (not inc.drop_ts or ts < inc.drop_ts):
                schema = [s for from_ts, s in inc.schemas if from_ts <= ts][-1]
                names = [c["name"] for c in schema["columns"]]
                out = []
                for row_id, row in inc.rows.items():
                    gone = inc.deleted.get(row_id)
                    if row["__commit_ts"] <= ts and (gone is None or gone > ts):
                        out.append({n: row.get(n) for n in names})
                return sorted(out, key=lambda r: r[schema["primary_key"]])
        return None


class Reader:
    def __init__(self, codec: Codec, tables: list[str]) -> None:
        self.codec = codec
        self.tables = {t: Table(t) for t in tables}
        self.catalog_mark = 0

    def watermark(self) -> int:
        marks = [self.catalog_mark]
        marks += [t.mark for t in self.tables.values() if t.created]
        return min(marks)

    def apply_catalog(self, value: bytes) -> None:
        rec = self.codec.decode(value)
        kind, body = rec["body"]
        ts = rec["commit_ts"]
        if kind == NS + "Heartbeat":
            self.catalog_mark = max(self.catalog_mark, ts)
            return
        if kind != NS + "Catalog":
            return
        self.catalog_mark = max(self.catalog_mark, ts - 1)
        table = self.tables.get(f"{rec['database']}.{rec['table']}")
        if table is None or not rec["table"]:
            return
        inc = table.version(rec["table_id"])
        if body["op"] == "create_table" and not inc.create_ts:
            inc.create_ts = ts
            inc.schemas.append((ts, body["schema"]))
            table.mark = max(table.mark, ts - 1)
        elif body["op"] == "alter_table" and all(t != ts for t, _ in inc.schemas):
            inc.schemas.append((ts, body["schema"]))
        elif body["op"] == "drop_table":
            inc.drop_ts = ts

    def apply_table(self, table: Table, value: bytes) -> None:
        rec = self.codec.decode(value)
        kind, body = rec["body"]
        if kind == NS + "Changes" and rec["lsn"] > table.last_lsn:
            inc = table.version(rec["table_id"])
            for row in arrow_rows(body["inserts"]) if body["inserts"] is not None else []:
                inc.rows[row["__row_id"]] = row
            for row in arrow_rows(body["deletes"]) if body["deletes"] is not None else []:
                inc.deleted[row["__row_id"]] = row["__commit_ts"]
            table.last_lsn = rec["lsn"]
        elif kind == NS + "BlockMeta" and body["create_ts"]:
            raise RuntimeError("a compacted block: this reader does not load objects (§7.7)")
        table.mark = max(table.mark, rec["commit_ts"])


def follow(args: argparse.Namespace) -> dict[str, Any]:
    reader = Reader(Codec(Path(args.schemas)), args.tables.split(","))
    catalog = f"{args.prefix}.catalog"
    topic_of = {
        f"{args.prefix}.logtail.{name}": table for name, table in reader.tables.items()
    }
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "third-party-reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # a truncated topic needs a checkpoint (§7.6)
        "allow.auto.create.topics": False,
        "isolation.level": "read_committed",  # a fenced TN's records are aborted (§2)
    })
    consumer.assign([TopicPartition(t, 0, 0) for t in [catalog, *topic_of]])
    deadline = time.monotonic() + args.timeout
    try:
        while reader.watermark() < args.min_ts:
            if time.monotonic() > deadline:
                raise SystemExit(f"watermark {reader.watermark()} < {args.min_ts} after {args.timeout}s")
            for m in consumer.consume(500, 0.1):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SystemExit(f"{m.topic()}: {err}")
                value = m.value() or b""
                if m.topic() == catalog:
                    reader.apply_catalog(value)
                else:
                    reader.apply_table(topic_of[m.topic() or ""], value)
    finally:
        consumer.close()
    mark = reader.watermark()
    at = [int(ts) for ts in args.at.split(",") if ts] if args.at else []
    return {
        "watermark": mark,
        "tables": {name: t.read(mark) for name, t in reader.tables.items()},
        "at": {str(ts): {n: t.read(ts) for n, t in reader.tables.items()} for ts in at if ts <= mark},
        "modules": sorted(sys.modules),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--prefix", required=True, help="the topic prefix")
    p.add_argument("--tables", required=True, help="db.table,db.table")
    p.add_argument("--schemas", required=True, help="kwal's schemas/ folder")
    p.add_argument("--min-ts", type=int, default=1, help="read until the watermark reaches it")
    p.add_argument("--at", default="", help="also read the tables at these ts (comma-separated)")
    p.add_argument("--timeout", type=float, default=60.0)
    json.dump(follow(p.parse_args()), sys.stdout)


if __name__ == "__main__":
    main()
