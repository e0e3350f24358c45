"""`trt-worker produce`: send the images of a folder as moderation jobs."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack

from worker.config import WorkerConfig
from worker.exceptions import ConfigError, DeliveryFailed
from worker.kafka import Producer, producer_settings
from worker.wire.moderation_jobs import JOB_SCHEMAS
from worker.wire.records import Headers
from worker.wire.versions import V1

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp"})


@dataclass(frozen=True, slots=True)
class SentJob:
    id: str
    path: Path


def image_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ConfigError(f"not a folder: {folder}")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"no .jpg/.jpeg/.png/.webp files in {folder}")
    return files


def encode_job(job_id: str, image: bytes, *, text: str | None = None, policy: str | None = None,
               deadline_ms: int | None = None, version: int = V1) -> bytes:
    """A moderation job in contract ``version`` (v1 and v2 jobs have the same fields; the
    version picks the form of the result)."""
    doc: dict[str, object] = {"v": version, "id": job_id, "image": image}
    if text is not None:
        doc["text"] = text
    if policy is not None:
        doc["policy"] = policy
    if deadline_ms is not None:
        doc["deadline_ms"] = deadline_ms
    return msgpack.packb(doc, use_bin_type=True)


def _jobs(files: list[Path], count: int, prefix: str) -> Iterator[tuple[str, Path]]:
    for i in range(count):
        path = files[i % len(files)]
        yield f"{prefix}{i:06d}-{path.stem}", path


def produce_folder(
    cfg: WorkerConfig,
    folder: Path,
    *,
    topic: str | None = None,
    count: int | None = None,
    prefix: str = "job-",
    policy: str | None = None,
    deadline_in_ms: int | None = None,
    version: int = V1,
) -> list[SentJob]:
    """Produce ``count`` jobs (default: one per image) in contract ``version`` and wait until
    all are acknowledged."""
    files = image_files(folder)
    payloads = {p: p.read_bytes() for p in files}
    sent = [SentJob(job_id, path) for job_id, path in _jobs(files, count or len(files), prefix)]

    def records() -> Iterator[tuple[str, bytes]]:
        for job in sent:
            deadline = None
            if deadline_in_ms is not None:
                deadline = int(time.time() * 1e3) + deadline_in_ms
            yield job.id, encode_job(job.id, payloads[job.path], policy=policy,
                                     deadline_ms=deadline, version=version)

    send_jobs(cfg, topic or cfg.topics.jobs, records(), JOB_SCHEMAS[version])
    return sent


def send_jobs(cfg: WorkerConfig, topic: str, jobs: Iterable[tuple[str, bytes]],
              schema: str) -> int:
    """Produce ``jobs`` (key = job id, header ``ktw.schema``) and wait until every one is
    acknowledged; raise :class:`DeliveryFailed` otherwise."""
    producer = Producer(producer_settings(cfg))
    producer.open()
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    headers: Headers = [("ktw.schema", schema.encode())]
    n = 0
    for job_id, payload in jobs:
        producer.produce(topic, key=job_id.encode(), value=payload, headers=headers,
                         on_delivery=on_delivery)
        producer.poll(0)
        n += 1
    left = producer.close(60.0)
    if left or failures:
        raise DeliveryFailed(f"{left} undelivered, {len(failures)} failed: {failures[:3]}")
    return n
