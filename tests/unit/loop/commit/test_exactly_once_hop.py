"""Under exactly-once a result's delivery hop ends when its transaction commits; the outputs of
an aborted transaction give no sample (they are produced again after the rewind)."""

from __future__ import annotations

from typing import Any

from worker.config import load_config
from worker.loop.commit.exactly_once import ExactlyOnce
from worker.loop.group.assignment import Assignment
from worker.loop.hops import HopTimes
from worker.loop.output import Output
from worker.wire.records import SourceRef


class StandInTransactions:
    """What ExactlyOnce asks of worker.loop.commit.transactions.Transactions, without a broker."""

    def __init__(self) -> None:
        self.open, self.failed, self.records, self.sequence, self.age_s = False, None, 0, 0, 0.0
        self.needs_init = False
        self.committed: list[Any] = []

    def produce(self, out: Output, on_delivery: Any) -> None:
        self.open, self.records = True, self.records + 1

    def commit(self, offsets: list[Any], group_metadata: object) -> None:
        self.committed.append(offsets)
        self.open, self.records = False, 0

    def abort(self) -> bool:
        self.open, self.records = False, 0
        return True


class NoCoordinator:
    def group_metadata(self) -> object:
        return object()

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        return []


def _committer() -> tuple[ExactlyOnce, HopTimes]:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9", "instance_id": "t"},
                      processing={"guarantee": "exactly-once"})
    hops = HopTimes()
    eo = ExactlyOnce(cfg, NoCoordinator(), Assignment(), lambda keys: None,  # type: ignore[arg-type]
                     hops=hops)
    eo._txn = StandInTransactions()  # type: ignore[assignment]
    return eo, hops


def _result(offset: int) -> Output:
    return Output(SourceRef("jobs", 0, offset), "results", b"k", b"v", None, "result")


def test_the_delivery_hop_ends_at_the_transaction_commit() -> None:
    eo, hops = _committer()
    for off in range(3):
        eo.begin("jobs", 0, off)
    eo.emit([_result(0), _result(1), _result(2)])
    assert "delivery" not in hops.summary()  # produced, not visible yet
    eo._commit()
    assert hops.summary()["delivery"]["n"] == 3


def test_an_aborted_transaction_s_outputs_give_no_sample() -> None:
    eo, hops = _committer()
    for off in range(2):
        eo.begin("jobs", 0, off)
    eo.emit([_result(0), _result(1)])
    eo._abort("a drill")
    eo._rewind()
    eo.begin("jobs", 0, 0)
    eo.emit([_result(0)])
    eo._commit()
    assert hops.summary()["delivery"]["n"] == 1
