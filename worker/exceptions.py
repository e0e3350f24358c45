"""The worker's exception tree.

Every error the worker raises derives from :class:`WorkerError`. Each class says whether the
condition is ``recoverable`` (the loop may keep running: the job goes to the DLQ or is retried)
or fatal (the process must stop without committing past unfinished work). Third-party errors are
wrapped with ``raise ... from`` so the cause stays visible.
"""

from __future__ import annotations

import errno


def one_line(text: object, limit: int = 300) -> str:
    """``text`` (an exception, a message) on one line of at most ``limit`` characters, as DLQ
    reasons and log fields carry it: every run of whitespace, newlines included, is one space."""
    return " ".join(str(text).split())[:limit]


class WorkerError(Exception):
    """Root of every error raised by the worker package."""

    recoverable: bool = False


class ConfigError(WorkerError):
    """Configuration is invalid or incomplete. Fatal: fix the settings and restart."""


class UnknownTopic(ConfigError):
    """A topic the worker or an admin command needs does not exist (or is not visible to this
    client); create it (``trt-worker topics create``) or fix the name."""


class TopicNotAuthorized(ConfigError):
    """This client may not read the jobs topic or write a results or DLQ topic (the broker's
    ACLs); grant the operation or fix the name."""


class JobRejected(WorkerError):
    """A job cannot be processed; it goes to the dead-letter queue with this reason.

    ``reason`` is a short machine-readable class (``not_msgpack``, ``schema``, ...) written to the
    DLQ headers next to the human-readable message.
    """

    recoverable = True
    reason: str = "rejected"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class MalformedPayload(JobRejected):
    """The payload is not valid msgpack, or not a map at the top level."""

    reason = "not_msgpack"


class SchemaViolation(JobRejected):
    """The payload decodes but violates the wire contract (types, required fields, ranges)."""

    reason = "schema"


class UnsupportedVersion(JobRejected):
    """The payload's ``v`` is a schema version this worker does not speak."""

    reason = "unsupported_version"


class UnknownPolicy(JobRejected):
    """The job names a moderation policy that is not configured."""

    reason = "unknown_policy"


class NothingToScore(JobRejected):
    """The job's policy runs no model that the job has input for (e.g. a text-only job under
    an image-only policy): answering "allow" would be a silent skip."""

    reason = "nothing_to_score"


class TextTooLong(JobRejected):
    """The job is valid but its text is longer than this worker takes: over
    ``limits.max_text_chars`` (the contract allows more), or more chunks than
    ``moderation.text.max_chunks``."""

    reason = "text_too_long"


class ImageRejected(JobRejected):
    """The image cannot be decoded, is too large, or looks like a decompression bomb."""

    reason = "bad_image"


class ResultTooLarge(JobRejected):
    """The job's result is larger than the results topic (or the producer) takes."""

    reason = "result_too_large"


class TaskFailed(JobRejected):
    """The task kept failing on this job alone (its batch failed and was split down to it), or
    could not serialise its result: a bug or a fault the message names. The job is
    dead-lettered, to be redriven once the cause is fixed, rather than stop the worker at the
    same offset on every restart."""

    reason = "internal_error"


class PoisonRecord(JobRejected):
    """The record killed the worker process ``processing.poison_max_attempts`` times (counted
    across processes and members in the offset commits' metadata: worker/loop/poison.py):
    dead-lettered by reference, unprocessed, to be redriven once the cause is fixed."""

    reason = "poison"


class OversizedMessage(JobRejected):
    """The Kafka record is larger than the configured maximum job size."""

    reason = "oversized"


class UnreadableHeaders(JobRejected):
    """The Kafka record's headers cannot be read (a header key that is not valid UTF-8, as Go,
    Rust or C clients can write): dead-lettered by reference, its headers left out."""

    reason = "bad_headers"


class Transient(WorkerError):
    """A downstream the task needs is unavailable for now (the blob store, a full disk, the
    device out of memory): retriable. The batch waits and runs again with a growing backoff,
    readiness off meanwhile; its jobs are never dead-lettered nor answered ``error`` for it
    (Kafka Connect's split: only what the record itself causes is permanent)."""

    recoverable = True


# errno values of a disk or a mount that is full or unavailable for now.
_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EBUSY,
                               errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET,
                               errno.EHOSTUNREACH, errno.ENETUNREACH})
# Texts of allocation failures from the runtimes (CUDA, cuDNN, onnxruntime, TensorRT).
_OUT_OF_MEMORY = ("out of memory", "failed to allocate", "cudaerrormemoryallocation",
                  "cuda_error_out_of_memory")
# Exception class names of object-store clients whose errors are outages, not the record's
# fault (botocore is optional: matched by name rather than imported).
_TRANSIENT_NAMES = frozenset({"EndpointConnectionError", "ConnectTimeoutError",
                              "ReadTimeoutError", "ConnectionClosedError", "OutOfMemoryError"})


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an outage to wait out rather than a
    failure of the job: see :class:`Transient`."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        # (Not MemoryError: a hostile image can cause it in the worker's own process; such a
        # job is isolated like any failure, worker.tasks.batched._isolate.)
        if isinstance(cur, Transient | TimeoutError | ConnectionError):
            return True
        if isinstance(cur, OSError) and cur.errno in _TRANSIENT_ERRNOS:
            return True
        if type(cur).__name__ in _TRANSIENT_NAMES:
            return True
        text = str(cur).lower()
        if any(t in text for t in _OUT_OF_MEMORY):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class KafkaIOError(WorkerError):
    """A Kafka operation failed. ``recoverable`` follows librdkafka's retriable flag; ``code``
    is librdkafka's error code where there is one."""

    def __init__(self, message: str, *, recoverable: bool = False, code: int | None = None
                 ) -> None:
        super().__init__(message)
        self.recoverable = recoverable
        self.code = code


class StaticMemberFenced(KafkaIOError):
    """The group coordinator fenced this static member: another member joined with the same
    ``group.instance.id``, or, after a group-coordinator failover, no one did (librdkafka
    issues 3437, 5456; seen in the cluster drill under exactly-once). The consumer client is
    unusable; :meth:`worker.loop.group.membership.Membership.fenced` decides whether a new one may
    rejoin or the process must stop."""


class DeliveryFailed(KafkaIOError):
    """A result or DLQ record could not be delivered after the client's own retries.

    Fatal for the loop: the source offset is never committed, so a restart reprocesses it.
    """


class TransactionError(KafkaIOError):
    """A transactional producer call failed; librdkafka's classification is kept.

    - ``recoverable`` (retriable): the same call may be repeated (e.g. a coordinator timeout);
    - ``abortable`` (txn_requires_abort): the open transaction is lost; abort it, rewind the
      consumer to the last committed positions and redo the work;
    - otherwise fatal (fenced by a newer instance with the same transactional.id, or an
      unexpected state): stop without committing anything more and let the orchestrator
      restart the process.
    """

    def __init__(self, message: str, *, code: int | None = None, recoverable: bool = False,
                 abortable: bool = False, fatal: bool = False) -> None:
        super().__init__(message, recoverable=recoverable and not fatal, code=code)
        self.abortable = abortable and not fatal
        self.fatal = fatal or not (self.recoverable or self.abortable)


class ProducerFenced(TransactionError):
    """Fatal: another producer with this worker's transactional.id took over (a newer
    instance), or the producer hit another fatal error. Exit non-zero; never commit again."""


class TaskLoopFailed(WorkerError):
    """One of the task loops of a process serving several tasks failed (its error is the
    cause); the others were stopped, draining and committing what they finished
    (:mod:`worker.loop.task_threads`). The process exits non-zero naming ``task``."""

    def __init__(self, task: str, error: BaseException) -> None:
        super().__init__(f"the {task} loop failed: {type(error).__name__}: {one_line(error)}")
        self.task = task
