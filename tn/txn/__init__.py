"""Transactions (snapshot isolation), their workspace, and the hybrid logical clock."""

from tn.txn.clock import HybridClock
from tn.txn.transaction import Transaction

__all__ = ["HybridClock", "Transaction"]
