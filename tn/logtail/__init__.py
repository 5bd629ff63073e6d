"""Logtail on the TN: collect each committed transaction's changes and push them per table."""
