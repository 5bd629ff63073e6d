"""The TN process: consume TxnRequests, run them through the engine, publish TxnResults."""

from tn.service.service import TnService

__all__ = ["TnService"]
