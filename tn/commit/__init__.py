"""The commit pipeline: conflict check, CommitTS, WAL hand-off, in-order visibility."""

from tn.commit.pipeline import CommitListener, CommitPipeline

__all__ = ["CommitListener", "CommitPipeline"]
