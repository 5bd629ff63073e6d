"""Avro schemas of the change stream (consumers.cdc, docs/change-stream.md, FORMAT.md).

The records follow Debezium's shapes, so that tools built for Debezium read them as they
are (Kafka Connect sinks, Flink's `debezium-avro-confluent` format, Spark `from_avro`):

- a table's key: a record holding its primary key column;
- a table's value, the envelope: `before` and `after` (the row, or null), `op` (`c` insert,
  `u` update, `d` delete), `source` (where and when: commit ts, LSN, transaction id),
  `ts_ms`, and `transaction` (id, the event's order in the transaction and in its table);
- the transaction metadata topic: a `BEGIN` and an `END` record per transaction, the END
  with the number of events per table.

The schemas are built from a table's `TableSchema` at the commit ts of each change: an ADD
COLUMN gives the next version of the table's value schema, registered in the schema
registry under the topic's `-value` subject. Every row field is optional (a union with
null, default null), so each version can read records of the one before (BACKWARD).
Records are encoded by confluent-kafka's AvroSerializer in the Confluent wire format
(byte 0, then the 4-byte big-endian schema id, then the Avro binary body).
"""

from __future__ import annotations

import json
import re
from typing import Any

from schemas.wal import ColumnType, TableSchema

CONNECTOR = "kwal"
VERSION = "1"

# op codes, as Debezium's
CREATE, UPDATE, DELETE = "c", "u", "d"

AVRO_TYPES: dict[ColumnType, Any] = {
    ColumnType.INT64: "long",
    ColumnType.FLOAT64: "double",
    ColumnType.STRING: "string",
    ColumnType.BOOL: "boolean",
    ColumnType.BINARY: "bytes",
    ColumnType.TIMESTAMP: {"type": "long", "logicalType": "timestamp-micros"},
}

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def avro_name(part: str) -> str:
    """`part` as an Avro name component: letters, digits, `_`; never starting with a digit."""
    name = _NOT_NAME.sub("_", part)
    return name if name and not name[0].isdigit() else f"_{name}"


def namespace(prefix: str, database: str, table: str) -> str:
    """Debezium's `<server>.<db>.<table>` namespace, each part an Avro name."""
    return ".".join(avro_name(p) for p in (*prefix.split("."), database, table))


def key_schema(prefix: str, database: str, table: str, schema: TableSchema) -> dict[str, Any]:
    """The key of a table's change records: its primary key column (never null)."""
    pk = schema.column(schema.primary_key)
    return {
        "type": "record",
        "name": "Key",
        "namespace": namespace(prefix, database, table),
        "fields": [{"name": pk.name, "type": AVRO_TYPES[pk.type]}],
    }


SOURCE = {
    "type": "record",
    "name": "Source",
    "namespace": "dev.kwal.connector",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "db", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "commit_ts", "type": "long"},
        {"name": "lsn", "type": "long"},
        {"name": "txId", "type": "string"},
    ],
}

TRANSACTION_BLOCK = {
    "type": "record",
    "name": "ConnectDefault",
    "namespace": "io.debezium.connector.common",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
    ],
}


def value_schema(prefix: str, database: str, table: str, schema: TableSchema) -> dict[str, Any]:
    """The envelope of a table's change records for `schema` (one registered version)."""
    ns = namespace(prefix, database, table)
    row = {
        "type": "record",
        "name": "Value",
        "namespace": ns,
        "fields": [
            {"name": c.name, "type": ["null", AVRO_TYPES[c.type]], "default": None}
            for c in schema.columns
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": ns,
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
            {"name": "source", "type": SOURCE},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "transaction", "type": ["null", TRANSACTION_BLOCK], "default": None},
        ],
    }


def transaction_key_schema(prefix: str) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "TransactionMetadataKey",
        "namespace": ".".join(avro_name(p) for p in prefix.split(".")),
        "fields": [{"name": "id", "type": "string"}],
    }


def transaction_value_schema(prefix: str) -> dict[str, Any]:
    """Debezium's transaction metadata value: BEGIN (no counts) and END (counts)."""
    return {
        "type": "record",
        "name": "TransactionMetadataValue",
        "namespace": ".".join(avro_name(p) for p in prefix.split(".")),
        "fields": [
            {"name": "status", "type": "string"},
            {"name": "id", "type": "string"},
            {"name": "event_count", "type": ["null", "long"], "default": None},
            {
                "name": "data_collections",
                "type": [
                    "null",
                    {
                        "type": "array",
                        "items": {
                            "type": "record",
                            "name": "DataCollection",
                            "fields": [
                                {"name": "data_collection", "type": "string"},
                                {"name": "event_count", "type": "long"},
                            ],
                        },
                    },
                ],
                "default": None,
            },
            {"name": "ts_ms", "type": "long"},
            # beyond Debezium's fields: the exact commit ts (where a follower resumes)
            {"name": "commit_ts", "type": "long"},
        ],
    }


def schema_str(schema: dict[str, Any]) -> str:
    """The JSON text registered (stable: sorted keys are not used, Avro keeps field order)."""
    return json.dumps(schema, separators=(",", ":"))
