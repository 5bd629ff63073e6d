"""The standard change stream per table (docs/change-stream.md)."""
