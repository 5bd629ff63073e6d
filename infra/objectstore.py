"""Object storage: one small interface, an S3 implementation and a local folder.

Keys are `/`-separated relative paths. `put` is atomic for readers: an object
is either absent or complete (S3 gives that; the folder store writes a temp
file, fsyncs it and renames it).
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from infra.config import ObjectStoreConfig


class ObjectStoreError(RuntimeError):
    """The object store could not be reached or refused the request."""


class ObjectNotFoundError(ObjectStoreError, KeyError):
    """The key does not exist."""


class ObjectStore(ABC):
    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete `key`; deleting a missing key is not an error."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        return len(self.get(key))


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise ValueError(f"invalid object key {key!r}: must be a relative path without '..'")
    return key


class FolderStore(ObjectStore):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from e

    def list(self, prefix: str = "") -> list[str]:
        out = []
        for p in self.root.rglob("*"):
            if p.is_file() and not p.name.startswith(".tmp-"):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", cfg: ObjectStoreConfig | None = None) -> None:
        import boto3
        from botocore.config import Config

        cfg = cfg or ObjectStoreConfig()
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        kwargs: dict[str, Any] = {
            "region_name": cfg.region,
            "config": Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}),
        }
        if cfg.endpoint_url:
            kwargs["endpoint_url"] = cfg.endpoint_url
        if cfg.access_key_id:
            kwargs["aws_access_key_id"] = cfg.access_key_id
            kwargs["aws_secret_access_key"] = cfg.secret_access_key
        self._s3 = boto3.client("s3", **kwargs)

    def ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call(self._s3.create_bucket, Bucket=self.bucket)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFoundError(f"no object {kwargs.get('Key')!r} in {self.url}") from e
            raise ObjectStoreError(f"S3 {fn.__name__} on {self.url} failed: {e}") from e
        except BotoCoreError as e:
            raise ObjectStoreError(f"S3 {fn.__name__} on {self.url} failed: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        self._call(self._s3.put_object, Bucket=self.bucket, Key=self.prefix + _check_key(key), Body=data)

    def get(self, key: str) -> bytes:
        resp = self._call(self._s3.get_object, Bucket=self.bucket, Key=self.prefix + _check_key(key))
        return bytes(resp["Body"].read())

    def list(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call(self._s3.list_objects_v2, **kwargs)
            out.extend(o["Key"][len(self.prefix) :] for o in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return sorted(out)
            token = resp["NextContinuationToken"]

    def delete(self, key: str) -> None:
        self._call(self._s3.delete_object, Bucket=self.bucket, Key=self.prefix + _check_key(key))

    def exists(self, key: str) -> bool:
        try:
            self._call(self._s3.head_object, Bucket=self.bucket, Key=self.prefix + _check_key(key))
            return True
        except ObjectNotFoundError:
            return False

    def size(self, key: str) -> int:
        resp = self._call(self._s3.head_object, Bucket=self.bucket, Key=self.prefix + _check_key(key))
        return int(resp["ContentLength"])


def open_store(cfg: ObjectStoreConfig) -> ObjectStore:
    """The store a config names: `s3://bucket/prefix` or `file://path` (or a bare path)."""
    parsed = urlparse(cfg.url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"object store url {cfg.url!r} names no bucket")
        store = S3Store(parsed.netloc, parsed.path, cfg)
        store.ensure_bucket()
        return store
    if parsed.scheme in ("file", ""):
        path = (parsed.netloc + parsed.path) if parsed.scheme == "file" else cfg.url
        return FolderStore(path)
    raise ValueError(f"object store url {cfg.url!r}: scheme must be s3:// or file://")
