"""The worker's transactional producer: one open transaction at a time, errors classified.

Exactly-once commit protocol (driven by :mod:`worker.loop.worker`):

1. A transaction begins lazily, with the first output released into it.
2. Outputs (results and DLQ records) are produced into it in offset order per partition
   (:class:`worker.loop.commit.ordered.OrderedRelease`); a record is finished once its output is in.
3. Every ``commit.interval_ms`` (and on revoke and at shutdown) the loop sends the tracker's
   positions (the lowest unfinished offset per partition) with the consumer's group metadata
   (``send_offsets_to_transaction``) and commits. Outputs and offsets become visible together.
4. On an abortable error, a failed delivery, lost partitions or an explicit request the
   transaction is aborted; the loop then seeks every partition back to its last committed
   position and drops its queued and in-flight work, so the aborted outputs are produced again,
   once, in a later transaction.

Error classes (librdkafka's, see :func:`worker.kafka.txn_error`):

- retriable: the same call is repeated (with a short back-off) until it succeeds, for at most
  a budget: 10 s for a commit, 5 s for an abort (both shrink with a transaction timeout under
  40 s). A commit still timing out after its budget, or a record whose delivery timed out, is
  treated as abortable *and* makes the client suspect: after a long broker stall librdkafka can
  be left without any broker in its metadata and never reconnect (observed with a single-node
  Kafka 4.1 frozen for 30 s: every later request sat in the queue until it timed out). So that
  abort is done by a *reset*: the client is dropped and a new one with the same
  transactional.id runs ``init_transactions``, which fences the old one and has the coordinator
  abort its open transaction (the same path as a restart after kill -9). An abort that itself
  times out for its budget is also done by a reset. A new client whose ``init_transactions``
  keeps timing out (the broker or the transaction coordinator is down) raises a *retriable*
  :class:`TransactionError` and stays marked ``needs_init``: the committer waits the outage out
  (partitions paused, readiness off) and calls :meth:`Transactions.reinit` again later, in
  short attempts that never hold the loop for long. Outages of minutes end in a recovery, not
  an exit (a restart would meet the same outage);
- abortable (``txn_requires_abort``): :class:`TransactionError` with ``abortable`` set reaches
  the loop, which aborts and rewinds;
- fatal (fenced by a newer instance with the same transactional.id, or anything unclassified):
  :class:`TransactionError` with ``fatal`` set (:class:`ProducerFenced` when fenced) stops the
  worker without committing again; the process exits non-zero for the orchestrator to restart.
  The exception is an abort the broker refuses for any reason but fencing: it is done by a
  reset, which ends the transaction as that restart would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import confluent_kafka as ck
import structlog

from worker.exceptions import ProducerFenced, TransactionError
from worker.kafka import Producer
from worker.kafka.clients import FENCED_CODES, DeliveryCallback
from worker.loop.output import Output

log = structlog.get_logger("worker.loop.commit.transactions")


# How often a blocking transactional call reports that the loop is alive (see _blocking).
WAIT_BEAT_S = 0.5


class _Stuck(Exception):
    """The client needs a reset: a call kept timing out for its whole budget, or the broker
    refused it in a way a new client gets past (:func:`_replaceable`)."""


def _replaceable(exc: TransactionError) -> bool:
    """A failed abort that a new client can finish: anything but fencing (a newer instance
    owns the transactional.id; a new client would fence it in turn) and librdkafka's generic
    fatal code, which a client already in its fatal state returns whatever the cause."""
    if isinstance(exc, ProducerFenced):
        return False
    return exc.code not in FENCED_CODES and exc.code != ck.KafkaError._FATAL


def _as_fatal(exc: TransactionError, what: str) -> TransactionError:
    cls = ProducerFenced if exc.code in FENCED_CODES else TransactionError
    return cls(f"{what}: {exc}", code=exc.code, fatal=True)


class Transactions:
    """Transaction state around a transactional :class:`Producer` (no threads of its own)."""

    def __init__(
        self,
        producer: Producer,
        *,
        timeout_ms: int,
        op_timeout_s: float = 10.0,
        backoff_s: float = 0.2,
        commit_budget_s: float | None = None,
        abort_budget_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._producer = producer
        self._retry_for_s = timeout_ms / 1e3
        self._commit_budget_s = (commit_budget_s if commit_budget_s is not None
                                 else min(10.0, self._retry_for_s / 4))
        self._abort_budget_s = (abort_budget_s if abort_budget_s is not None
                                else min(5.0, self._retry_for_s / 8))
        self._op_timeout_s = op_timeout_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._sleep = sleep
        # Called while a transactional call blocks (the loop's liveness heartbeat).
        self.on_wait: Callable[[], None] | None = None
        self._caller: ThreadPoolExecutor | None = None
        self.open = False
        # A reset's new client has not registered its transactional.id yet (see reinit()).
        self.needs_init = False
        self.opened_at: float | None = None
        self.records = 0  # produced into the open transaction
        self.failed: str | None = None  # set when the open transaction can only be aborted
        self._suspect = False  # the failure was a timeout: the client may be stuck
        # Bumped at every commit and abort: a delivery report carries the sequence of its
        # transaction, so reports of an aborted one (purged messages) are told apart.
        self.sequence = 0
        self.commits = 0
        self.aborts = 0
        self.retries = 0
        self.resets = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self) -> None:
        """Register the transactional.id; fences and aborts a previous incarnation's work."""
        self._retrying("init_transactions", self._producer.init_transactions,
                       budget_s=self._retry_for_s, on_deadline="fatal")

    def begin(self) -> None:
        """Open a transaction (lazily by :meth:`produce`; directly for one that carries
        offsets alone: the crash-loop breaker's marks, worker/loop/poison.py)."""
        if self.open:
            return
        try:
            self._producer.begin_transaction()
        except TransactionError as exc:
            # begin_transaction fails only on a state error or a fatal one.
            raise _as_fatal(exc, "begin_transaction") from exc
        self.open = True
        self.opened_at = self._clock()
        self.records = 0

    def produce(self, out: Output, on_delivery: DeliveryCallback) -> None:
        if not self.open:
            self.begin()
        try:
            self._producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                                   on_delivery=on_delivery)
        except TransactionError as exc:
            if exc.code == ck.KafkaError._STATE:
                # librdkafka refused the record because its transaction state went wrong
                # under us: a purge report from the transaction just aborted came in late
                # and failed the next one (seen once in the abort drill under
                # load). Nothing of this transaction can commit, but a new client with
                # the same transactional.id starts clean, so the abort replaces the client.
                self.fail(str(exc), timed_out=True)
                raise TransactionError(str(exc), code=exc.code, abortable=True) from exc
            if exc.code == ck.KafkaError._FATAL or exc.code in FENCED_CODES:
                raise _as_fatal(exc, "produce") from exc
            # Refused before sending (a topic missing or not authorised, a local limit): the
            # client is fine, this transaction cannot hold the record. Abort and redo it; the
            # committer holds the partitions longer at each abort in a row (never an exit: a
            # restart would meet the same refusal).
            self.fail(str(exc))
            if exc.abortable:
                raise
            raise TransactionError(str(exc), code=exc.code, abortable=True) from exc
        self.records += 1

    def fail(self, reason: str, *, timed_out: bool = False) -> None:
        """The open transaction can no longer commit (e.g. a delivery failed): abort it.
        ``timed_out``: the failure was a timeout (or left the client's sequence numbers or
        transaction state broken), so the abort resets the client."""
        if self.failed is None:
            self.failed = reason
        self._suspect = self._suspect or timed_out

    @property
    def age_s(self) -> float:
        return self._clock() - self.opened_at if self.open and self.opened_at else 0.0

    def commit(self, offsets: list[ck.TopicPartition], group_metadata: object) -> None:
        """Send the offsets and commit. Raises an abortable :class:`TransactionError` when the
        transaction must be aborted instead, a fatal one when the worker must stop."""
        if self.failed is not None:
            raise TransactionError(f"transaction failed: {self.failed}", abortable=True)
        if not self.open:
            return
        if offsets:
            self._retrying(
                "send_offsets_to_transaction",
                lambda t: self._producer.send_offsets_to_transaction(offsets, group_metadata, t),
                budget_s=self._commit_budget_s, on_deadline="abort",
            )
        self._retrying("commit_transaction", self._producer.commit_transaction,
                       budget_s=self._commit_budget_s, on_deadline="abort")
        self._closed()
        self.commits += 1

    def abort(self) -> bool:
        """Abort the open transaction (if any); True if one was aborted."""
        if not self.open and self.failed is None:
            return False
        try:
            if self._suspect:
                self.reset(f"aborting after a timeout ({self.failed})")
            else:
                # A refused abort must still end the transaction (Kafka 4.1 answered an EndTxn
                # sent right after a commit with INVALID_TXN_STATE, which librdkafka makes
                # fatal to the client): a new client with this transactional.id ends it, as
                # a restart would, without one.
                try:
                    self._retrying("abort_transaction", self._producer.abort_transaction,
                                   budget_s=self._abort_budget_s, on_deadline="reset")
                except _Stuck as exc:
                    self.reset(str(exc))
        finally:
            # Whatever the new client's registration does, this transaction is gone: the
            # coordinator aborts it when a client with this transactional.id registers.
            self._closed()
            self.aborts += 1
        return True

    def reset(self, reason: str) -> None:
        """Replace a stuck client: a new one with the same transactional.id fences the old one
        and makes the coordinator abort its open transaction. Raises a retriable
        :class:`TransactionError` when the new client cannot register within its budget
        (``needs_init`` stays set: :meth:`reinit` tries again)."""
        log.warning("producer_reset", reason=reason[:300])
        self._producer.abandon()
        self._producer.open()
        self.resets += 1
        self.needs_init = True
        self.reinit()

    def reinit(self) -> None:
        """Register a reset's new client, within the abort budget; a retriable
        :class:`TransactionError` when the cluster still does not answer."""
        self._retrying("init_transactions", self._producer.init_transactions,
                       budget_s=self._abort_budget_s, on_deadline="retriable")
        self.needs_init = False

    def _closed(self) -> None:
        self.open = False
        self.opened_at = None
        self.failed = None
        self._suspect = False
        self.sequence += 1

    def _blocking(self, call: Callable[[float], None], timeout: float) -> None:
        """``call(timeout)``, with ``on_wait`` called every WAIT_BEAT_S while it runs. A
        transactional call can block far past its timeout (librdkafka held
        send_offsets_to_transaction 60 s against a 10 s timeout after a broker stall), and the
        loop's liveness heartbeat is not stepped meanwhile: the wait is the budgeted wait of a
        worker that is alive, not a hang for the orchestrator to restart."""
        if self.on_wait is None:
            call(timeout)
            return
        if self._caller is None:
            self._caller = ThreadPoolExecutor(1, thread_name_prefix="txn-call")
        fut = self._caller.submit(call, timeout)
        while True:
            try:
                fut.result(timeout=WAIT_BEAT_S)
                return
            except FutureTimeout:
                self.on_wait()

    def close(self) -> None:
        if self._caller is not None:
            self._caller.shutdown(wait=False)

    # -- retries -----------------------------------------------------------------------------
    def _retrying(self, what: str, call: Callable[[float], None], *, budget_s: float,
                  on_deadline: str) -> None:
        """``call`` until it succeeds, retriable errors repeated within ``budget_s``.
        ``on_deadline`` "reset" makes a new client the remedy for a refusal too: a fatal or
        abortable error that a new client can get past (:func:`_replaceable`) raises
        :class:`_Stuck`, as the timeout does. Otherwise a fatal error raises fatally and an
        abortable one fails the transaction."""
        deadline = self._clock() + budget_s
        attempt = 0
        while True:
            attempt += 1
            left = deadline - self._clock()
            try:
                self._blocking(call, max(0.1, min(self._op_timeout_s, left)))
                return
            except TransactionError as exc:
                if on_deadline == "reset" and (exc.fatal or exc.abortable):
                    if _replaceable(exc):
                        raise _Stuck(f"{what} refused: {exc}") from exc
                    raise _as_fatal(exc, what) from exc
                if exc.fatal:
                    raise _as_fatal(exc, what) from exc
                if exc.abortable:
                    self.fail(str(exc))
                    raise
                if self._clock() >= deadline:
                    msg = f"{what} still failing after {budget_s:.0f} s: {exc}"
                    if on_deadline == "fatal":
                        raise TransactionError(msg, code=exc.code, fatal=True) from exc
                    if on_deadline == "reset":
                        raise _Stuck(msg) from exc
                    if on_deadline == "retriable":
                        raise TransactionError(msg, code=exc.code, recoverable=True) from exc
                    self.fail(msg, timed_out=True)
                    raise TransactionError(msg, code=exc.code, abortable=True) from exc
                self.retries += 1
                log.warning("txn_retry", call=what, attempt=attempt, error=str(exc))
                self._sleep(self._backoff_s)
