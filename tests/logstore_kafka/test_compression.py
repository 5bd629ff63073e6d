"""`wal.compression`: the name is checked where the TN's producer is configured.
(That compressed records replay beside uncompressed ones: test_record_versions.py.)"""

from __future__ import annotations

import pytest

from infra.config import KwalConfig
from tn.logstore.kafka_backend.driver import producer_conf


def test_the_compression_setting_reaches_the_producer_or_is_refused_by_name() -> None:
    cfg = KwalConfig()
    cfg.wal.compression = "lz4"
    assert producer_conf(cfg)["compression.type"] == "lz4"
    cfg.wal.compression = "brotli"
    with pytest.raises(ValueError, match=r"wal\.compression must be one of .*'brotli'"):
        producer_conf(cfg)
