"""Results per client per batch: what the publisher writes for a drain of its queue.

1. The publisher takes every result queued so far (one `drain`: under load, the results
   of one or more commit groups).
2. Results for requests whose client asked for batches (request header
   ``kwal-results: batch``, `schemas.requests.RESULTS_HEADER`) are grouped by client id,
   in queue order, up to `max_batch` per record: ONE `txn_result_batch` record each,
   keyed by the client id -- a client reads one record per group instead of one per
   commit, and the broker stores one.
3. Every other result (an older client's, one with no client id: an undecodable
   request's) is one `txn_result` record keyed as before, the request id (or the
   request record's key).

A record's delivery report answers every result in it: all were committed in the same
Kafka transaction, or none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schemas.requests import TxnResult, encode_result, encode_results

# (result, Kafka key, request offset) -- what the service queues for the publisher
Item = tuple[TxnResult, bytes | None, int]


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One results-topic record and the queue items it answers."""

    value: bytes
    key: bytes | None
    items: list[Item]


def pack(
    items: Iterable[Item], batched: Callable[[int], bool], max_batch: int = 512
) -> list[OutRecord]:
    """Steps 2-3: the records for `items`; `batched(offset)`: did the request at this
    offset ask for batches."""
    out: list[OutRecord] = []
    groups: dict[str, list[Item]] = {}
    for item in items:
        res, key, offset = item
        if res.client_id and batched(offset):
            group = groups.setdefault(res.client_id, [])
            group.append(item)
            if len(group) >= max_batch:
                out.append(_batch(res.client_id, groups.pop(res.client_id)))
        else:
            out.append(OutRecord(encode_result(res), key, [item]))
    out.extend(_batch(client, group) for client, group in groups.items())
    return out


def _batch(client_id: str, group: list[Item]) -> OutRecord:
    return OutRecord(encode_results([res for res, _, _ in group]), client_id.encode(), group)
