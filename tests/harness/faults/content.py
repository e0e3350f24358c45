"""What a fault run's outputs say about their jobs, record by record: each result names its job
(key, ``ce_subject`` and the payload's ``id``), its ``ce_id`` is the offset of a job with that
key, each dead letter's source headers point at a record with its key, and per source
partition the outputs appear in offset order.

Order is read within each results partition (records of one job partition hashed there, by
key): exactly-once promises offset order per partition inside a transaction and read_committed
shows only committed transactions, so an inversion there is a fault. At-least-once makes no
order promise; a restart repeats the tail from the committed offset, so offsets step back
there. Its figures count inversions of *first* appearances too (a job answered for the first
time after a later one of its partition), which say whether outputs left in offset order."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka as ck

from worker.kafka.headers import read_headers
from worker.wire.moderation_codec import decode_result

SAMPLE = 5  # examples of each kind of fault kept in the figures


def _text(key: bytes | None) -> str | None:
    """A key as the worker writes it into ``ce_subject`` (bytes that are not UTF-8 escaped)."""
    return None if key is None else key.decode("utf-8", "backslashreplace")


def _headers(msg: ck.Message) -> dict[str, str]:
    pairs = read_headers(msg)[0] or []
    return {k: (v or b"").decode("utf-8", "replace") for k, v in pairs}


def _ce_id(text: str, topic: str) -> tuple[int, int] | None:
    prefix = f"{topic}-"
    if not text.startswith(prefix):
        return None
    part, _, offset = text[len(prefix):].rpartition("-")
    return (int(part), int(offset)) if part.isdigit() and offset.isdigit() else None


def note_job(index: dict[tuple[int, int], str | None], job: ck.Message) -> None:
    """Add a job's key to ``index`` by (partition, offset): all the audit needs of it."""
    index[(int(job.partition() or 0), int(job.offset() or 0))] = _text(job.key())


def job_keys(jobs: Iterable[ck.Message]) -> dict[tuple[int, int], str | None]:
    """Each job's key by (partition, offset)."""
    index: dict[tuple[int, int], str | None] = {}
    for job in jobs:
        note_job(index, job)
    return index


def content_audit(jobs: Mapping[tuple[int, int], str | None], results: list[ck.Message],
                  dlq: list[ck.Message], jobs_topic: str) -> dict[str, Any]:
    """Record-by-record checks of ``results`` and ``dlq`` (each read in partition order)
    against the jobs they answer (:func:`job_keys`)."""
    job_at = jobs
    wrong: collections.Counter[str] = collections.Counter()
    samples: dict[str, list[str]] = collections.defaultdict(list)

    def fault(kind: str, detail: str) -> None:
        wrong[kind] += 1
        if len(samples[kind]) < SAMPLE:
            samples[kind].append(detail)

    # (results partition, jobs partition) -> offsets in the order they appear
    seq: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for m in results:
        key = _text(m.key())
        h = _headers(m)
        src = _ce_id(h.get("ce_id", ""), jobs_topic)
        if src is None:
            fault("ce_id_unreadable", f"{key}: {h.get('ce_id')!r}")
            continue
        if job_at.get(src) != key:
            fault("ce_id_not_its_job", f"{key}: ce_id {src} holds {job_at.get(src)!r}")
        if h.get("ce_subject") != key:
            fault("ce_subject_not_key", f"{key}: {h.get('ce_subject')!r}")
        try:
            payload = decode_result(m.value())
        except Exception as exc:  # noqa: BLE001 - any undecodable result is a finding
            fault("payload_unreadable", f"{key}: {exc}")
            continue
        if payload.get("id") != key:
            fault("payload_id_not_key", f"{key}: id {payload.get('id')!r}")
        named = payload.get("source")  # where set, the payload names its job too
        if named and (named.get("topic"), named.get("partition"), named.get("offset")) != (
                jobs_topic, *src):
            fault("payload_source_not_ce_id", f"{key}: source {named}, ce_id {src}")
        seq[(int(m.partition() or 0), src[0])].append(src[1])
    for m in dlq:
        key = _text(m.key())
        h = _headers(m)
        try:
            src = (int(h["ktw.dlq.source.partition"]), int(h["ktw.dlq.source.offset"]))
        except (KeyError, ValueError):
            fault("dlq_source_unreadable", f"{key}")
            continue
        if h.get("ktw.dlq.source.topic") != jobs_topic or job_at.get(src) != key:
            fault("dlq_source_not_its_job", f"{key}: source {src} holds {job_at.get(src)!r}")
    inversions = first_inversions = 0
    for (rp, jp), offsets in seq.items():
        high, seen = -1, set()
        for off in offsets:
            if off < high:
                inversions += 1
                if off not in seen:
                    first_inversions += 1
                    if len(samples["first_out_of_order"]) < SAMPLE:
                        samples["first_out_of_order"].append(
                            f"results[{rp}] jobs[{jp}]: offset {off} after {high}")
            high = max(high, off)
            seen.add(off)
    return {"content_faults": dict(wrong), "order_inversions": inversions,
            "first_answer_inversions": first_inversions,
            "content_samples": {k: v for k, v in samples.items() if v}}
