"""consumers.cdc.events: one transaction's logtail changes on a table as per-key events."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from consumers.cdc.events import events_of
from schemas.arrow_ipc import table_to_ipc
from schemas.logtail import COMMIT_TS, ROW_ID, Changes


def _changes(inserts: list[tuple[int, dict[str, Any]]], deletes: list[tuple[int, int]]) -> Changes:
    ins = dels = None
    if inserts:
        ins = table_to_ipc(pa.table({
            ROW_ID: pa.array([r for r, _ in inserts], pa.int64()),
            COMMIT_TS: pa.array([9] * len(inserts), pa.int64()),
            "id": pa.array([row["id"] for _, row in inserts], pa.int64()),
            "v": pa.array([row["v"] for _, row in inserts], pa.string()),
        }))
    if deletes:
        dels = table_to_ipc(pa.table({
            ROW_ID: pa.array([r for r, _ in deletes], pa.int64()),
            COMMIT_TS: pa.array([9] * len(deletes), pa.int64()),
            "id": pa.array([k for _, k in deletes], pa.int64()),
        }))
    return Changes(ins, dels)


def test_update_delete_insert_and_a_row_inserted_then_deleted() -> None:
    rows = {1: {"id": 1, "v": "a"}, 2: {"id": 2, "v": "b"}}
    changes = _changes(
        inserts=[(10, {"id": 1, "v": "a2"}), (11, {"id": 3, "v": "c"}), (12, {"id": 4, "v": "gone"})],
        deletes=[(100, 1), (101, 2), (12, 4)],  # 12: inserted and deleted by this transaction
    )
    events = events_of(changes, "id", rows)
    assert [(e.op, e.key, e.before, e.after) for e in events] == [
        ("u", 1, {"id": 1, "v": "a"}, {"id": 1, "v": "a2"}),
        ("c", 3, None, {"id": 3, "v": "c"}),
        ("d", 2, {"id": 2, "v": "b"}, None),
    ]
    assert rows == {1: {"id": 1, "v": "a2"}, 3: {"id": 3, "v": "c"}}
