"""Per-object primary-key summaries: a zone map (min/max key) and a bloom filter.

The checkpoint writes one next to each flushed block's object (`<object>.pk`); the TN
checks keys against flushed blocks through them and reads an object's key column only
when the filter says "maybe" (a false positive costs one read, never a wrong answer).

Hashes are stable across processes (they are stored): integers through splitmix64,
other keys through blake2b of their repr. Every filter of a table has the same size
(`bits` for a full block), so the table stacks them bit-sliced (`tn.memtable.flushed`):
one row of block bits per filter bit.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HASHES = 4  # bit positions per key
FORMAT = 1

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def filter_bits(rows: int, bits_per_key: int) -> int:
    """The filter size for a block of `rows` rows: at least 1 bit (a 1-bit filter says
    "maybe" to every key: every lookup reads the key column)."""
    return max(1, rows * bits_per_key)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def key_hashes(keys: Sequence[Any] | np.ndarray) -> np.ndarray:
    """A stable 64-bit hash per key (uint64)."""
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64:  # a columnar batch's keys
        return _splitmix(keys.view(np.uint64))
    if keys and all(type(k) is int for k in keys):
        try:
            raw = np.array(keys, dtype=np.int64).view(np.uint64)
        except OverflowError:
            raw = None
        if raw is not None:
            return _splitmix(raw)
    out = np.empty(len(keys), dtype=np.uint64)
    for i, k in enumerate(keys):
        if type(k) is int and -(1 << 63) <= k < (1 << 63):
            out[i] = np.int64(k).view(np.uint64)
            out[i] = _splitmix(out[i : i + 1])[0]
        else:
            b = k if isinstance(k, bytes) else repr(k).encode()
            out[i] = int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")
    return out


def positions(hashes: np.ndarray, m: int) -> np.ndarray:
    """[len(hashes), HASHES] bit positions in a filter of m bits (double hashing)."""
    h2 = _splitmix(hashes ^ np.uint64(0x5851F42D4C957F2D)) | np.uint64(1)
    i = np.arange(HASHES, dtype=np.uint64)
    with np.errstate(over="ignore"):
        pos = (hashes[:, None] + i[None, :] * h2[:, None]) % np.uint64(m)
    return pos.astype(np.int64)


@dataclass
class KeyFilter:
    """One flushed block's key summary."""

    m: int  # filter bits
    lo: Any  # smallest key (None: no rows)
    hi: Any
    bits: np.ndarray  # bool[m]

    @classmethod
    def build(cls, keys: Sequence[Any], m: int) -> KeyFilter:
        present = [k for k in keys if k is not None]
        bits = np.zeros(m, dtype=bool)
        if present:
            bits[positions(key_hashes(present), m).ravel()] = True
            return cls(m, min(present), max(present), bits)
        return cls(m, None, None, bits)

    def may_hold(self, key: Any) -> bool:
        """The zone map's answer (None bounds: no zone map, so "maybe")."""
        if self.lo is None or self.hi is None:
            return True
        try:
            return bool(self.lo <= key <= self.hi)
        except TypeError:
            return True

    def encode(self) -> bytes:
        head = json.dumps(
            {"format": FORMAT, "m": self.m, "lo": _plain(self.lo), "hi": _plain(self.hi)}
        )
        buf = io.BytesIO()
        np.save(buf, np.packbits(self.bits), allow_pickle=False)
        return head.encode() + b"\n" + buf.getvalue()

    @classmethod
    def decode(cls, data: bytes) -> KeyFilter:
        head, _, body = data.partition(b"\n")
        h = json.loads(head)
        if h.get("format") != FORMAT:
            raise ValueError(f"key filter format {h.get('format')!r} is not {FORMAT}")
        m = int(h["m"])
        packed = np.load(io.BytesIO(body), allow_pickle=False)
        return cls(m, h["lo"], h["hi"], np.unpackbits(packed, count=m).astype(bool))


def _plain(v: Any) -> Any:
    """A zone-map bound as JSON can hold it (None: kept out of the zone map)."""
    return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
