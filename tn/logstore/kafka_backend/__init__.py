"""The Kafka log backend: Kafka as the Log Service (DESIGN.md "The log store", seed 004).

Modules, in protocol order:

- `headers`   -- the record header names and the entry framing of a record's value;
- `meta`      -- the compacted meta topic: writer epochs (claim, base) and the
                 durable truncation point;
- `replay`    -- rebuilding the (partition, offset) <-> LSN map and the valid,
                 contiguous entries from what the WAL topic holds;
- `window`    -- the logical-LSN window and in-order completion of futures;
- `writer`    -- group commit into Kafka records, several in flight;
- `retention` -- the retention guard and the safe-retention computation;
- `driver`    -- `KafkaDriver`, which ties them together.
"""

from tn.logstore.kafka_backend.driver import KafkaDriver
from tn.logstore.kafka_backend.exceptions import (
    AcknowledgedEntryLostError,
    AppendFailedError,
    AppendTimeoutError,
    FencedError,
    KafkaLogError,
    RetentionUnsafeError,
    WindowTimeoutError,
)

__all__ = [
    "AcknowledgedEntryLostError",
    "AppendFailedError",
    "AppendTimeoutError",
    "FencedError",
    "KafkaDriver",
    "KafkaLogError",
    "RetentionUnsafeError",
    "WindowTimeoutError",
]
