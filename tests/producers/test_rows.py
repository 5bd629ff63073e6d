"""`producers.rows.to_arrow`: the table pyarrow's own conversion makes, byte for byte,
whichever path a column takes (built from buffers, or handed to pyarrow)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.rows import to_arrow
from schemas.arrow_ipc import table_to_ipc


def _pyarrows(rows: list[Any], columns: list[str] | None = None) -> pa.Table:
    """What `to_arrow` made before it built columns itself."""
    if isinstance(rows[0], dict):
        return pa.Table.from_pylist([dict(r) for r in rows])
    assert columns is not None
    data: dict[str, list[Any]] = {c: [] for c in columns}
    for r in rows:
        for c, v in zip(columns, r, strict=True):
            data[c].append(v)
    return pa.table(data)


def _same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema, check_metadata=True)
    assert table_to_ipc(got) == table_to_ipc(want)  # the bytes a request carries


VALUES = st.one_of(
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.none(),
    st.booleans(),
    st.binary(max_size=8),
)
COLUMN = st.one_of(  # one type throughout (the built path), or anything (pyarrow's)
    st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=True), min_size=1, max_size=4),
    st.lists(st.text(max_size=20), min_size=1, max_size=4),
    st.lists(st.one_of(st.integers(-5, 5), st.none()), min_size=1, max_size=4),
    st.lists(VALUES, min_size=1, max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(COLUMN, min_size=1, max_size=3))
def test_dict_and_list_rows_make_pyarrows_table_or_its_error(cols: list[list[Any]]) -> None:
    n = min(len(c) for c in cols)
    names = [f"c{i}" for i in range(len(cols))]
    dicts = [{name: c[i] for name, c in zip(names, cols, strict=True)} for i in range(n)]
    lists = [tuple(c[i] for c in cols) for i in range(n)]
    for call, want in (
        (lambda: to_arrow(dicts), lambda: _pyarrows(dicts)),
        (lambda: to_arrow(lists, columns=names), lambda: _pyarrows(lists, names)),
    ):
        try:
            expected = want()
        except Exception as e:  # pyarrow refuses the mix: to_arrow must say the same
            with pytest.raises(type(e), match=None) as info:
                call()
            assert str(info.value) == str(e)
            continue
        _same(call(), expected)


@pytest.mark.parametrize(
    "rows",
    [
        [{"id": 1 << 63}],  # beyond int64: pyarrow's OverflowError
        [{"id": "a\ud800"}],  # a lone surrogate: pyarrow's UnicodeEncodeError
        [{"id": 1}, {"id": "x"}],  # mixed: ArrowInvalid
    ],
)
def test_values_pyarrow_refuses_raise_its_error(rows: list[dict[str, Any]]) -> None:
    def error(call: Callable[[], object]) -> tuple[type, str]:
        with pytest.raises(Exception) as info:
            call()
        return info.type, str(info.value)

    assert error(lambda: to_arrow(rows)) == error(lambda: _pyarrows(rows))


def test_a_later_rows_missing_key_is_null_and_its_extra_key_ignored() -> None:
    rows: list[dict[str, Any]] = [{"id": 1, "v": "a"}, {"id": 2, "w": 5}]
    got = to_arrow(rows)
    assert got.to_pylist() == [{"id": 1, "v": "a"}, {"id": 2, "v": None}]
    _same(got, _pyarrows(rows))
