"""`kwal wal dump`: print the entries of a WAL, one line each.

Human form (default)::

    lsn=7 start=1000 commit=1001 memo=1: append t=3 blk=7 rows 0..99 (100); delete t=3 blk=7 rows=[3,4]
    lsn=8 start=1002 commit=1003 memo=0: catalog table#3 create 'orders' (2 cols, pk=id, v1)
    lsn=9 ERROR: cannot decode 'wal_entry' record (12 bytes): body truncated
    -- 3 entries (lsn 7..9), 1 error

With ``--json`` one JSON object per entry (``{"lsn": 9, "error": "..."}`` for
one that does not decode) and no summary line, so the output pipes into jq.

A record that does not decode (or whose Append batch is not Arrow IPC covering
the rows its AppendInfos point at, or that carries another LSN than the one it
is stored at) is reported and the dump goes on: the point of the tool is to
look at a damaged log. Any such record makes the exit code 1.
The formatting works on any `LogRecord` iterable, so it is independent of the
backend; `run` opens the file backend's directory.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from schemas.arrow_ipc import ipc_to_table
from schemas.codec import decode_entry, entry_to_record
from schemas.exceptions import CodecError, DecodeError
from schemas.wal import Append, CatalogKind, CatalogReason, Command, Delete, Dest, WalEntry
from tn.logstore.driver import LogDriver, LogRecord, LogStore, LogStoreError

MAX_ROWS_SHOWN = 10


def _rows(first: int, length: int) -> str:
    return f"rows {first}..{first + length - 1} ({length})" if length else "rows - (0)"


def _row_list(rows: tuple[int, ...]) -> str:
    if len(rows) <= MAX_ROWS_SHOWN:
        return "rows=[" + ",".join(map(str, rows)) + "]"
    head = ",".join(map(str, rows[: MAX_ROWS_SHOWN - 2]))
    return f"rows=[{head},...,{rows[-1]}] ({len(rows)})"


_NODE_ID: dict[CatalogKind, Callable[[Dest], int]] = {
    CatalogKind.DATABASE: lambda d: d.db_id,
    CatalogKind.TABLE: lambda d: d.table_id,
    CatalogKind.SEGMENT: lambda d: d.segment_id,
    CatalogKind.BLOCK: lambda d: d.block_id,
}


def summarize_command(cmd: Command) -> str:
    """One short human phrase per command."""
    if isinstance(cmd, Append):
        parts = [
            f"t={i.dest.table_id} blk={i.dest.block_id} {_rows(i.dest_offset, i.dest_length)}"
            for i in cmd.infos
        ]
        return "append " + (", ".join(parts) if parts else "(no rows)")
    if isinstance(cmd, Delete):
        return f"delete t={cmd.dest.table_id} blk={cmd.dest.block_id} {_row_list(cmd.rows)}"
    node = cmd.node
    if cmd.reason is CatalogReason.FLUSH:
        action = "update"
    else:
        action = "drop" if node.delete_ts else "create"
    text = f"catalog {cmd.kind.value}#{_NODE_ID[cmd.kind](cmd.dest)} {action}"
    if node.name:
        text += f" {node.name!r}"
    if node.schema is not None:
        s = node.schema
        text += f" ({len(s.columns)} cols, pk={s.primary_key}, v{s.version})"
    if node.meta_loc:
        text += f" meta={node.meta_loc}"
    if node.delta_loc:
        text += f" delta={node.delta_loc}"
    if cmd.reason is not CatalogReason.DDL:
        text += f" [{cmd.reason.value}]"
    return text


def summarize_entry(entry: WalEntry) -> str:
    t = entry.txn
    commands = "; ".join(map(summarize_command, entry.commands)) or "(no commands)"
    return f"lsn={entry.lsn} start={t.start_ts} commit={t.commit_ts} memo={len(t.memo)}: {commands}"


_COMMAND_TYPES = {
    "kwal.wal.UpdateCatalog": "update_catalog",
    "kwal.wal.Append": "append",
    "kwal.wal.Delete": "delete",
}


def entry_to_json(entry: WalEntry) -> dict[str, Any]:
    """The entry as JSON-ready data: the Avro record's fields, with each command
    tagged by ``type`` and an Append's batch replaced by its size and row count
    (the batch must be valid Arrow IPC, as `dump_records` checks first). An entry of
    a version 2 WAL record shares its record's batch: the size and count are the
    batch's, and the infos' ``src_offset`` count from its first row."""
    record = entry_to_record(entry)
    out: dict[str, Any] = {"lsn": record["lsn"], **record["txn"], "commands": []}
    for name, fields in record["commands"]:
        command = {"type": _COMMAND_TYPES[name], **fields}
        if "batch" in command:
            batch = command.pop("batch")
            command["batch_bytes"] = len(batch)
            command["batch_rows"] = ipc_to_table(batch, validate=False).num_rows
        out["commands"].append(command)
    return out


def _check_batches(entry: WalEntry) -> None:
    """Each Append's batch must be Arrow IPC holding every row its infos point at."""
    for n, cmd in enumerate(entry.commands):
        if not isinstance(cmd, Append):
            continue
        try:
            rows = ipc_to_table(cmd.batch).num_rows
        except DecodeError as e:
            raise DecodeError(f"command {n} (append): {e}") from e
        for info in cmd.infos:
            if info.src_offset + info.src_length > rows:
                raise DecodeError(
                    f"command {n} (append): rows {info.src_offset}..+{info.src_length} "
                    f"point past the batch's {rows} rows"
                )


def _decode(record: LogRecord) -> WalEntry:
    entry = decode_entry(record.payload)
    if entry.lsn != record.lsn:
        raise CodecError(f"entry carries lsn {entry.lsn} but is stored at lsn {record.lsn}")
    _check_batches(entry)
    return entry


def dump_records(records: Iterable[LogRecord], as_json: bool, out: TextIO) -> int:
    """Print every record of `records`; return how many could not be decoded."""
    count = errors = 0
    first = last = None
    for record in records:
        count += 1
        first = record.lsn if first is None else first
        last = record.lsn
        try:
            entry = _decode(record)
        except CodecError as e:
            errors += 1
            line = json.dumps({"lsn": record.lsn, "error": str(e)}) if as_json else f"lsn={record.lsn} ERROR: {e}"
        else:
            line = json.dumps(entry_to_json(entry)) if as_json else summarize_entry(entry)
        out.write(line + "\n")
    if not as_json:
        span = f" (lsn {first}..{last})" if count else ""
        out.write(f"-- {count} entries{span}, {errors} error{'' if errors == 1 else 's'}\n")
    return errors


def recovery_notes(driver: LogDriver) -> list[str]:
    """What opening the log found: truncation point and damage the recovery mode
    skipped or cut at (the file backend's ``recovery`` report, when there is one)."""
    notes = []
    if driver.truncated():
        notes.append(f"truncated up to lsn {driver.truncated()}")
    report = getattr(driver, "recovery", None)
    for damage in getattr(report, "skipped", ()):
        notes.append(f"recovery skipped damage: {damage}")
    cut = getattr(report, "cut", None)
    if cut is not None:
        notes.append(f"recovery ends the log at damage: {cut}")
    for path in getattr(report, "dropped", ()):
        notes.append(f"recovery ignores segment after the cut: {path}")
    return notes


def run(args: Namespace, cfg: object) -> int:
    """`kwal wal dump PATH [--json] [--recovery-mode M]`: 0 if every entry decoded,
    1 if some did not (or reading stopped early), 2 if the WAL could not be opened.

    The log is opened read-only; what recovery found (truncation point, damage
    skipped or cut at) goes to stderr so stdout stays one line per entry."""
    if not Path(args.path).is_dir():
        print(f"kwal wal dump: no WAL directory at {args.path}", file=sys.stderr)
        return 2
    from tn.logstore.file_backend import FileDriver

    try:
        # read_only: recover in memory, never cut a torn tail of the log we inspect.
        driver: LogDriver = FileDriver(args.path, recovery_mode=args.recovery_mode, read_only=True)
    except (LogStoreError, OSError, ValueError) as e:
        print(f"kwal wal dump: cannot open the WAL at {args.path}: {e}", file=sys.stderr)
        return 2
    for note in recovery_notes(driver):
        print(f"kwal wal dump: {note}", file=sys.stderr)
    try:
        errors = dump_records(LogStore(driver).records(), args.json, sys.stdout)
    except (LogStoreError, OSError) as e:
        print(f"kwal wal dump: reading stopped: {e}", file=sys.stderr)
        return 1
    finally:
        driver.close()
    return 1 if errors else 0
