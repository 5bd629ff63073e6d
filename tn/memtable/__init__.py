"""In-memory blocks (columnar, at most 8192 rows: `block.py`), per-table data with the
primary-key index (`table.py`), flushed rows read back from their objects (`flushed.py`)
and the per-object key filters (`pk_filter.py`)."""
