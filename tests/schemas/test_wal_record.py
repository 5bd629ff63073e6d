"""WAL record values (`schemas.wal_record`): version 2 (one columnar payload per record)
round-trips to the entries version 1 carries; unknown versions and garbled values are
refused with the version and the record named."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.arrow_ipc import ipc_to_table, table_to_ipc
from schemas.codec import decode_entry, encode_entry
from schemas.exceptions import CodecError, DecodeError, UnsupportedFormatError
from schemas.wal import Append, AppendInfo, Delete, Dest, TxnContext, WalEntry
from schemas.wal_record import (
    A_LSN,
    RECORD_V1,
    RECORD_V2,
    RECORD_V3,
    decode_group,
    decode_v1,
    decode_v2,
    decode_v3,
    encode_v1,
    encode_v2,
    encode_v3,
)
from tests.schemas.strategies import wal_entries
from tn.logstore.kafka_backend.headers import RecordHeader, decode_value, encode_value

FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _meaning(entry: WalEntry) -> tuple[Any, ...]:
    """What an entry says, with each Append's rows read out of its batch by its infos
    (version 2 entries share their record's batch, so the bytes differ)."""
    commands: list[Any] = []
    for cmd in entry.commands:
        if isinstance(cmd, Append):
            batch = ipc_to_table(cmd.batch)
            commands.append(
                tuple(
                    (
                        i.src_length,
                        i.dest,
                        i.dest_offset,
                        i.dest_length,
                        batch.slice(i.src_offset, i.src_length).to_pylist(),
                    )
                    for i in cmd.infos
                )
            )
        else:
            commands.append(cmd)
    return entry.lsn, entry.txn, tuple(commands)


def _numbered(entries: list[WalEntry], first: int) -> list[WalEntry]:
    return [WalEntry(first + i, e.txn, e.commands) for i, e in enumerate(entries)]


@FEW
@given(st.lists(wal_entries, min_size=1, max_size=6), st.integers(1, 2**40))
def test_version_2_round_trips_what_version_1_carries(entries: list[WalEntry], first: int) -> None:
    entries = _numbered(entries, first)
    v1 = [
        decode_entry(p)
        for p in decode_v1(encode_v1([encode_entry(e) for e in entries]), len(entries))
    ]
    v2 = decode_v2(encode_v2(entries), first, len(entries))
    assert [_meaning(e) for e in v2] == [_meaning(e) for e in v1] == [_meaning(e) for e in entries]
    v3 = decode_v3(encode_v3(entries), first, len(entries))
    assert [_meaning(e) for e in v3] == [_meaning(e) for e in entries]


def test_version_3_carries_one_block_appends_as_columns() -> None:
    """Entries of one Append into one block become rows of the int64 ``appends`` columns;
    the others (here: an Append with a Delete) stay Avro records; both decode to the
    entries written, in LSN order."""
    a = [pa.table({"id": pa.array([i, -i], pa.int64()), "v": ["x", None]}) for i in range(6)]
    entries = [_entry(i + 1, 2 * i, a[i], 7, delete=i in (0, 3)) for i in range(6)]
    group = decode_group(encode_v3(entries), RECORD_V3, 1, 6, "wal/0@1")
    assert group.appends[A_LSN] == [2, 3, 5, 6]
    assert [e.lsn for e in group.others] == [1, 4]
    assert [_meaning(e) for e in group.entries()] == [_meaning(e) for e in entries]
    # a version 2 group: every entry is an Avro record
    v2 = decode_group(encode_v2(entries), RECORD_V2, 1, 6, "wal/0@1")
    assert v2.appends == [] and len(v2.others) == 6


def _entry(lsn: int, key: int, table: pa.Table, block: int, delete: bool = True) -> WalEntry:
    dest = Dest(1, 2, 3, block)
    n = table.num_rows
    append = Append((AppendInfo(0, n, dest, key, n),), table_to_ipc(table))
    commands = (append, Delete(dest, (key,))) if delete else (append,)
    return WalEntry(lsn, TxnContext(lsn * 10, lsn * 10 + 1, (dest,)), commands)


def test_one_batch_per_schema_shared_by_the_entries() -> None:
    a = [pa.table({"id": pa.array([i, -i], pa.int64()), "v": ["x", None]}) for i in range(5)]
    b = [pa.table({"k": ["s"], "f": pa.array([float(i)])}) for i in range(3)]
    entries = [_entry(i + 1, i, a[i], 7) for i in range(5)]
    entries += [_entry(i + 6, i, b[i], 8) for i in range(3)]
    value = encode_v2(entries)
    back = decode_v2(value, 1, 8)
    batches = {id(cmd.batch) for e in back for cmd in e.commands if isinstance(cmd, Append)}
    assert len(batches) == 2  # one columnar payload per schema, shared by its entries
    for e in back:
        append = e.commands[0]
        assert isinstance(append, Append)
        assert ipc_to_table(append.batch).to_batches().__len__() == 1
    assert [_meaning(e) for e in back] == [_meaning(e) for e in entries]
    # smaller than version 1, which repeats the schema in every entry
    assert len(value) < len(encode_v1([encode_entry(e) for e in entries]))


def test_payloads_choose_the_version() -> None:
    entries = [_entry(i + 1, i, pa.table({"id": pa.array([i], pa.int64())}), 7) for i in range(3)]
    payloads = [encode_entry(e) for e in entries]
    value, version = encode_value(payloads, RECORD_V2, 1)
    assert version == RECORD_V2
    got = decode_value(RecordHeader(b"entries", 1, 1, 3, 0, "w", version), value, "t/0@5")
    assert [_meaning(decode_entry(p)) for p in got] == [_meaning(e) for e in entries]
    # opaque payloads, or version 1 asked for: the version 1 framing
    assert encode_value([b"a", b"bc"], RECORD_V2, 1) == (encode_v1([b"a", b"bc"]), RECORD_V1)
    value, version = encode_value(payloads, RECORD_V1, 1)
    assert version == RECORD_V1 and value == encode_v1(payloads)
    value, version = encode_value(payloads, RECORD_V3, 1)
    assert version == RECORD_V3
    got = decode_value(RecordHeader(b"entries", 1, 1, 3, 0, "w", version), value, "t/0@6")
    assert [_meaning(decode_entry(p)) for p in got] == [_meaning(e) for e in entries]


def test_unknown_version_is_refused_naming_it_and_the_record() -> None:
    header = RecordHeader(b"entries", 1, 1, 1, 0, "w", 9)
    with pytest.raises(UnsupportedFormatError, match=r"WAL record wal/2@17 has format version 9"):
        decode_value(header, b"anything", "wal/2@17")


def test_garbled_version_2_values_are_refused_naming_the_record() -> None:
    entries = [_entry(i + 1, i, pa.table({"id": pa.array([i], pa.int64())}), 7) for i in range(4)]
    value = encode_v2(entries)
    cases = {
        "truncated": value[: len(value) // 2],
        "trailing": value + b"\x00",
        "not kwal": b"\x00" * len(value),
    }
    for data in cases.values():
        with pytest.raises((DecodeError, UnsupportedFormatError), match=r"wal/0@9 \(version 2\)"):
            decode_v2(data, 1, 4, "wal/0@9")
    with pytest.raises(DecodeError, match=r"holds 4 entries, its header says 5"):
        decode_v2(value, 1, 5, "wal/0@9")
    with pytest.raises(DecodeError, match=r"entry 0 carries LSN 1, expected 2"):
        decode_v2(value, 2, 4, "wal/0@9")


def test_garbled_version_3_values_are_refused_naming_the_record() -> None:
    tables = [pa.table({"id": pa.array([i], pa.int64())}) for i in range(4)]
    entries = [_entry(i + 1, i, tables[i], 7, delete=i == 1) for i in range(4)]
    value = encode_v3(entries)
    for data in (value[: len(value) // 2], value + b"\x00"):
        with pytest.raises((DecodeError, UnsupportedFormatError), match=r"wal/0@9 \(version 3\)"):
            decode_v3(data, 1, 4, "wal/0@9")
    with pytest.raises(DecodeError, match=r"holds 4 entries, its header says 5"):
        decode_v3(value, 1, 5, "wal/0@9")
    with pytest.raises(DecodeError, match=r"wal/0@9 \(version 3\).*out of order or outside"):
        decode_v3(value, 2, 4, "wal/0@9")


DAMAGE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@DAMAGE
@given(data=st.data())
def test_damaged_version_2_and_3_values_decode_or_raise_codec_errors(data: st.DataObject) -> None:
    """Bytes flipped, cut or inserted anywhere: the decoder returns entries or raises its
    codec's clear error (`CodecError`), never anything else."""
    tables = [
        pa.table({"id": pa.array([i, i + 1], pa.int64()), "v": ["a", None]}) for i in range(3)
    ]
    v3 = data.draw(st.booleans())
    entries = [_entry(i + 1, 2 * i, tables[i], 7, delete=not v3 or i == 1) for i in range(3)]
    value = bytearray((encode_v3 if v3 else encode_v2)(entries))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(value) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            value[at] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del value[at:]
        else:
            value[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        if not value:
            break
    try:
        back = (decode_v3 if v3 else decode_v2)(bytes(value), 1, 3, "wal/0@1")
    except CodecError:
        return
    assert [e.lsn for e in back] == [1, 2, 3]
