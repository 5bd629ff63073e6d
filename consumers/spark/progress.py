"""The Spark CN job's commit record: what the job has applied, per table and for the
catalog, written as `_progress/<batch id>.json` after everything a batch wrote (atomic
rename) -- readers look only at what the newest progress file lists.

`_progress/bootstrap.json` is the first commit of a job started from a checkpoint
(`consumers.spark.bootstrap`): batch id -1, any numbered file supersedes it.

The catalog model (`apply_catalog`) follows `consumers.core.cn.CNCore._apply_catalog`: a
table name has incarnations ([create ts, drop ts) with their schema history).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.core.exceptions import NotSubscribedError
from consumers.spark.decode import union_columns
from schemas.logtail import Catalog, CatalogOp, LogtailRecord
from schemas.wal import ColumnDef, TableSchema
from tn.checkpoint.manifest import schema_in, schema_out

PROGRESS = "_progress"
CHANGES = "_changes"  # the change log (`consumers.spark.job`)
KEEP_PROGRESS = 20


@dataclass
class Incarnation:
    """One lifetime of a table name: [create_ts, drop_ts) with its schema history."""

    create_ts: int
    table_id: int = 0
    drop_ts: int = 0  # 0 = alive
    schemas: list[tuple[int, TableSchema]] = field(default_factory=list)

    def alive_at(self, ts: int) -> bool:
        return self.create_ts <= ts and (self.drop_ts == 0 or ts < self.drop_ts)

    def schema_at(self, ts: int) -> TableSchema:
        current = self.schemas[0][1]
        for from_ts, schema in self.schemas:
            if from_ts <= ts:
                current = schema
        return current

    def to_json(self) -> dict[str, Any]:
        return {
            "create_ts": self.create_ts,
            "table_id": self.table_id,
            "drop_ts": self.drop_ts,
            "schemas": [[ts, schema_out(s)] for ts, s in self.schemas],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Incarnation:
        return cls(
            int(d["create_ts"]),
            int(d["table_id"]),
            int(d["drop_ts"]),
            [(int(ts), schema_in(s)) for ts, s in d["schemas"]],
        )


@dataclass
class TableProgress:
    name: str  # db.table
    topic: str
    watermark: int = 0  # highest commit/heartbeat ts decoded from the table's topic
    incarnations: list[Incarnation] = field(default_factory=list)
    state_batch: int | None = None  # state/batch=<id> holds the current state
    state_create_ts: int = 0  # the incarnation the state belongs to
    index: int = 0  # the table's number in the change log's wide schema (stable)
    pending: list[int] = field(default_factory=list)  # batches with its records undecoded (R)
    pending_columns: list[str] = field(default_factory=list)  # the columns those records carry
    pending_ts: tuple[int, int] = (0, 0)  # the lowest and highest commit ts among them
    change_rows: int = 0  # inserts + deletes in the change log
    blocks: dict[str, str] = field(default_factory=dict)  # block id -> BlockMeta JSON
    last_checkpoint: str = ""
    # change-log directories: [batch id, path relative to output, column prefix]
    change_dirs: list[list[Any]] = field(default_factory=list)
    uncompacted: int = 0  # change rows after the state's batch
    compacted_at: float = 0.0  # wall time of the last compaction
    # The Delta output (consumers.spark.delta_sink): the last batch whose changes are in it,
    # the incarnation (create ts) being written, and the watermark its last version records.
    delta_batch: int | None = None
    delta_create_ts: int = 0
    delta_watermark: int = 0
    delta_changes: int = 0  # inserts + deletes in the change log after delta_batch
    delta_deletes: int = 0  # of which deletes
    delta_ts: int = 0  # every change with commit ts <= this is in Delta
    delta_change_ts: int = 0  # no decoded change has a commit ts above this
    # Where a job resumes this table's topic from the Delta output alone (consumers.spark.
    # job_state): per change-log batch with records of the topic, [batch id, first offset,
    # highest commit ts] while some of them may be above delta_ts; the next offset to read.
    offsets: list[list[int]] = field(default_factory=list)
    next_offset: int = 0  # 0: none read yet (the job's start offset applies)

    @property
    def current(self) -> Incarnation | None:
        return self.incarnations[-1] if self.incarnations else None

    @property
    def applied_ts(self) -> int:
        """Every change of the table's topic with commit ts <= this is in the change log:
        the watermark, held below the first record still undecoded."""
        if self.pending:
            return min(self.watermark, self.pending_ts[0] - 1)
        return self.watermark

    def columns(self) -> list[ColumnDef]:
        inc = self.current
        return union_columns(s for _, s in inc.schemas) if inc else []

    def dirs_after(self, base: int | None, upto: int | None = None) -> list[list[Any]]:
        return [
            d
            for d in self.change_dirs
            if (base is None or d[0] > base) and (upto is None or d[0] <= upto)
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic": self.topic,
            "watermark": self.watermark,
            "incarnations": [i.to_json() for i in self.incarnations],
            "state_batch": self.state_batch,
            "state_create_ts": self.state_create_ts,
            "index": self.index,
            "pending": self.pending,
            "pending_columns": self.pending_columns,
            "pending_ts": list(self.pending_ts),
            "change_rows": self.change_rows,
            "blocks": self.blocks,
            "last_checkpoint": self.last_checkpoint,
            "change_dirs": self.change_dirs,
            "uncompacted": self.uncompacted,
            "compacted_at": self.compacted_at,
            "delta_batch": self.delta_batch,
            "delta_create_ts": self.delta_create_ts,
            "delta_watermark": self.delta_watermark,
            "delta_changes": self.delta_changes,
            "delta_deletes": self.delta_deletes,
            "delta_ts": self.delta_ts,
            "delta_change_ts": self.delta_change_ts,
            "offsets": self.offsets,
            "next_offset": self.next_offset,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableProgress:
        return cls(
            d["name"],
            d["topic"],
            int(d["watermark"]),
            [Incarnation.from_json(i) for i in d["incarnations"]],
            d["state_batch"],
            int(d["state_create_ts"]),
            int(d["index"]),
            [int(b) for b in d["pending"]],
            list(d.get("pending_columns", [])),
            _ts_range(d.get("pending_ts", (0, 0))),
            int(d["change_rows"]),
            dict(d["blocks"]),
            d["last_checkpoint"],
            [list(x) for x in d["change_dirs"]],
            int(d["uncompacted"]),
            float(d["compacted_at"]),
            d.get("delta_batch"),
            int(d.get("delta_create_ts", 0)),
            int(d.get("delta_watermark", 0)),
            int(d.get("delta_changes", 1)),  # unknown (older progress): assume some
            int(d.get("delta_deletes", 1)),
            int(d.get("delta_ts", 0)),
            int(d.get("delta_change_ts", 0)),
            [[int(x) for x in e] for e in d.get("offsets", [])],
            int(d.get("next_offset", 0)),
        )


@dataclass
class Progress:
    batch_id: int = -1
    catalog_topic: str = ""
    catalog_watermark: int = 0
    tables: dict[str, TableProgress] = field(default_factory=dict)
    committed_at: float = 0.0
    # A job started from a checkpoint (`consumers.spark.bootstrap`): its ts (reads below it
    # are refused, records at or below it dropped), and topic -> offset of partition 0 to
    # start from (-2: earliest) while Spark's checkpointLocation has no offsets yet.
    horizon: int = 0
    start_offsets: dict[str, int] = field(default_factory=dict)
    # Spark's micro-batch id + batch_base = the job's batch id (a job resumed from its
    # Delta output alone starts a new Spark checkpoint at 0; its batch ids continue).
    batch_base: int = 0
    catalog_offset: int = 0  # the catalog topic's next offset to read (0: the start offset)
    # offsets tracked since the job's first batch (progress files of an earlier kwal lack
    # them: no resume point is written to the output for such a job)
    offsets_known: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "catalog_topic": self.catalog_topic,
            "catalog_watermark": self.catalog_watermark,
            "tables": {k: v.to_json() for k, v in self.tables.items()},
            "committed_at": self.committed_at,
            "horizon": self.horizon,
            "start_offsets": self.start_offsets,
            "batch_base": self.batch_base,
            "catalog_offset": self.catalog_offset,
            "offsets_known": self.offsets_known,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Progress:
        return cls(
            int(d["batch_id"]),
            d["catalog_topic"],
            int(d["catalog_watermark"]),
            {k: TableProgress.from_json(v) for k, v in d["tables"].items()},
            float(d.get("committed_at", 0.0)),
            int(d.get("horizon", 0)),
            {str(t): int(o) for t, o in d.get("start_offsets", {}).items()},
            int(d.get("batch_base", 0)),
            int(d.get("catalog_offset", 0)),
            bool(d.get("offsets_known", False)),
        )

    def table(self, name: str) -> TableProgress:
        tp = self.tables.get(name)
        if tp is None:
            raise NotSubscribedError(f"table {name} is not followed by this CN job")
        return tp

    def watermark(self, table: str | None = None) -> int:
        if table is not None:
            tp = self.table(table)
            if tp.current is None:
                return 0
            if tp.current.drop_ts:  # nothing more will come on its topic
                return self.catalog_watermark
            return min(self.catalog_watermark, tp.applied_ts)
        # A dropped table's topic stops: it no longer holds the job's watermark back.
        marks = [self.catalog_watermark]
        marks.extend(
            tp.applied_ts
            for tp in self.tables.values()
            if tp.current is not None and not tp.current.drop_ts
        )
        return min(marks)


def _progress_dir(output: str | Path) -> Path:
    return Path(output) / PROGRESS


BOOTSTRAP_PROGRESS = "bootstrap.json"


def load_progress(output: str | Path) -> Progress | None:
    """The last committed progress of the job writing to `output` (None: nothing yet): the
    newest numbered file, else the bootstrap commit."""
    d = _progress_dir(output)
    if not d.is_dir():
        return None
    ids = sorted(int(p.stem) for p in d.glob("*.json") if p.stem.isdigit())
    names = [f"{batch_id:020d}.json" for batch_id in reversed(ids)] + [BOOTSTRAP_PROGRESS]
    for name in names:
        try:
            return Progress.from_json(json.loads((d / name).read_text()))
        except (OSError, ValueError, KeyError):
            continue  # a torn file cannot exist (atomic rename), but be tolerant
    return None


def write_progress(output: str | Path, progress: Progress) -> None:
    """Commit `progress` (atomic rename); keeps the newest KEEP_PROGRESS numbered files.
    Batch id -1 is the bootstrap commit (`BOOTSTRAP_PROGRESS`)."""
    d = _progress_dir(output)
    d.mkdir(parents=True, exist_ok=True)
    name = BOOTSTRAP_PROGRESS if progress.batch_id < 0 else f"{progress.batch_id:020d}.json"
    final = d / name
    tmp = d / f".{name}.tmp"
    tmp.write_text(json.dumps(progress.to_json(), sort_keys=True))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    old = sorted(p for p in d.glob("*.json") if p.stem.isdigit())
    for p in old[:-KEEP_PROGRESS]:
        p.unlink(missing_ok=True)


# -- the catalog -------------------------------------------------------------------------


def apply_catalog(progress: Progress, record: LogtailRecord) -> None:
    """Apply one record of the catalog topic: the rules of `CNCore._apply_catalog`, except
    that a DDL record moves the catalog watermark to its own ts, where CNCore moves it to
    ts - 1 until the TN's mark after the group. A micro-batch that ends inside a
    transaction's records can therefore claim its ts early here (not changed yet)."""
    progress.catalog_watermark = max(progress.catalog_watermark, record.commit_ts)
    body = record.body
    if not isinstance(body, Catalog):
        return  # the catalog topic's heartbeat
    if body.op in (CatalogOp.CREATE_DATABASE, CatalogOp.DROP_DATABASE):
        return
    tp = progress.tables.get(f"{record.database}.{record.table}")
    if tp is None:
        return
    inc = tp.current
    if body.op is CatalogOp.CREATE_TABLE:
        if inc is not None and inc.create_ts == record.commit_ts:
            return  # re-delivered
        assert body.schema is not None, "create_table without a schema"
        if inc is None or inc.drop_ts:
            tp.incarnations.append(
                Incarnation(record.commit_ts, record.table_id, 0, [(record.commit_ts, body.schema)])
            )
        else:  # created again without a drop: keep the rows, take the new schema (as CNCore)
            inc.create_ts = record.commit_ts
            inc.schemas.append((record.commit_ts, body.schema))
    elif inc is None:
        return
    elif body.op is CatalogOp.DROP_TABLE:
        inc.drop_ts = inc.drop_ts or record.commit_ts
    elif body.op is CatalogOp.ALTER_TABLE and body.schema is not None:
        if all(ts != record.commit_ts for ts, _ in inc.schemas):
            inc.schemas.append((record.commit_ts, body.schema))


def _ts_range(value: Sequence[int]) -> tuple[int, int]:
    lo, hi = value
    return int(lo), int(hi)


def query_name(output: str | Path) -> str:
    """The name of the query writing to `output` (its progress events carry it)."""
    return f"kwal-cn-{abs(hash(str(output))) % 10**8}"
