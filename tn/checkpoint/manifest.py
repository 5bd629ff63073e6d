"""The checkpoint manifest and the catalog snapshot it points to.

Object keys (under the store's prefix):

    checkpoints/catalog/<ts:020d>.json    the catalog as of ts (every committed node,
                                          its create@/delete@ <= ts, schemas, block
                                          locations)
    checkpoints/manifests/<ts:020d>.json  the manifest: ts, the WAL LSN it covers, the
                                          catalog object, the objects written, logtail
                                          offsets. Written LAST: a manifest exists only
                                          for a complete checkpoint.
    data/<table id>/<block id>-<ts>.parquet, ...-<ts>.delta.parquet

JSON with a `version` field (not the Avro envelope: the catalog snapshot is a deep,
mostly-optional tree; JSON keeps it readable for operators).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.objectstore import ObjectStore
from schemas.logtail import BlockMeta
from schemas.wal import TableSchema, columns_in, columns_out

VERSION = 1  # of the manifest
# of the catalog snapshot; 2 added BlockEntry.pk_loc (version 1 catalogs still load)
CATALOG_VERSION = 2
MANIFESTS = "checkpoints/manifests/"
CATALOGS = "checkpoints/catalog/"


def manifest_key(ts: int) -> str:
    return f"{MANIFESTS}{ts:020d}.json"


def catalog_key(ts: int) -> str:
    return f"{CATALOGS}{ts:020d}.json"


@dataclass
class BlockEntry:
    id: int
    segment_id: int
    table_id: int
    create_ts: int
    delete_ts: int  # 0: alive at ts
    meta_loc: str
    delta_loc: str
    data_ts: int  # meta_loc holds the rows with commit ts <= data_ts
    rows: int  # row count (offsets) the object covers
    complete: bool  # meta_loc holds every row the block will ever have
    # the key filter of meta_loc (tn.memtable.pk_filter); "" in checkpoints before
    # version 2, or for a block without one (rebuilt from the key column when needed)
    pk_loc: str = ""

    def block_meta(self) -> BlockMeta:
        """The block as the logtail announces it to CNs: rows with commit ts below
        data_ts + 1 are in meta_loc."""
        return BlockMeta(
            self.id, self.meta_loc, self.data_ts + 1, self.delta_loc, self.create_ts, self.delete_ts
        )


@dataclass
class CatalogSnapshot:
    ts: int
    max_id: int
    databases: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[BlockEntry] = field(default_factory=list)

    def tables_alive(self, names: Collection[str]) -> dict[str, dict[str, Any]]:
        """db.table -> its table entry, for those of `names` alive at the snapshot's ts (a
        table dropped at or before it cannot be read at or after it)."""
        databases = {d["id"]: d["name"] for d in self.databases}
        out: dict[str, dict[str, Any]] = {}
        for t in self.tables:
            key = f"{databases[t['db_id']]}.{t['name']}"
            if key in names and not t["delete_ts"]:
                out[key] = t
        return out

    def encode(self) -> bytes:
        d = asdict(self)
        d["version"] = CATALOG_VERSION
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> CatalogSnapshot:
        d = json.loads(data)
        d.pop("version", None)
        d["blocks"] = [BlockEntry(**b) for b in d["blocks"]]
        return cls(**d)


@dataclass
class Manifest:
    ts: int  # t1: everything committed at or below it is in the checkpoint
    lsn: int  # the WAL LSN of the last transaction with commit ts <= ts
    prev_ts: int  # t0 (0 for the first checkpoint)
    catalog: str  # key of the CatalogSnapshot
    objects: dict[str, int] = field(default_factory=dict)  # every live object -> bytes
    written: list[str] = field(default_factory=list)  # objects written by this checkpoint
    logtail_offsets: dict[str, int] = field(default_factory=dict)
    created_at: float = 0.0
    wal: str = ""  # the identity of the log it covers (LogDriver.identity); "" = unknown

    @property
    def key(self) -> str:
        return manifest_key(self.ts)

    @property
    def object_bytes(self) -> int:
        return sum(self.objects.values())

    def encode(self) -> bytes:
        d = asdict(self)
        d["version"] = VERSION
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        d = json.loads(data)
        d.pop("version", None)
        return cls(**d)


def schema_out(s: TableSchema) -> dict[str, Any]:
    return {
        "columns": columns_out(s.columns),
        "primary_key": s.primary_key,
        "version": s.version,
    }


def schema_in(d: dict[str, Any]) -> TableSchema:
    return TableSchema(columns_in(d["columns"]), d["primary_key"], int(d["version"]))


def list_manifests(store: ObjectStore) -> list[Manifest]:
    """Every complete checkpoint, oldest first."""
    out = []
    for key in store.list(MANIFESTS):
        if key.endswith(".json"):
            out.append(Manifest.decode(store.get(key)))
    out.sort(key=lambda m: m.ts)
    return out


def newest_manifest(store: ObjectStore) -> Manifest | None:
    keys = sorted(k for k in store.list(MANIFESTS) if k.endswith(".json"))
    return Manifest.decode(store.get(keys[-1])) if keys else None
