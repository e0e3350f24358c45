"""Exactly-once delivery reports: one callable per emit(); a failed report fails its own
transaction (and names the right output), a report of an earlier transaction is ignored."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck

from worker.config import load_config
from worker.loop.commit.exactly_once import ExactlyOnce
from worker.loop.group.assignment import Assignment
from worker.loop.output import Output
from worker.wire.records import SourceRecord, SourceRef


class _Txn:
    def __init__(self) -> None:
        self.open, self.failed, self.records, self.sequence = False, None, 0, 0
        self.needs_init = False
        self.sent: list[tuple[Output, Any]] = []
        self.timed_out = False

    def produce(self, out: Output, on_delivery: Any) -> None:
        self.open, self.records = True, self.records + 1
        self.sent.append((out, on_delivery))

    def fail(self, reason: str, *, timed_out: bool = False) -> None:
        self.failed = self.failed or reason
        self.timed_out = self.timed_out or timed_out


def _committer() -> tuple[ExactlyOnce, _Txn]:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9", "instance_id": "t"},
                      processing={"guarantee": "exactly-once"})
    eo = ExactlyOnce(cfg, None, Assignment(), lambda keys: None)  # type: ignore[arg-type]
    txn = _Txn()
    eo._txn = txn  # type: ignore[assignment]
    for off in range(3):
        eo.begin("jobs", 0, off)
    return eo, txn


def _dlq(offset: int) -> Output:
    src = SourceRecord("jobs", 0, offset, b"k%d" % offset, b"v", None, None)
    return Output(SourceRef("jobs", 0, offset), "dlq", b"k%d" % offset, b"dead", None, "dlq",
                  rejected=(src, None))  # type: ignore[arg-type]


def _report(txn: _Txn, index: int, code: int) -> None:
    out, cb = txn.sent[index]
    cb(ck.KafkaError(code), ck.Message(topic=out.topic, key=out.key, value=out.value))


def test_a_failed_report_fails_the_transaction_and_names_its_own_output() -> None:
    eo, txn = _committer()
    eo.emit([_dlq(0), _dlq(1), _dlq(2)])
    assert len({id(cb) for _, cb in txn.sent}) == 1  # one callable for the batch
    for i in (0, 2):
        txn.sent[i][1](None, None)  # successes: nothing to do
    assert txn.failed is None
    _report(txn, 1, ck.KafkaError.MSG_SIZE_TOO_LARGE)
    assert txn.failed is not None and txn.timed_out
    assert eo._too_large == {SourceRef("jobs", 0, 1)}  # redone by reference after the rewind


def test_reports_of_an_earlier_transaction_or_purged_records_are_ignored() -> None:
    eo, txn = _committer()
    eo.emit([_dlq(0), _dlq(1)])
    _report(txn, 1, ck.KafkaError._PURGE_QUEUE)
    assert txn.failed is None
    txn.sequence += 1  # that transaction aborted and a new one began
    _report(txn, 0, ck.KafkaError._MSG_TIMED_OUT)
    assert txn.failed is None and eo._too_large == set()


def test_a_refused_source_stays_marked_until_its_stand_in_commits() -> None:
    # Marks used by a transaction that aborts as well must survive it: dropped at use, the
    # rewinds went round for good (each abort learning some records and forgetting others).
    eo, txn = _committer()
    eo._too_large = {SourceRef("jobs", 0, 1)}
    # (a result with no source record has no stand-in: it goes as it is; the mark is the point)
    result = Output(SourceRef("jobs", 0, 1), "results", b"k1", b"big", None, "result")
    eo.emit([_dlq(0), result, _dlq(2)])
    assert SourceRef("jobs", 0, 1) in eo._too_large
    _report(txn, 2, ck.KafkaError.MSG_SIZE_TOO_LARGE)  # this transaction aborts too
    assert eo._too_large == {SourceRef("jobs", 0, 1), SourceRef("jobs", 0, 2)}
    eo._settle_too_large({("jobs", 0): 2})  # committed up to offset 2 (exclusive)
    assert eo._too_large == {SourceRef("jobs", 0, 2)}
    eo.forget({("jobs", 0)})
    assert eo._too_large == set()


class _StuckTxn(_Txn):
    """A transaction whose commit times out: its records never reported (a deleted topic
    holds them in librdkafka)."""

    age_s = 0.1
    aborts = 0

    def commit(self, offsets: Any, group_metadata: Any) -> None:
        from worker.exceptions import TransactionError

        raise TransactionError("commit_transaction still failing after 10 s: _TIMED_OUT: "
                               "Failed to flush all outstanding messages", abortable=True)

    def abort(self) -> bool:
        self.open, self.failed, self.aborts = False, None, self.aborts + 1
        self.sequence += 1
        return True


class _GroupConsumer:
    def group_metadata(self) -> object:
        return object()


def _result(offset: int, topic: str = "results") -> Output:
    return Output(SourceRef("jobs", 0, offset), topic, b"k%d" % offset, b"r", None, "result")


def test_readiness_names_the_topic_a_timed_out_commit_still_waits_for() -> None:
    """A results topic deleted under a transaction: the commit times out flushing and the
    abort's reason (which readiness shows from the second abort in a row) only said so;
    it did not say which topic the records wait for."""
    eo, _ = _committer()
    txn = _StuckTxn()
    eo._txn, eo._consumer = txn, _GroupConsumer()  # type: ignore[assignment]
    txn.open = True
    eo._abort("an earlier transaction failed")  # (readiness shows from the second abort)
    eo.emit([_result(0, "results-gone")])
    eo.emit([_result(1, "dlq-fine")])
    txn.sent[-1][1](None, None)  # the DLQ took its record; the results topic never did
    assert not eo._commit()
    reason = eo.blocked()
    assert reason is not None and "records to results-gone" in reason[:120], reason
    assert "dlq-fine" not in reason
