"""`infra.kafka_io.RecordDeleter`: which offsets it asks DeleteRecords for, and retries.

The admin client is a stand-in: the embedded broker drops the connection on
DeleteRecords, and what is tested is the bookkeeping around the request (the
request itself is tested against a broker that has it, in tests/logstore_kafka
and tests/logtail)."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from infra.kafka_io import RecordDeleter


class StubAdmin:
    def __init__(self) -> None:
        self.asked: list[list[tuple[str, int, int]]] = []
        self.fail: set[str] = set()

    def delete_records(self, tps: list[TopicPartition], **_: object) -> dict[object, object]:
        self.asked.append([(tp.topic, tp.partition, tp.offset) for tp in tps])
        out: dict[object, object] = {}
        for tp in tps:
            f: Future[object] = Future()
            if tp.topic in self.fail:
                f.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
            else:
                f.set_result(None)
            out[tp] = f
        return out


def test_asks_only_for_what_moved_and_retries_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    admin = StubAdmin()
    admin.fail = {"b"}
    deleter = RecordDeleter(5.0, retried="at the next checkpoint")
    with caplog.at_level(logging.WARNING, logger="infra.kafka_io"):
        deleter.delete(admin, {("a", 0): 10, ("b", 0): 7})  # type: ignore[arg-type]
    assert admin.asked == [[("a", 0, 10), ("b", 0, 7)]]
    assert deleter.deleted_before == {("a", 0): 10}
    assert "DeleteRecords b/0 before 7 failed (retried at the next checkpoint)" in caplog.text

    admin.fail = set()
    deleter.delete(admin, {("a", 0): 10, ("b", 0): 7})  # a unchanged: only b again
    assert admin.asked[-1] == [("b", 0, 7)]
    deleter.delete(admin, {("a", 0): 10, ("b", 0): 7})  # nothing moved: nothing asked
    assert len(admin.asked) == 2
    deleter.delete(admin, {("a", 0): 12, ("a", 1): 3, ("b", 0): 7})
    assert admin.asked[-1] == [("a", 0, 12), ("a", 1, 3)]
    assert deleter.deleted_before == {("a", 0): 12, ("a", 1): 3, ("b", 0): 7}
