"""worker.loop.commit.transactions: librdkafka's error classes and what the worker does with each.

The producer here is a scripted stand-in (no broker: unit tests); the real transactional
producer is exercised by tests/integration/delivery/test_exactly_once.py and the fault tests.
"""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import pytest

from worker.exceptions import ProducerFenced, TransactionError
from worker.kafka import txn_error
from worker.loop.commit.transactions import Transactions
from worker.loop.output import Output
from worker.wire.records import SourceRef

OUT = Output(SourceRef("jobs", 0, 5), "results", b"k", b"v", None, "result")


def _err(code: int, **flags: bool) -> TransactionError:
    return txn_error(ck.KafkaError(code, "scripted", **flags), "call")


RETRIABLE = _err(ck.KafkaError._TIMED_OUT, retriable=True)
ABORTABLE = _err(ck.KafkaError.UNKNOWN_MEMBER_ID, txn_requires_abort=True)
FENCED = _err(ck.KafkaError._FENCED, fatal=True)
UNCLASSIFIED = _err(ck.KafkaError._STATE)


class ScriptedProducer:
    """Records calls; each transactional call pops its next outcome (an error or None)."""

    def __init__(self, **script: list[TransactionError | None]) -> None:
        self.script = script
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        queue = self.script.get(name, [])
        outcome = queue.pop(0) if queue else None
        if outcome is not None:
            raise outcome

    def init_transactions(self, timeout: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def send_offsets_to_transaction(self, offsets: Any, meta: Any, timeout: float) -> None:
        self._call("send_offsets")

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")

    def produce(self, topic: str, **kw: Any) -> None:
        self._call("produce")

    def abandon(self) -> None:
        self.calls.append("abandon")

    def open(self) -> None:
        self.calls.append("open")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _txn(p: ScriptedProducer, clock: Clock | None = None, timeout_ms: int = 10_000
         ) -> Transactions:
    c = clock or Clock()
    return Transactions(p, timeout_ms=timeout_ms, clock=c, sleep=c.sleep)  # type: ignore[arg-type]


def _noop(*_: Any) -> None:
    return None


OFFSETS = [ck.TopicPartition("jobs", 0, 6)]


def test_classification_follows_librdkafka_flags() -> None:
    assert RETRIABLE.recoverable and not RETRIABLE.abortable and not RETRIABLE.fatal
    assert ABORTABLE.abortable and not ABORTABLE.recoverable and not ABORTABLE.fatal
    assert FENCED.fatal and not FENCED.abortable and not FENCED.recoverable
    # confluent-kafka: "treat any other error as a fatal error".
    assert UNCLASSIFIED.fatal
    # Fatal wins over the other flags.
    both = _err(ck.KafkaError._FENCED, fatal=True, retriable=True, txn_requires_abort=True)
    assert both.fatal and not both.recoverable and not both.abortable


def test_a_transaction_begins_with_its_first_output_and_commits_with_offsets() -> None:
    p = ScriptedProducer()
    t = _txn(p)
    assert not t.open
    t.produce(OUT, _noop)
    t.produce(OUT, _noop)
    assert t.open and t.records == 2
    t.commit(OFFSETS, object())
    assert p.calls == ["begin", "produce", "produce", "send_offsets", "commit"]
    assert not t.open and t.commits == 1 and t.sequence == 1


def test_commit_without_an_open_transaction_does_nothing() -> None:
    p = ScriptedProducer()
    t = _txn(p)
    t.commit(OFFSETS, object())
    assert p.calls == [] and t.commits == 0


def test_retriable_errors_are_retried_until_the_call_succeeds() -> None:
    p = ScriptedProducer(send_offsets=[RETRIABLE, RETRIABLE], commit=[RETRIABLE])
    t = _txn(p)
    t.produce(OUT, _noop)
    t.commit(OFFSETS, object())
    assert p.calls.count("send_offsets") == 3 and p.calls.count("commit") == 2
    assert t.retries == 3 and t.commits == 1 and t.failed is None


def test_an_abortable_error_marks_the_transaction_failed_and_abort_resets_it() -> None:
    p = ScriptedProducer(send_offsets=[ABORTABLE])
    t = _txn(p)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.commit(OFFSETS, object())
    assert info.value.abortable and t.failed is not None
    assert "commit" not in p.calls
    seq = t.sequence
    assert t.abort() is True
    assert p.calls[-1] == "abort"
    assert not t.open and t.failed is None and t.aborts == 1 and t.sequence == seq + 1


def test_a_failed_delivery_makes_the_next_commit_abortable_without_calling_the_broker() -> None:
    p = ScriptedProducer()
    t = _txn(p)
    t.produce(OUT, _noop)
    t.fail("delivery failed: MSG_SIZE_TOO_LARGE")
    with pytest.raises(TransactionError) as info:
        t.commit(OFFSETS, object())
    assert info.value.abortable and "MSG_SIZE_TOO_LARGE" in str(info.value)
    assert p.calls == ["begin", "produce"]


def test_retriable_past_its_budget_becomes_abortable_for_a_commit() -> None:
    clock = Clock()
    p = ScriptedProducer(commit=[RETRIABLE] * 1000)
    t = _txn(p, clock, timeout_ms=60_000)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.commit(OFFSETS, object())
    assert info.value.abortable and "still failing after 10 s" in str(info.value)
    assert 10.0 <= clock.now < 11.0


def test_an_abort_stuck_past_its_budget_resets_the_producer() -> None:
    clock = Clock()
    p = ScriptedProducer(abort=[RETRIABLE] * 1000)
    t = _txn(p, clock, timeout_ms=60_000)
    t.produce(OUT, _noop)
    assert t.abort() is True
    # 5 s of timeouts (the abort budget), then a new client whose init_transactions fences the
    # stuck one and has the coordinator abort its transaction.
    assert 5.0 <= clock.now < 6.0
    assert p.calls[-3:] == ["abandon", "open", "init"]
    assert t.resets == 1 and t.aborts == 1 and not t.open and t.failed is None


def test_a_commit_that_timed_out_is_aborted_by_a_reset() -> None:
    clock = Clock()
    p = ScriptedProducer(send_offsets=[RETRIABLE] * 1000)
    t = _txn(p, clock, timeout_ms=60_000)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError):
        t.commit(OFFSETS, object())
    assert t.abort() is True
    assert "abort" not in p.calls, "the suspect client is not asked to abort"
    assert p.calls[-3:] == ["abandon", "open", "init"] and t.resets == 1


def test_a_timed_out_delivery_makes_the_abort_a_reset_other_failures_do_not() -> None:
    p = ScriptedProducer()
    t = _txn(p)
    t.produce(OUT, _noop)
    t.fail("delivery failed: Local: Message timed out", timed_out=True)
    t.abort()
    assert t.resets == 1 and "abort" not in p.calls
    t.produce(OUT, _noop)
    t.fail("delivery failed: MSG_SIZE_TOO_LARGE")
    t.abort()
    assert t.resets == 1 and p.calls[-1] == "abort"


def test_a_reset_whose_init_keeps_failing_is_waited_out_not_fatal() -> None:
    """A broker or coordinator outage outlasting the reset's budget: the new client stays
    unregistered and the error is retriable (the committer waits it out); once the cluster
    answers, reinit() registers it. (It was fatal, a restart into the same outage.)"""
    clock = Clock()
    p = ScriptedProducer(abort=[RETRIABLE] * 1000, init=[RETRIABLE] * 1000)
    t = _txn(p, clock, timeout_ms=4_000)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.abort()
    assert info.value.recoverable and not info.value.fatal
    assert "init_transactions" in str(info.value)
    assert t.needs_init and not t.open and t.aborts == 1
    with pytest.raises(TransactionError) as again:
        t.reinit()
    assert again.value.recoverable and t.needs_init
    p.script["init"].clear()  # the cluster answers again
    t.reinit()
    assert not t.needs_init
    t.produce(OUT, _noop)  # a new transaction opens on the registered client
    assert t.open


@pytest.mark.parametrize("call", ["send_offsets", "commit"])
def test_fenced_is_fatal_and_named(call: str) -> None:
    p = ScriptedProducer(**{call: [FENCED]})
    t = _txn(p)
    t.produce(OUT, _noop)
    with pytest.raises(ProducerFenced) as info:
        t.commit(OFFSETS, object())
    assert info.value.fatal and not info.value.recoverable


def test_an_unclassified_error_is_fatal() -> None:
    p = ScriptedProducer(commit=[UNCLASSIFIED])
    t = _txn(p)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.commit(OFFSETS, object())
    assert info.value.fatal


def test_a_produce_refused_for_the_clients_transaction_state_aborts_by_a_reset() -> None:
    """The abort drill under load once got ``_STATE`` from produce after an abort (a late
    purge report failed the next transaction): that transaction is lost, not the worker."""
    p = ScriptedProducer(produce=[None, UNCLASSIFIED])
    t = _txn(p)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.produce(OUT, _noop)
    assert info.value.abortable and not info.value.fatal and t.failed is not None
    assert t.abort()
    assert p.calls[-3:] == ["abandon", "open", "init"] and "abort" not in p.calls
    assert t.resets == 1 and t.failed is None and not t.open


@pytest.mark.parametrize("refusal", [
    _err(ck.KafkaError.INVALID_TXN_STATE, fatal=True),  # Kafka 4.1, an abort just after a commit
    ABORTABLE,
    UNCLASSIFIED,
], ids=["invalid-txn-state", "abortable", "unclassified"])
def test_an_abort_the_broker_refuses_is_done_by_a_reset(refusal: TransactionError) -> None:
    """The transaction must end either way; a new client with the same transactional.id ends
    it at the coordinator (as the restart after a fatal exit would), and the worker goes on."""
    p = ScriptedProducer(abort=[refusal])
    t = _txn(p)
    t.produce(OUT, _noop)
    assert t.abort() is True
    assert p.calls[-4:] == ["abort", "abandon", "open", "init"]
    assert t.resets == 1 and t.aborts == 1 and not t.open and t.failed is None
    t.produce(OUT, _noop)
    assert t.open


@pytest.mark.parametrize("refusal", [
    FENCED,
    _err(ck.KafkaError.PRODUCER_FENCED, fatal=True),
    _err(ck.KafkaError._FATAL, fatal=True),  # the client's fatal state, cause unreported
], ids=["fenced", "producer-fenced", "generic-fatal"])
def test_an_abort_refused_for_fencing_or_an_unknown_fatal_cause_stays_fatal(
        refusal: TransactionError) -> None:
    """A newer instance owns the transactional.id: a new client would fence it in turn."""
    p = ScriptedProducer(abort=[refusal])
    t = _txn(p)
    t.produce(OUT, _noop)
    with pytest.raises(TransactionError) as info:
        t.abort()
    assert info.value.fatal and t.resets == 0 and "abandon" not in p.calls


def test_produce_errors_abortable_marks_failed_and_fatal_raises_fatal() -> None:
    p = ScriptedProducer(produce=[ABORTABLE])
    t = _txn(p)
    with pytest.raises(TransactionError):
        t.produce(OUT, _noop)
    assert t.failed is not None and t.open
    p2 = ScriptedProducer(produce=[FENCED])
    with pytest.raises(ProducerFenced):
        _txn(p2).produce(OUT, _noop)


@pytest.mark.parametrize("code", [ck.KafkaError._UNKNOWN_TOPIC,
                                  ck.KafkaError.TOPIC_AUTHORIZATION_FAILED])
def test_a_record_refused_at_produce_fails_the_transaction_not_the_process(code: int) -> None:
    """A results topic deleted or WRITE revoked: librdkafka refuses the record in produce().
    Neither retriable nor abortable by its flags, it counted as fatal (an exit, then a restart
    into the same refusal); the transaction is aborted and redone instead."""
    p = ScriptedProducer(produce=[_err(code)])
    t = _txn(p)
    with pytest.raises(TransactionError) as info:
        t.produce(OUT, _noop)
    assert info.value.abortable and not info.value.fatal
    assert t.failed is not None


def test_begin_failure_is_fatal() -> None:
    p = ScriptedProducer(begin=[ABORTABLE])
    with pytest.raises(TransactionError) as info:
        _txn(p).produce(OUT, _noop)
    assert info.value.fatal


def test_init_retries_then_gives_up_fatally() -> None:
    clock = Clock()
    p = ScriptedProducer(init=[RETRIABLE, RETRIABLE])
    t = _txn(p, clock)
    t.init()
    assert p.calls == ["init"] * 3
    p2 = ScriptedProducer(init=[RETRIABLE] * 1000)
    with pytest.raises(TransactionError) as info:
        _txn(p2, Clock(), timeout_ms=1_000).init()
    assert info.value.fatal


def test_abort_with_nothing_open_is_a_no_op() -> None:
    p = ScriptedProducer()
    t = _txn(p)
    assert t.abort() is False and p.calls == []




@pytest.mark.parametrize(("reason", "fenced"), [
    ("Fatal error: Broker: There is a newer producer with the same transactionalId which "
     "fences the current one", True),
    ("Fatal error: Broker: Producer attempted an operation with an old epoch", True),
    ("Local: This instance has been fenced by a newer instance", True),
    ("Fatal error: Broker: Transactional Id authorization failed", False),
    (None, False),
])
def test_the_generic_fatal_code_is_classified_by_the_error_callbacks_report(
    reason: str | None, fenced: bool
) -> None:
    """A producer in its fatal state fails every call with _FATAL; only the error callback
    said why (a real case: a fenced instance's next produce())."""
    err = ck.KafkaError(ck.KafkaError._FATAL, "Unable to produce message: Local: Fatal error")
    exc = txn_error(err, "produce to out", reason)
    assert isinstance(exc, ProducerFenced) is fenced
    assert exc.fatal and not exc.abortable
    if reason:
        assert reason in str(exc)


def test_the_producer_records_the_fatal_report_its_error_callback_gets() -> None:
    from worker.kafka.clients import Producer

    p = Producer({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"})
    p._on_error(ck.KafkaError(ck.KafkaError._TRANSPORT, "connection refused"))
    assert p.fatal_reason is None, "a transient error is not a fatal one"
    p._on_error(ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: ... fences ..."))
    assert p.fatal_reason is not None and "fences" in p.fatal_reason


def test_fatal_error_events_count_as_fatal_whatever_their_flag() -> None:
    from worker.kafka import is_fatal

    # librdkafka's fatal error event: generic _FATAL code, fatal() False on the event itself.
    event = ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced")
    assert not event.fatal() and is_fatal(event)
    assert is_fatal(ck.KafkaError(ck.KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert not is_fatal(ck.KafkaError(ck.KafkaError._TRANSPORT, "broker down"))


def test_a_call_blocking_past_its_timeout_keeps_the_loops_heartbeat() -> None:
    """librdkafka held send_offsets_to_transaction 60 s against a 10 s timeout after a broker
    stall: the loop did not step, /healthz failed and an orchestrator would have restarted a
    worker that was only waiting. The call now runs on a helper thread while on_wait beats."""
    import threading

    release = threading.Event()

    class SlowProducer(ScriptedProducer):
        def commit_transaction(self, timeout: float) -> None:
            release.wait(5)
            super().commit_transaction(timeout)

    p = SlowProducer()
    t = _txn(p)
    beats: list[int] = []

    def beat() -> None:
        beats.append(1)
        if len(beats) == 3:
            release.set()

    t.on_wait = beat
    t.produce(OUT, _noop)
    t.commit(OFFSETS, object())
    assert len(beats) >= 3 and t.commits == 1
    t.close()


def test_a_fatal_call_waits_for_the_report_queued_just_after_it() -> None:
    """librdkafka sets the fatal state before it queues the error callback's report: a fenced
    instance's produce() failed with _FATAL while one poll(0) found nothing yet, and the
    worker logged an unclassified failure (CI, test_exactly_once's fencing test)."""
    from worker.kafka.clients import Producer

    p = Producer({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"})

    class LateReport:
        polls = 0

        def produce(self, *args: object, **kwargs: object) -> None:
            raise ck.KafkaException(ck.KafkaError(
                ck.KafkaError._FATAL, "Unable to produce message: Local: Fatal error"))

        def poll(self, timeout: float) -> int:
            self.polls += 1
            if self.polls == 3:  # the report becomes servable a moment after the failure
                p._on_error(ck.KafkaError(
                    ck.KafkaError._FATAL, "Fatal error: Local: This instance has been fenced "
                    "by a newer instance"))
            return 0

    p._client = LateReport()  # type: ignore[assignment]
    with pytest.raises(ProducerFenced):
        p.produce("out", key=b"k", value=b"v")
