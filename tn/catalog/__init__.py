"""The catalog tree (database -> table -> segment -> block) with create@/delete@ MVCC:
`catalog.py` (the tree and its lookups), `nodes.py` (the nodes, and the interfaces of the
memtable they name)."""
