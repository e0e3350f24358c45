"""The output room: a task's answer, or a rejected record, becomes one record to produce.

An :class:`Output` is produced by the committer of the process's delivery guarantee
(:mod:`worker.loop.commit`), which also decides when its source offset counts as finished.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from worker.exceptions import JobRejected, ResultTooLarge
from worker.loop.stats import Stats
from worker.tasks.protocol import Answer, TaskTopics
from worker.wire.dlq import dead_letter, dead_letter_by_reference
from worker.wire.records import Headers, SourceRecord, SourceRef
from worker.wire.trace import trace_headers

if TYPE_CHECKING:
    import confluent_kafka as ck

log = structlog.get_logger("worker")


# Not frozen: made per message, and a frozen dataclass's __init__ costs ~1 us more per object.
@dataclass(slots=True)
class Output:
    """One record to produce for one consumed record: its result or its DLQ record."""

    ref: SourceRef
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    kind: str  # "result" | "dlq"
    # A DLQ output's rejected record and why: a DLQ topic that refuses the record as too large
    # gets it again by reference (worker.wire.dlq.dead_letter_by_reference).
    rejected: tuple[SourceRecord, JobRejected] | None = None
    # A result's source record: a results topic that refuses the result as too large gets the
    # job dead-lettered instead (reason result_too_large).
    source: SourceRecord | None = None
    attempt: int = 0  # deliveries that failed so far (at-least-once retries with backoff)


RecordKey = tuple[str, bytes | None, bytes | None]


def by_record(outs: Iterable[Output]) -> dict[RecordKey, list[Output]]:
    """Outputs by what a delivery report tells of its record: topic, key and value. A report
    carries no headers, and outputs equal in these three can differ in theirs (a DLQ record
    names its source offset, a result its ``ce_id``), so a report stands for every output of
    its group. Both committers match failed reports through this."""
    index: dict[RecordKey, list[Output]] = {}
    for o in outs:
        index.setdefault((o.topic, o.key, o.value), []).append(o)
    return index


def reported(msg: ck.Message) -> RecordKey:
    """A delivery report's record, as :func:`by_record` indexes outputs."""
    return (msg.topic() or "", msg.key(), msg.value())


def by_reference(out: Output, worker_id: str) -> Output:
    """A DLQ output the DLQ topic (or the producer) refused as too large, as a reference to the
    source record (:func:`worker.wire.dlq.dead_letter_by_reference`)."""
    assert out.rejected is not None
    src, error = out.rejected
    small = dead_letter_by_reference(src, error, worker_id)
    return Output(out.ref, out.topic, small.key, small.value, small.headers, "dlq")


def stand_in(out: Output, worker_id: str, outputs: OutputBuilder | None, why: str
             ) -> Output | None:
    """What to produce instead of an output its topic refused as it is (too large, or keyless
    for a compacted topic): a DLQ record goes by reference; a result becomes its job's dead
    letter (``result_too_large``); None when neither applies. Both committers use it."""
    if out.rejected is not None:
        log.warning("dlq_record_too_large", topic=out.topic, partition=out.ref.partition,
                    offset=out.ref.offset, bytes=len(out.value or b""), error=why)
        return by_reference(out, worker_id)
    if out.source is not None and outputs is not None:
        log.warning("result_too_large", topic=out.topic, partition=out.ref.partition,
                    offset=out.ref.offset, bytes=len(out.value or b""), error=why)
        return outputs.dead_letter(out.source, ResultTooLarge(
            f"result of {len(out.value or b'')} bytes refused by {out.topic}: {why}"))
    return None


class CloudEvents:
    """CloudEvents 1.0 binary-mode headers for results (the Kafka protocol binding): ``ce_id``
    is ``<topic>-<partition>-<offset>`` of the job, the same for a result repeated after a
    crash."""

    def __init__(self, task: str, group_id: str) -> None:
        self._static: Headers = [
            ("ce_specversion", b"1.0"),
            ("ce_type", f"io.kafka-trt-worker.{task}.result".encode()),
            ("ce_source", f"kafka-trt-worker/{group_id}".encode()),
            ("content-type", b"application/msgpack"),
        ]

    def headers(self, ref: SourceRef, job_id: str, before: Headers | None = None) -> Headers:
        """``before`` (if any), then this result's CloudEvents headers, in one new list."""
        return [*(before or ()), *self._static,
                ("ce_id", f"{ref.topic}-{ref.partition}-{ref.offset}".encode()),
                ("ce_subject", job_id.encode("utf-8", "backslashreplace"))]


def _debug_jobs() -> bool:
    return logging.getLogger("worker").isEnabledFor(logging.DEBUG)


class OutputBuilder:
    """Turns answers into outputs, with the per-job log lines and counters."""

    def __init__(self, topics: TaskTopics, worker_id: str, stats: Stats, *,
                 dlq_inline_max_bytes: int | None = None,
                 cloudevents: CloudEvents | None = None) -> None:
        self.topics, self.worker_id, self.stats = topics, worker_id, stats
        self.dlq_inline_max_bytes = dlq_inline_max_bytes
        self.cloudevents = cloudevents

    def of_answers(self, answers: list[Answer]) -> list[Output]:
        """One output per answer, in order. Per-job log lines cost ~10 us each even when
        filtered, so the level is checked once per batch of answers."""
        debug = _debug_jobs()
        results = self.topics.results
        ce = self.cloudevents
        outs: list[Output] = []
        n_results = 0
        for a in answers:
            if a.rejection is not None:
                outs.append(self.dead_letter(a.record, a.rejection))
                continue
            if a.expired:
                self.stats.expired += 1
                log.info("job_expired", job_id=a.job_id, topic=a.ref.topic,
                         partition=a.ref.partition, offset=a.ref.offset)
            elif debug:
                log.debug("job_result", job_id=a.job_id, topic=a.ref.topic,
                          partition=a.ref.partition, offset=a.ref.offset, status=a.status)
            assert a.value is not None
            n_results += 1
            headers = a.headers or []
            if a.record.headers:  # a W3C traceparent on the job goes onto its result
                headers = headers + trace_headers(a.record.headers)
            if ce is not None:  # (one list built per result, never the task's own list)
                headers = ce.headers(a.ref, a.job_id, headers)
            outs.append(Output(a.ref, results, a.key, a.value, headers, "result", None,
                               a.record))
        self.stats.results += n_results
        return outs

    def dead_letter(self, src: SourceRecord, error: JobRejected) -> Output:
        record = dead_letter(src, error, self.worker_id,
                             inline_max_bytes=self.dlq_inline_max_bytes)
        ref = SourceRef(src.topic, src.partition, src.offset)
        log.warning("job_dead_lettered",
                    key=src.key.decode("utf-8", "replace") if src.key else None,
                    topic=ref.topic, partition=ref.partition, offset=ref.offset,
                    reason=error.reason, error=str(error)[:300])
        self.stats.dead_lettered += 1
        self.stats.dead_by_reason[error.reason] += 1
        return Output(ref, self.topics.dlq, record.key, record.value, record.headers, "dlq",
                      (src, error))
