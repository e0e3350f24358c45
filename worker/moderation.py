"""The moderation task: decode + preprocess on a CPU pool, score a batch, build results."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engines.backends.base import Runner
from engines.exceptions import InferenceFailed
from engines.models.open_nsfw import LABELS, MODEL_ID, open_nsfw_spec
from worker.config import WorkerConfig
from worker.dlq import SourceRecord
from worker.exceptions import ConfigError, JobRejected, UnknownPolicy
from worker.images import ImageLimits, decode_image, preprocess_open_nsfw
from worker.jobs import ModerationJob, ModerationResult, SourceRef, Status, Verdict
from worker.verdict import verdict_for


@dataclass(slots=True)
class Pending:
    """A consumed, decoded job waiting for its result."""

    ref: SourceRef
    job: ModerationJob
    consumed_at: float  # time.monotonic()
    record: SourceRecord


@dataclass(slots=True)
class Outcome:
    pending: Pending
    result: ModerationResult | None = None
    rejection: JobRejected | None = None


def build_runner(cfg: WorkerConfig) -> Runner:
    if cfg.model.backend == "onnxruntime":
        from engines.backends.onnxruntime import OrtRunner

        return OrtRunner(open_nsfw_spec(cfg.model.open_nsfw_onnx),
                         intra_op_threads=cfg.model.intra_op_threads)
    raise ConfigError(f"unknown backend {cfg.model.backend!r}")


class ModerationTask:
    """Turns batches of :class:`Pending` jobs into :class:`Outcome` futures without blocking."""

    def __init__(self, cfg: WorkerConfig, runner: Runner) -> None:
        self.cfg = cfg
        self.runner = runner
        self.model_id = MODEL_ID
        self._limits = ImageLimits(cfg.limits.max_image_pixels, cfg.limits.max_image_side)
        self._decode_pool = ThreadPoolExecutor(cfg.model.decode_threads,
                                               thread_name_prefix="decode")
        # One orchestrating thread per batch in flight; the runner serialises the compute.
        self._batch_pool = ThreadPoolExecutor(cfg.batch.max_in_flight_batches,
                                              thread_name_prefix="batch")

    @property
    def engine_hash(self) -> str:
        return self.runner.engine_hash

    def check_policy(self, job: ModerationJob) -> None:
        if job.policy not in self.cfg.model.policies:
            known = ", ".join(sorted(self.cfg.model.policies))
            raise UnknownPolicy(f"policy {job.policy!r} is not configured (known: {known})")

    def expired_result(self, p: Pending, now_ms: int) -> ModerationResult | None:
        deadline = p.job.deadline_ms
        if deadline is None or now_ms <= deadline:
            return None
        waited = (time.monotonic() - p.consumed_at) * 1e3
        return self._result(
            p, Status.EXPIRED, timings={"queue": waited, "total": waited},
            error=f"deadline {deadline} passed {now_ms - deadline} ms before the job reached "
                  "the engine",
        )

    def submit(self, batch: list[Pending]) -> Future[list[Outcome]]:
        return self._batch_pool.submit(self._run, batch)

    def close(self) -> None:
        self._batch_pool.shutdown(wait=True)
        self._decode_pool.shutdown(wait=True)

    def _prepare(self, p: Pending) -> np.ndarray | JobRejected:
        try:
            img = decode_image(p.job.image, self._limits)
        except JobRejected as exc:
            return exc
        return preprocess_open_nsfw(img, jpeg_roundtrip=self.cfg.model.jpeg_roundtrip)

    def _run(self, batch: list[Pending]) -> list[Outcome]:
        started = time.monotonic()
        prepared = list(self._decode_pool.map(self._prepare, batch))
        decoded = time.monotonic()
        outcomes: list[Outcome] = []
        good: list[tuple[Pending, np.ndarray]] = []
        for p, x in zip(batch, prepared, strict=True):
            if isinstance(x, JobRejected):
                outcomes.append(Outcome(p, rejection=x))
            else:
                good.append((p, x))
        if not good:
            return outcomes
        feeds = {"input:0": np.stack([x for _, x in good])}
        try:
            scores = self.runner.infer(feeds).result()["outputs"]
        except InferenceFailed as exc:
            for p, _ in good:
                outcomes.append(Outcome(p, result=self._result(p, Status.ERROR, error=str(exc))))
            return outcomes
        done = time.monotonic()
        for (p, _), row in zip(good, scores, strict=True):
            thresholds = self.cfg.model.policies[p.job.policy]
            named = {label: float(v) for label, v in zip(LABELS, row, strict=True)}
            timings = {
                "queue": (started - p.consumed_at) * 1e3,
                "decode": (decoded - started) * 1e3,
                "infer": (done - decoded) * 1e3,
                "total": (done - p.consumed_at) * 1e3,
            }
            verdict = verdict_for(named["nsfw"], thresholds)
            result = self._result(p, Status.OK, scores=named, timings=timings, verdict=verdict)
            outcomes.append(Outcome(p, result=result))
        return outcomes

    def _result(
        self,
        p: Pending,
        status: Status,
        *,
        scores: dict[str, float] | None = None,
        timings: dict[str, float] | None = None,
        error: str | None = None,
        verdict: Verdict | None = None,
    ) -> ModerationResult:
        return ModerationResult(
            id=p.job.id, status=status, policy=p.job.policy, model_id=self.model_id,
            engine_hash=self.engine_hash, scores=scores or {}, timings_ms=timings or {},
            error=error, source=p.ref, verdict=verdict,
        )

