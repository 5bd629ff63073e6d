"""Results that ride their commit's WAL record: one Kafka transaction per commit, not two.

Where the TN fences at the broker (`infra.kafka_txn`), the WAL record holding a commit
and the commit's results can be committed in the same Kafka transaction: a client
(read_committed) sees its result exactly when the commit is durable, and a replaced TN's
results are aborted with its WAL records. Numbered as it runs:

1. the service makes a `Riding` for an engine transaction (one request, or a group) and
   attaches its `build` to the transaction (`CommitPipeline.attach_companions`);
2. in the commit pipeline, once the CommitTS is drawn and the WAL entry built, `build`
   packs the results (`tn.service.result_batches`: one record per client that reads
   batches) and returns them as companion records; the WAL writer produces them in the
   same step as the record holding the entry (`TxnChannel.produce_all`), so in its
   transaction. Nothing is built for a transaction that fails its conflict check;
3. right before that transaction's commit is sent (from then on a reader may see the
   results, even before EndTxn returns), on the bus thread, `released(cts)` tells the
   service that results up to cts may be read: its request loop makes them visible in
   the engine before it begins any transaction for requests it polled afterwards (a
   client's next request sees its previous commit);
4. the records' delivery reports (after the commit) and the commit's future (after
   visibility) come in either order; once both are in, `settle` runs once: the service's
   bookkeeping for every result delivered (its offset, the dedup window), or, for a
   record without an offset (no proof it was written), the usual publisher. A commit
   that failed settles nothing here: the service answers it as before (a log failure
   leaves it to the next TN, whose answer matches what a committed record said).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from infra.kafka_txn import TxnRecord
from schemas.requests import TxnRequest, TxnResult
from tn.service.result_batches import Item, OutRecord, pack

# (records delivered with their offset, items that still need publishing)
Settle = Callable[[list[tuple[OutRecord, int]], list[Item]], None]


class Riding:
    """One commit's results as companions of its WAL record (see the module docstring)."""

    def __init__(
        self,
        requests: list[tuple[TxnRequest, int]],
        topic: str,
        batched: Callable[[int], bool],
        released: Callable[[int], None],
        settle: Settle,
    ) -> None:
        self._requests = requests
        self._topic = topic
        self._batched = batched
        self._released = released
        self._settle_fn = settle
        self._lock = threading.Lock()
        self.built = False  # step 2 ran: the records were handed to the log
        self._records: list[OutRecord] = []
        self._reported = 0
        self._delivered: list[tuple[OutRecord, int]] = []
        self._undelivered: list[Item] = []
        self._committed = False  # the commit's future completed with success
        self._settled = False

    def build(self, commit_ts: int) -> list[TxnRecord]:
        """Step 2 (under the pipeline lock)."""
        items: list[Item] = [
            (
                TxnResult.ok(req.request_id, commit_ts, client_id=req.client_id, request_offset=offset),
                req.request_id.encode(),
                offset,
            )
            for req, offset in self._requests
        ]
        self._records = pack(items, self._batched)
        released = functools.partial(self._released, commit_ts)
        out = [
            TxnRecord(
                self._topic,
                rec.value,
                rec.key,
                on_delivery=functools.partial(self._report, rec),
                before_commit=released,
            )
            for rec in self._records
        ]
        self.built = True
        return out

    def _report(self, rec: OutRecord, err: Any, msg: Any) -> None:
        """A record's delivery report (step 4; the WAL channel's poll)."""
        offset = None if err is not None else msg.offset()
        with self._lock:
            self._reported += 1
            if offset is None:
                self._undelivered.extend(rec.items)
            else:
                self._delivered.append((rec, offset))
        self._maybe_settle()

    def committed(self) -> bool:
        """The commit's future completed with success (step 4). True: the results ride
        here (the caller publishes nothing); False: nothing was built (the transaction
        was not logged with them), the caller publishes as usual."""
        if not self.built:
            return False
        with self._lock:
            self._committed = True
        self._maybe_settle()
        return True

    def _maybe_settle(self) -> None:
        with self._lock:
            if self._settled or not self._committed or self._reported < len(self._records):
                return
            self._settled = True
        self._settle_fn(self._delivered, self._undelivered)
