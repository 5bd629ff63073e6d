"""Fuzzing the decoders that read bytes someone else wrote (issue 31 item 4).

The request decoder reads what any authenticated service sends; the WAL decoder and
the logtail decoder read topics a broker, a disk or an operator could have damaged.
Each gets at least 1,000 examples (`EXAMPLES`): valid encodings with bytes flipped,
cut, inserted or spliced, and plain random bytes. A decoder must either return the
value it decodes or raise its codec's clear error (`CodecError`; for requests also
`RequestFormatError`, a batch that is not Arrow IPC), never anything else, and an
untouched encoding decodes to what was encoded.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.arrow_ipc import table_to_ipc
from schemas.codec import decode_entry, encode_entry
from schemas.exceptions import CodecError
from schemas.logtail import (
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    Checkpoint,
    Heartbeat,
    LogtailRecord,
    decode_logtail,
    encode_logtail,
)
from schemas.requests import (
    Column,
    OpKind,
    RequestFormatError,
    TxnOp,
    TxnRequest,
    decode_request,
    encode_request,
    peek_request_id,
)
from schemas.wal import (
    Append,
    AppendInfo,
    CatalogKind,
    ColumnDef,
    ColumnType,
    Delete,
    Dest,
    EntryNode,
    TableSchema,
    TxnContext,
    UpdateCatalog,
    WalEntry,
)
from tn.logstore.kafka_backend.headers import HeaderError, decode_entries, encode_entries

EXAMPLES = 1000
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", None]})
REQUESTS = [
    TxnRequest("r1", "alice", (TxnOp(OpKind.CREATE_DATABASE, "shop"),)),
    TxnRequest(
        "r2",
        "alice",
        (TxnOp(OpKind.CREATE_TABLE, "shop", "t", (Column("id", "int64"), Column("name", "string")), "id"),),
    ),
    TxnRequest("r3", "bob", (TxnOp(OpKind.INSERT, "shop", "t", rows=ROWS),), sent_at_ms=12345),
    TxnRequest("r4", "bob", (TxnOp(OpKind.DELETE, "shop", "t", keys=(1, 2)),)),
]
LOGTAILS = [
    LogtailRecord("shop", "t", 7, Changes(inserts=table_to_ipc(ROWS)), table_id=3, lsn=8),
    LogtailRecord("shop", "t", 8, Heartbeat(), table_id=3, lsn=9),
    LogtailRecord("shop", "t", 9, BlockMeta(5, "objects/5", 8, "objects/5.d", 1, 0)),
    LogtailRecord("shop", "t", 10, Checkpoint("ckpt/manifest-10")),
    LogtailRecord("shop", "", 11, Catalog(CatalogOp.CREATE_DATABASE, db_id=4)),
]


SCHEMA = TableSchema(
    (ColumnDef(1, "id", ColumnType.INT64, False), ColumnDef(2, "name", ColumnType.STRING)), "id"
)
BLOCK = Dest(1, 3, 4, 5)
# A WAL entry of each command kind (tests/schemas covers every field's range; here the
# point is damage, so a fixed set keeps the 1,000 examples cheap)
WAL_ENTRIES = [
    WalEntry(1, TxnContext(10, 11), (UpdateCatalog(CatalogKind.DATABASE, Dest(1), EntryNode(11, name="shop")),)),
    WalEntry(
        2,
        TxnContext(12, 13),
        (UpdateCatalog(CatalogKind.TABLE, Dest(1, 3), EntryNode(13, name="t", schema=SCHEMA)),),
    ),
    WalEntry(
        3, TxnContext(14, 15, (BLOCK,)), (Append((AppendInfo(0, 3, BLOCK, 0, 3),), table_to_ipc(ROWS)),)
    ),
    WalEntry(4, TxnContext(16, 17, (BLOCK,)), (Delete(BLOCK, (0, 2)),)),
]

WAL_PAYLOADS = [encode_entry(e) for e in WAL_ENTRIES]


@st.composite
def damaged(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` with one to four damages: a flipped byte, a cut, an insertion, a splice of
    random bytes over a range; or (one in ten) random bytes with the valid header."""
    if draw(st.integers(0, 9)) == 0:
        return valid[: draw(st.integers(0, 8))] + draw(st.binary(max_size=200))
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "splice"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            end = at + draw(st.integers(1, 16))
            data[at:end] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


def _check_request(data: bytes) -> None:
    try:
        req = decode_request(data)
    except (CodecError, RequestFormatError):
        return
    assert isinstance(req, TxnRequest)
    peek_request_id(data)  # what the TN reads from a body it could not decode: never raises


@FUZZ
@given(data=st.data())
def test_request_decoder_fuzzed(data: st.DataObject) -> None:
    valid = encode_request(data.draw(st.sampled_from(REQUESTS)))
    _check_request(data.draw(st.one_of(damaged(valid), st.binary(max_size=300))))


@FUZZ
@given(data=st.data())
def test_wal_decoder_fuzzed(data: st.DataObject) -> None:
    """A WAL record (a group's framed entries) and its entries, damaged anywhere."""
    payloads = data.draw(st.lists(st.sampled_from(WAL_PAYLOADS), min_size=1, max_size=3))
    value = data.draw(damaged(encode_entries(payloads)))
    try:
        got = decode_entries(value, len(payloads))
    except HeaderError:
        got = [data.draw(damaged(payloads[0]))]  # the framing held nothing: damage an entry
    for payload in got:
        try:
            entry = decode_entry(payload)
        except CodecError:
            continue
        assert isinstance(entry, WalEntry)


@FUZZ
@given(data=st.data())
def test_logtail_decoder_fuzzed(data: st.DataObject) -> None:
    valid = encode_logtail(data.draw(st.sampled_from(LOGTAILS)))
    try:
        record = decode_logtail(data.draw(st.one_of(damaged(valid), st.binary(max_size=300))))
    except CodecError:
        return
    assert isinstance(record, LogtailRecord)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.request_id)
def test_untouched_request_decodes_to_itself(req: TxnRequest) -> None:
    got = decode_request(encode_request(req))
    assert (got.request_id, got.client_id, got.sent_at_ms) == (req.request_id, req.client_id, req.sent_at_ms)
    assert [(o.kind, o.database, o.table, o.columns, o.keys) for o in got.ops] == [
        (o.kind, o.database, o.table, o.columns, o.keys) for o in req.ops
    ]


@pytest.mark.parametrize("entry", WAL_ENTRIES, ids=lambda e: f"lsn{e.lsn}")
def test_untouched_wal_entry_decodes_to_itself(entry: WalEntry) -> None:
    assert decode_entries(encode_entries([encode_entry(entry)]), 1) == [encode_entry(entry)]
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize("record", LOGTAILS, ids=lambda r: type(r.body).__name__)
def test_untouched_logtail_decodes_to_itself(record: LogtailRecord) -> None:
    assert decode_logtail(encode_logtail(record)) == record
