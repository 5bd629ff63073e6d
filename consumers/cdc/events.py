"""One table's changes in one transaction as Debezium-style events (consumers.cdc).

The logtail says what happened physically: rows appended (with row ids) and row ids
deleted (with their primary keys). A change event says it per key, with the row before
and after. `events_of` turns one `Changes` record into events, against `rows`, the table's
current rows by primary key (which it updates):

1. deletes first (kwal's update is a delete, then an insert, of the same key): each
   deleted key's row leaves `rows` and is held as a `before`; a deleted row id that this
   same transaction appended (inserted, then deleted again) cancels that insert;
2. each appended row: `u` with the held `before` when its key was deleted in step 1,
   else `c`; it becomes the key's row;
3. each key deleted and not inserted again: `d`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.arrow_ipc import ipc_to_table
from schemas.change_stream import CREATE, DELETE, UPDATE
from schemas.logtail import COMMIT_TS, ROW_ID, Changes

Row = dict[str, Any]


@dataclass(frozen=True)
class Event:
    op: str
    key: Any
    before: Row | None
    after: Row | None


def events_of(changes: Changes, primary_key: str, rows: dict[Any, Row]) -> list[Event]:
    """The events of one transaction on one table (steps 1-3 of the module docstring)."""
    appended: list[tuple[int, Row]] = []
    if changes.inserts is not None:
        batch = ipc_to_table(changes.inserts)
        ids = batch.column(ROW_ID).to_pylist()
        values = batch.drop_columns([ROW_ID, COMMIT_TS]).to_pylist()
        appended = list(zip(ids, values, strict=True))
    appended_ids = {row_id for row_id, _ in appended}
    cancelled: set[int] = set()
    removed: dict[Any, Row | None] = {}
    if changes.deletes is not None:
        dels = ipc_to_table(changes.deletes)
        keys = dels.column(primary_key).to_pylist()
        for row_id, key in zip(dels.column(ROW_ID).to_pylist(), keys, strict=True):
            if row_id in appended_ids:
                cancelled.add(row_id)
                continue
            removed[key] = rows.pop(key, None)
    events: list[Event] = []
    for row_id, row in appended:
        if row_id in cancelled:
            continue
        key = row[primary_key]
        if key in removed:
            events.append(Event(UPDATE, key, removed.pop(key), row))
        else:
            events.append(Event(CREATE, key, None, row))
        rows[key] = row
    events.extend(Event(DELETE, key, before, None) for key, before in removed.items())
    return events
