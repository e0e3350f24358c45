"""Typed wrappers over confluent_kafka.Consumer / Producer.

They add three things only: settings built from :class:`WorkerConfig` (auto commit and auto
offset store off: the worker commits what it has delivered), lazy connection in ``open()``, and
librdkafka errors wrapped as :class:`KafkaIOError` carrying librdkafka's retriable flag.

Exactly-once adds the transactional calls of the producer; their errors are wrapped as
:class:`TransactionError` keeping librdkafka's three-way classification (retriable, abortable,
fatal). :func:`member_consumer_settings` and :func:`transactional_producer_settings` are the
worker's own clients; :func:`reader_settings` is the tools' consumer that never joins a group.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import confluent_kafka as ck
import structlog

from worker.config import KafkaSettings, WorkerConfig
from worker.config.kafka import is_secret_key, revealed
from worker.exceptions import KafkaIOError, ProducerFenced, TransactionError
from worker.kafka.headers import read_headers
from worker.wire.records import Headers, SourceRecord

RebalanceCallback = Callable[[Any, list[ck.TopicPartition]], None]
DeliveryCallback = Callable[[ck.KafkaError | None, ck.Message], None]
CommitCallback = Callable[[ck.KafkaError | None, list[ck.TopicPartition]], None]

log = structlog.get_logger("worker.kafka")


def source_record(msg: ck.Message, topic: str, partition: int, offset: int) -> SourceRecord:
    """A consumed record as the DLQ keeps it (coordinates already checked by the caller)."""
    ts_type, ts = msg.timestamp()
    headers, headers_error = read_headers(msg)
    return SourceRecord(topic, partition, offset, msg.key(), msg.value(), headers,
                        ts if ts_type != ck.TIMESTAMP_NOT_AVAILABLE else None, headers_error)


class ClientSettings(dict[str, Any]):
    """A client's librdkafka settings: the dict confluent-kafka takes, secrets in the clear
    (kafka.sasl_password, a pass-through table's passwords, keys and tokens), which its repr
    masks: a traceback that shows locals, a debugger or a log line then never prints them.
    Build one right before the client and keep no other copy (``dict(settings)`` is one)."""

    def __repr__(self) -> str:
        return repr({key: "**********" if is_secret_key(key) else value
                     for key, value in self.items()})

    def copy(self) -> ClientSettings:
        return ClientSettings(self)

    def __or__(self, other: Mapping[str, Any]) -> ClientSettings:  # type: ignore[override]
        return ClientSettings({**self, **other})


def common_settings(k: KafkaSettings) -> ClientSettings:
    conf = ClientSettings({
        "bootstrap.servers": k.bootstrap_servers,
        "client.id": k.client_id,
        "security.protocol": k.security_protocol,
        # librdkafka's own log lines go through stdlib logging (and so structlog's renderer).
        "logger": logging.getLogger("librdkafka"),
        # A broker that was unreachable (or fenced by its controller, e.g. after a long pause)
        # can answer metadata with no brokers at all; librdkafka then forgets every broker and
        # only re-bootstraps after this long (default 5 min: the worker would sit idle that
        # long). Measured in tests/integration/faults/test_faults_broker_stall.py.
        "metadata.recovery.rebootstrap.trigger.ms": 5_000,
        # Reconnect attempts back off exponentially up to this (default 10 s): after a broker
        # came back, a client could otherwise wait that long before trying again, on top of
        # the re-bootstrap above; 2 s keeps recovery after a stall well inside 10 s.
        "reconnect.backoff.max.ms": 2_000,
    })
    if k.sasl_mechanism:
        conf["sasl.mechanism"] = k.sasl_mechanism
    if k.sasl_username:
        conf["sasl.username"] = k.sasl_username
    if k.sasl_password is not None:
        conf["sasl.password"] = k.sasl_password.get_secret_value()
    if k.ssl_ca_location:
        conf["ssl.ca.location"] = k.ssl_ca_location
    conf.update(revealed(k.extra))
    return conf


def consumer_settings(cfg: WorkerConfig) -> ClientSettings:
    k = cfg.kafka
    conf = common_settings(k)
    conf.update(
        {
            "group.id": k.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": k.session_timeout_ms,
            "max.poll.interval.ms": k.max_poll_interval_ms,
            # Memory bound: librdkafka keeps at most this much prefetched, and one fetch
            # response is no larger (a record above these limits is still returned whole,
            # KIP-74, so they never block a large job).
            "queued.max.messages.kbytes": cfg.batch.fetch_queue_kbytes,
            "fetch.wait.max.ms": k.fetch_wait_max_ms,
            "fetch.max.bytes": cfg.batch.fetch_queue_kbytes * 1024,
            # A quarter of the prefetch budget per partition and request: 1 MiB (the default)
            # capped throughput at ~60 photo jobs per partition per round trip.
            "max.partition.fetch.bytes": max(1_048_576, cfg.batch.fetch_queue_kbytes * 256),
        }
    )
    conf.update(revealed(k.consumer_extra))
    return conf


def reader_settings(cfg: WorkerConfig, group: str) -> ClientSettings:
    """A consumer that never joins ``group``: it ``assign()``s partitions (tools: replay,
    redrive, generate's answer reader, the demo). librdkafka wants a ``group.id`` of every
    consumer; nothing is committed in it unless the caller commits (auto commit and offset
    store off), and aborted transactional output is never read."""
    conf = consumer_settings(cfg)
    conf.update({"group.id": group, "enable.auto.commit": False,
                 "enable.auto.offset.store": False, "isolation.level": "read_committed"})
    return conf


def member_consumer_settings(cfg: WorkerConfig, on_stats: Callable[[str], None] | None = None
                             ) -> ClientSettings:
    """The worker's own group member: ``consumer_settings`` plus the guarantee's needs, and
    librdkafka's statistics every ``metrics.statistics_interval_ms`` into ``on_stats`` (the
    consumer lag per partition comes from them)."""
    conf = consumer_settings(cfg)
    if on_stats is not None and cfg.metrics.statistics_interval_ms > 0:
        conf["statistics.interval.ms"] = cfg.metrics.statistics_interval_ms
        conf["stats_cb"] = on_stats
    if cfg.processing.guarantee == "exactly-once":
        # Never read the aborted output of an upstream transactional producer. (librdkafka's
        # default too; stated because exactly-once depends on it.)
        conf["isolation.level"] = "read_committed"
    if cfg.kafka.static_membership:
        conf["group.instance.id"] = cfg.kafka.instance_id
    conf.update(revealed(cfg.kafka.consumer_extra))
    return conf


def transactional_id(cfg: WorkerConfig) -> str:
    """``<prefix>.<group>.<instance>``: stable across restarts of one worker instance.

    With KIP-447 (offsets sent with ``consumer_group_metadata()``) the transactional.id does not
    have to follow partitions: the group coordinator fences a zombie's offset commit by its
    group generation, and a restarted instance reusing the id fences the dead one's producer
    (``init_transactions`` bumps the epoch and aborts its open transaction) at once instead of
    after ``transaction.timeout.ms``. Two live workers must never share an instance id: each
    would fence the other.
    """
    k = cfg.kafka
    return f"{k.transactional_id_prefix}.{k.group_id}.{k.instance_id}"


def transactional_producer_settings(cfg: WorkerConfig) -> ClientSettings:
    conf = producer_settings(cfg)
    conf.update(
        {
            "transactional.id": transactional_id(cfg),
            # Also caps message.timeout.ms and socket.timeout.ms (librdkafka adjusts them).
            "transaction.timeout.ms": cfg.kafka.transaction_timeout_ms,
        }
    )
    conf.update(revealed(cfg.kafka.producer_extra))
    return conf


def producer_settings(cfg: WorkerConfig) -> ClientSettings:
    k = cfg.kafka
    conf = common_settings(k)
    conf.update(
        {
            "acks": "all",
            "enable.idempotence": True,
            # Send results at once (librdkafka's default lingers 5 ms). In a backlog librdkafka
            # still batches whatever queues behind a request in flight, so throughput held:
            # 30.6k vs 30.1-31.9k msg/s on the 2-core VM, and on the H200 10.5k frames/s vs
            # 8.7k, half-load p99 27.8 vs 33.1 ms (bench/NOTES.md, "Client settings").
            "linger.ms": 0,
            "compression.type": k.compression,
            # Keyed records go where Java's (and every murmur2 client's) default partitioner
            # puts them (librdkafka's default, consistent_random, hashes with CRC32): a result
            # lands on the partition a Java or Node producer would pick for the same job id.
            "partitioner": "murmur2_random",
            # A DLQ record carries the original value, which may be as large as any job.
            "message.max.bytes": max(1_048_576, cfg.limits.max_message_bytes + 65_536),
        }
    )
    conf.update(revealed(k.producer_extra))
    return conf


def kafka_io_error(exc: ck.KafkaException, what: str) -> KafkaIOError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, ck.KafkaError):
        return KafkaIOError(f"{what}: {err.str()}", recoverable=err.retriable(),
                            code=err.code())
    return KafkaIOError(f"{what}: {exc}")


# Fatal errors that mean a newer instance took this transactional.id over.
FENCED_CODES = frozenset({ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                          ck.KafkaError.INVALID_PRODUCER_EPOCH})


# librdkafka's texts for the fenced codes above, as its error callback reports a fatal error
# ("Fatal error: Broker: There is a newer producer ... which fences the current one", "...
# operation with an old epoch", "Local: This instance has been fenced by a newer instance").
_FENCED_TEXT = re.compile(r"fence|old epoch", re.IGNORECASE)


def txn_error(err: ck.KafkaError, what: str, fatal_reason: str | None = None
              ) -> TransactionError:
    """librdkafka's classification of a transactional error: fatal beats abortable beats
    retriable; an error that is none of them is fatal (confluent-kafka's documented rule).

    Once the producer is in its fatal state, calls fail with the generic ``_FATAL`` code, and
    the underlying error is only told to the error callback (confluent-kafka has no
    ``rd_kafka_fatal_error()``): ``fatal_reason`` is that report, if one was seen."""
    msg = f"{what}: {err.name()}: {err.str()}"
    if err.code() == ck.KafkaError._FATAL:
        fenced = bool(fatal_reason and _FENCED_TEXT.search(fatal_reason))
        msg += f" ({fatal_reason})" if fatal_reason else ""
        flags = {"fatal": True}
    else:
        fenced = err.fatal() and err.code() in FENCED_CODES
        flags = {"recoverable": err.retriable(), "abortable": err.txn_requires_abort(),
                 "fatal": err.fatal()}
    return (ProducerFenced if fenced else TransactionError)(msg, code=err.code(), **flags)


# How long a call failing with the generic fatal code waits for the error callback's report.
_FATAL_REPORT_WAIT_S = 2.0


def _wrap_txn(exc: ck.KafkaException, what: str, fatal_reason: str | None = None
              ) -> TransactionError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, ck.KafkaError):
        return txn_error(err, what, fatal_reason)
    return TransactionError(f"{what}: {exc}", fatal=True)


def is_fatal(err: ck.KafkaError) -> bool:
    """The client is unusable from now on. librdkafka reports a fatal error (a static member
    fenced by another with the same ``group.instance.id``, a fenced producer) as an error event
    with the generic ``_FATAL`` code, and that event's ``fatal()`` is False: check both."""
    return bool(err.fatal()) or err.code() == ck.KafkaError._FATAL


# librdkafka's text for a static member fenced by its group coordinator (reported as a fatal
# error event with the generic _FATAL code, or as FENCED_INSTANCE_ID).
_STATIC_FENCED_TEXT = re.compile(r"static consumer fenced|group\.instance\.id", re.IGNORECASE)


def is_static_fencing(err: ck.KafkaError) -> bool:
    """The consumer was fenced as a static member (``group.instance.id`` taken over)."""
    return err.code() == ck.KafkaError.FENCED_INSTANCE_ID or (
        is_fatal(err) and bool(_STATIC_FENCED_TEXT.search(err.str())))


class Producer:
    def __init__(self, settings: dict[str, Any]) -> None:
        # Kept until open(): a copy whose repr masks the secrets.
        self._settings = ClientSettings(settings)
        self._settings.setdefault("error_cb", self._on_error)
        self._client: ck.Producer | None = None
        self.fatal_reason: str | None = None  # the error callback's report of a fatal error

    def _on_error(self, err: ck.KafkaError) -> None:
        # Served by poll()/flush(). Non-fatal errors are informational: librdkafka recovers.
        if is_fatal(err):
            self.fatal_reason = err.str()
            log.error("producer_fatal_error", code=err.name(), error=err.str())
        else:  # librdkafka's own log line says the same at its level
            log.debug("producer_error", code=err.name(), error=err.str())

    def _txn_error(self, exc: ck.KafkaException, what: str) -> TransactionError:
        err = exc.args[0] if exc.args else None
        if isinstance(err, ck.KafkaError) and err.code() == ck.KafkaError._FATAL:
            self._await_fatal_report()
        return _wrap_txn(exc, what, self.fatal_reason)

    def _await_fatal_report(self, within_s: float = _FATAL_REPORT_WAIT_S) -> None:
        """Serve the queue until the error callback has told why the producer is fatal.

        librdkafka sets the fatal state before it enqueues the report, so a call can fail
        with ``_FATAL`` while the report is not yet servable: one ``poll(0)`` lost that race
        in CI and a fenced instance was logged as an unclassified failure. The producer is
        unusable either way, so waiting a moment costs nothing."""
        deadline = time.monotonic() + within_s
        while self.fatal_reason is None and self._client is not None:
            with contextlib.suppress(ck.KafkaException):
                self._client.poll(0.05)
            if time.monotonic() >= deadline:
                return

    def _error(self, exc: ck.KafkaException, what: str) -> KafkaIOError:
        """``exc`` wrapped: a TransactionError for a transactional producer, else KafkaIOError."""
        if self.transactional:
            return self._txn_error(exc, what)
        return kafka_io_error(exc, f"{what} failed")

    @property
    def client(self) -> ck.Producer:
        if self._client is None:
            raise KafkaIOError("producer used before open()")
        return self._client

    def open(self) -> None:
        if self._client is None:
            self._client = ck.Producer(self._settings)

    @property
    def transactional(self) -> bool:
        return "transactional.id" in self._settings

    # -- transactions (exactly-once); every error is a TransactionError ---------------------
    def init_transactions(self, timeout: float) -> None:
        try:
            self.client.init_transactions(timeout)
        except ck.KafkaException as exc:
            raise self._txn_error(exc, "init_transactions") from exc

    def begin_transaction(self) -> None:
        try:
            self.client.begin_transaction()
        except ck.KafkaException as exc:
            raise self._txn_error(exc, "begin_transaction") from exc

    def send_offsets_to_transaction(self, offsets: list[ck.TopicPartition], group_metadata: object,
                                    timeout: float) -> None:
        try:
            self.client.send_offsets_to_transaction(offsets, group_metadata, timeout)
        except ck.KafkaException as exc:
            raise self._txn_error(exc, "send_offsets_to_transaction") from exc

    def commit_transaction(self, timeout: float) -> None:
        try:
            self.client.commit_transaction(timeout)
        except ck.KafkaException as exc:
            raise self._txn_error(exc, "commit_transaction") from exc

    def abort_transaction(self, timeout: float) -> None:
        try:
            self.client.abort_transaction(timeout)
        except ck.KafkaException as exc:
            raise self._txn_error(exc, "abort_transaction") from exc

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Enqueue one record; when the local queue is full, serve callbacks and retry."""
        while True:
            try:
                self.client.produce(topic, value=value, key=key, headers=headers,
                                    on_delivery=on_delivery)
                return
            except BufferError:
                self.poll(0.05)  # serve callbacks to make room (errors wrapped)
            except ck.KafkaException as exc:
                raise self._error(exc, f"produce to {topic}") from exc

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks. A fatal producer error (e.g. fenced) surfaces here too."""
        try:
            return self.client.poll(timeout)
        except ck.KafkaException as exc:
            raise self._error(exc, "producer poll") from exc

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; return how many are still undelivered."""
        try:
            return self.client.flush(timeout)
        except ck.KafkaException as exc:
            raise self._error(exc, "producer flush") from exc

    def abandon(self) -> None:
        """Drop the client without flushing (a fenced transactional producer may deliver
        nothing more); queued and in-flight records are purged."""
        client, self._client = self._client, None
        if client is not None:
            # In a fatal state the purge may be refused: dropping the client is enough then.
            with contextlib.suppress(ck.KafkaException, RuntimeError):
                client.purge(in_queue=True, in_flight=True, blocking=False)

    def close(self, timeout: float = 30.0) -> int:
        """Flush, then release the client; return how many records stayed undelivered."""
        if self._client is None:
            return 0
        try:
            return self._client.flush(timeout)
        finally:
            self._client = None
