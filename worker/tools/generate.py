"""`trt-worker generate`: send text-to-image jobs, optionally wait for their results.

Jobs are encoded (and validated against the contract) by
:func:`worker.wire.generation_codec.encode_generation_job` before anything is sent, so a malformed
request fails here rather than in the DLQ. Waiting reads the results and DLQ topics from their
ends as they were *before* the jobs were sent (``assign()`` at the high watermarks, no consumer
group, ``read_committed``), so no answer can be missed and no group offsets are touched.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import confluent_kafka as ck

from worker.config import WorkerConfig
from worker.exceptions import ConfigError, JobRejected
from worker.kafka import Consumer
from worker.kafka.admin import Admin
from worker.kafka.clients import reader_settings
from worker.kafka.headers import read_headers
from worker.tools.produce import send_jobs as send_records
from worker.tools.replay.headers import as_dict
from worker.wire.generation_codec import encode_generation_job
from worker.wire.generation_jobs import GENERATION_JOB_SCHEMAS, SEED_MODULUS
from worker.wire.moderation_codec import decode_result
from worker.wire.versions import V1


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What ``trt-worker generate`` sends: ``jobs`` jobs of ``num_images`` images each.

    ``None`` fields are left out of the job (the contract's defaults apply: 512x512, 30 steps,
    guidance 7.5, ddim, a seed derived from the job id). With a seed and several jobs, job j
    starts at ``seed + j * num_images`` so no two images share a seed.
    """

    prompt: str
    num_images: int | None = None
    negative_prompt: str | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    scheduler: str | None = None
    seed: int | None = None
    jobs: int = 1
    job_id: str | None = None  # one job: this id; several: the prefix of their ids
    deadline_in_ms: int | None = None
    version: int = V1  # contract version of the jobs (and so of their results)


def job_ids(req: GenerateRequest) -> list[str]:
    if req.job_id is not None and req.jobs == 1:
        return [req.job_id]
    prefix = req.job_id or f"gen-{uuid.uuid4().hex[:12]}"
    return [f"{prefix}-{j:04d}" for j in range(req.jobs)]


def build_jobs(req: GenerateRequest, now_ms: int | None = None) -> list[tuple[str, bytes]]:
    """``(job id, payload)`` per job; raises :class:`~worker.exceptions.JobRejected` if the
    request breaks the contract."""
    deadline = None
    if req.deadline_in_ms is not None:
        deadline = (int(time.time() * 1e3) if now_ms is None else now_ms) + req.deadline_in_ms
    out = []
    for j, job_id in enumerate(job_ids(req)):
        seed = None
        if req.seed is not None:
            seed = (req.seed + j * (req.num_images or 1)) % SEED_MODULUS
        out.append((job_id, encode_generation_job(
            job_id, req.prompt, negative_prompt=req.negative_prompt, width=req.width,
            height=req.height, steps=req.steps, guidance_scale=req.guidance_scale,
            scheduler=req.scheduler, seed=seed, num_images=req.num_images,
            deadline_ms=deadline, version=req.version)))
    return out


def send_generation_jobs(cfg: WorkerConfig, topic: str, jobs: Iterable[tuple[str, bytes]],
                         version: int = V1) -> int:
    """Produce ``jobs`` (key = job id, header ``ktw.schema`` of contract ``version``) and wait
    until every one is acknowledged."""
    return send_records(cfg, topic, jobs, GENERATION_JOB_SCHEMAS[version])


@dataclass(slots=True)
class Answers:
    """What came back for the awaited ids: result maps, and DLQ reasons of rejected jobs."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    arrived: dict[str, float] = field(default_factory=dict)  # id -> time.monotonic()
    dead: dict[str, str] = field(default_factory=dict)  # id -> "reason: message"

    def answered(self) -> set[str]:
        return set(self.results) | set(self.dead)


class AnswerReader:
    """Reads the results and DLQ topics from their current ends (open it before sending)."""

    def __init__(self, cfg: WorkerConfig, results_topic: str, dlq_topic: str | None) -> None:
        self.results_topic, self.dlq_topic = results_topic, dlq_topic
        self._consumer = Consumer(reader_settings(cfg, f"ktw-generate-{uuid.uuid4().hex[:12]}")
                                  | {"enable.partition.eof": False})
        try:
            admin = Admin(cfg, timeout=30.0)
            tps = []
            for topic in [t for t in (results_topic, dlq_topic) if t]:
                marks = admin.watermarks(topic, admin.partitions(topic))
                tps += [ck.TopicPartition(topic, p, high) for p, (_, high) in marks.items()]
            self._consumer.open()
            self._consumer.assign(tps)
        except BaseException:
            self._consumer.close()
            raise

    def wait(self, ids: set[str], timeout_s: float, answers: Answers | None = None) -> Answers:
        """Until every id in ``ids`` has a result or a DLQ record, or ``timeout_s`` passes."""
        out = answers or Answers()
        deadline = time.monotonic() + timeout_s
        while not ids <= out.answered() and time.monotonic() < deadline:
            for msg in self._consumer.consume(100, timeout=0.2):
                raw_key = msg.key()
                if msg.error() is not None or not isinstance(raw_key, bytes):
                    continue
                key = raw_key.decode("utf-8", "replace")
                if key not in ids:
                    continue
                if msg.topic() == self.results_topic:
                    out.results[key] = decode_result(msg.value() or b"")
                    out.arrived.setdefault(key, time.monotonic())
                else:
                    h = {k: v.decode("utf-8", "replace")
                         for k, v in as_dict(read_headers(msg)[0]).items()}
                    out.dead[key] = (f"{h.get('ktw.dlq.error.reason', '?')}: "
                                     f"{h.get('ktw.dlq.error.message', '')}")
        return out

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> AnswerReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def image_bytes(image: dict[str, Any], blob_root: Path) -> bytes | None:
    """An image's PNG: inline, or read from a local (``file://``) blob; None for other stores.

    A result is data from a topic: a ``file://`` URI is followed only to a PNG inside the
    configured local blob folder (``generation.blob.local_dir``, symlinks resolved), never to
    any other file this user can read (``/etc/...``, ``~/.ssh/...``)."""
    if image.get("png") is not None:
        return bytes(image["png"])
    uri = (image.get("blob") or {}).get("uri", "")
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    try:
        path = Path(unquote(parsed.path)).resolve()
        if not path.is_relative_to(blob_root.resolve()):
            return None
        with path.open("rb") as f:
            data = f.read()
    except OSError:  # the worker's local store is on another machine
        return None
    return data if data.startswith(PNG_MAGIC) else None


def save_images(result: dict[str, Any], out_dir: Path, blob_root: Path) -> list[str]:
    """Write a result's images as ``<id>-<index>-<seed>.png``; returns one line per image."""
    out_dir.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(result["id"]))[:80]
    lines = []
    for im in result.get("images", []):
        data = image_bytes(im, blob_root)
        if data is None:
            lines.append(f"  image {im['index']} (seed {im['seed']}): {im['blob']['uri']}")
            continue
        path = out_dir / f"{safe}-{im['index']}-{im['seed']}.png"
        path.write_bytes(data)
        lines.append(f"  image {im['index']} (seed {im['seed']}): {path}")
    return lines


def _describe(req: GenerateRequest) -> str:
    parts = [f"{req.num_images or 1} image(s)"]
    if req.width or req.height:
        parts.append(f"{req.width or 512}x{req.height or 512}")
    if req.steps:
        parts.append(f"{req.steps} steps")
    if req.scheduler:
        parts.append(req.scheduler)
    if req.seed is not None:
        parts.append(f"seed {req.seed}")
    return ", ".join(parts)


def run_generate(cfg: WorkerConfig, req: GenerateRequest, *, topic: str | None, wait: bool,
                 out_dir: Path | None, timeout_s: float, echo: Callable[[str], Any]) -> bool:
    """The ``generate`` command: send, then (``wait``) print each answer and save its images.

    True when every job was sent and, if waited for, answered ``ok`` in time.
    """
    try:
        jobs = build_jobs(req)
    except JobRejected as exc:
        raise ConfigError(f"invalid generation job: {exc}") from exc
    topics = cfg.generation.topics
    jobs_topic = topic or topics.jobs
    reader = AnswerReader(cfg, topics.results, topics.dlq) if wait else None
    try:
        send_generation_jobs(cfg, jobs_topic, jobs, req.version)
        echo(f"sent {len(jobs)} job(s) ({_describe(req)}) to {jobs_topic}: "
             f"{', '.join(i for i, _ in jobs[:5])}{' ...' if len(jobs) > 5 else ''}")
        if reader is None:
            return True
        ids = {i for i, _ in jobs}
        answers = reader.wait(ids, timeout_s)
    finally:
        if reader is not None:
            reader.close()
    ok = True
    for job_id, _ in jobs:
        if job_id in answers.dead:
            echo(f"{job_id}: dead-lettered: {answers.dead[job_id]}")
            ok = False
            continue
        result = answers.results.get(job_id)
        if result is None:
            echo(f"{job_id}: no answer on {topics.results} within {timeout_s:.0f} s")
            ok = False
            continue
        total = result.get("timings_ms", {}).get("total", 0.0)
        note = " (RANDOM weights: noise)" if result.get("random_weights") else ""
        echo(f"{job_id}: {result['status']}, {len(result.get('images', []))} image(s), "
             f"{total:.0f} ms{note}" + (f": {result['error']}" if result.get("error") else ""))
        ok = ok and result["status"] == "ok"
        if out_dir is not None:
            for line in save_images(result, out_dir, cfg.generation.blob.local_dir):
                echo(line)
    return ok
