from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ObjectStoreConfig
from infra.objectstore import FolderStore, ObjectNotFoundError, ObjectStore, S3Store, open_store


def _exercise(store: ObjectStore) -> None:
    store.put("ckpt/1/manifest.json", b"{}")
    store.put("ckpt/1/blk-7.parquet", b"x" * 100)
    store.put("other/a", b"a")
    assert store.get("ckpt/1/manifest.json") == b"{}"
    assert store.list("ckpt/") == ["ckpt/1/blk-7.parquet", "ckpt/1/manifest.json"]
    assert store.size("ckpt/1/blk-7.parquet") == 100
    assert store.exists("other/a")
    store.put("other/a", b"b")  # overwrite
    assert store.get("other/a") == b"b"
    store.delete("other/a")
    store.delete("other/a")  # idempotent
    assert not store.exists("other/a")
    with pytest.raises(ObjectNotFoundError, match="other/a"):
        store.get("other/a")
    with pytest.raises(ValueError, match="invalid object key"):
        store.put("../escape", b"")


def test_folder_store(tmp_path: Path) -> None:
    store = open_store(ObjectStoreConfig(url=f"file://{tmp_path}/objs"))
    assert isinstance(store, FolderStore)
    _exercise(store)


def test_s3_store(s3_store: S3Store) -> None:
    _exercise(s3_store)


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="scheme"):
        open_store(ObjectStoreConfig(url="gs://b/p"))
