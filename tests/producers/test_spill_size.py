"""`producers.spill.check_size`: the cheap upper bound it uses below the limits never
falls short of the exact Arrow bytes (`rows_bytes`), whatever the table's layout (columns
sharing a buffer, overlapping chunks, slices, dictionaries, nested and string columns),
so a transaction spills or is refused exactly when the exact figure says so."""

from __future__ import annotations

import pyarrow as pa
import pytest

from infra.config import ClientConfig
from producers.exceptions import ValidationError
from producers.spill import check_size, rows_bytes, rows_bytes_bound
from schemas.requests import OpKind, TxnOp

_INTS = pa.array(list(range(1000)), pa.int64())
_STRS = pa.array(["x" * 1000] * 10)

LAYOUTS = {
    "one_row": pa.table({"id": [1], "v": [2]}),
    "shared_column": pa.table({"a": _INTS, "b": _INTS}),
    "overlapping_chunks": pa.table(
        {"x": pa.chunked_array([_INTS.slice(0, 900), _INTS.slice(100, 900), _INTS])}
    ),
    "slice_of_strings": pa.table({"s": _STRS.slice(2, 3)}),
    "same_strings_twice": pa.table({"s": _STRS, "t": _STRS}),
    "dictionary": pa.table({"d": pa.array(["a", "b"] * 50).dictionary_encode()}),
    "nested": pa.table({"l": pa.array([[1, 2], [3], None] * 20), "st": pa.array([{"k": 1}] * 60)}),
    "sliced_table": pa.table({"a": _INTS, "s": pa.array([str(i) for i in range(1000)])}).slice(10, 5),
}


def _ops(table: pa.Table) -> list[TxnOp]:
    return [TxnOp(OpKind.INSERT, "db", "t", rows=table), TxnOp(OpKind.DELETE, "db", "t", keys=(1, 2))]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_bound_is_never_below_the_exact_bytes(name: str) -> None:
    ops = _ops(LAYOUTS[name])
    assert rows_bytes_bound(ops) >= rows_bytes(ops)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_above_a_limit_the_exact_bytes_decide(name: str) -> None:
    """Limits just below the exact figure: check_size returns it (so the caller spills)
    or refuses naming it; at the exact figure nothing is refused."""
    ops = _ops(LAYOUTS[name])
    exact = rows_bytes(ops)
    spill_only = ClientConfig(spill_bytes=exact - 1, max_txn_bytes=exact)
    assert check_size(ops, spill_only, "r1") == exact
    refused = ClientConfig(spill_bytes=exact - 1, max_txn_bytes=exact - 1)
    with pytest.raises(ValidationError, match=rf"holds {exact} bytes of rows, above client\.max_txn_bytes={exact - 1}"):
        check_size(ops, refused, "r1")


def test_below_both_limits_nothing_is_spilled_or_refused() -> None:
    ops = _ops(LAYOUTS["one_row"])
    size = check_size(ops, ClientConfig(), "r1")
    assert rows_bytes(ops) <= size <= ClientConfig().spill_bytes
