"""The moderation task: decode + preprocess on a CPU pool, score a batch, build results."""

from __future__ import annotations

import importlib.resources
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engines.backends.base import Runner
from engines.exceptions import InferenceFailed
from engines.models.open_nsfw import LABELS
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec
from worker.config import WorkerConfig
from worker.exceptions import JobRejected, NothingToScore, UnknownPolicy
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images import CROP, ImageLimits, decode_image, preprocess_open_nsfw
from worker.tasks.moderation.verdict import verdict_for
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.records import SourceRecord, SourceRef


@dataclass(slots=True)
class Pending:
    """A consumed, decoded job waiting for its result."""

    ref: SourceRef
    job: ModerationJob
    consumed_at: float  # time.monotonic()
    record: SourceRecord
    # The source partition's epoch at intake (worker.loop.worker): an answer whose partition was
    # revoked, lost or rewound since is stale and discarded.
    epoch: int = 0

    # The batcher's view of a job (worker.tasks.batcher.Batchable).
    @property
    def deadline_ms(self) -> int | None:
        return self.job.deadline_ms

    @property
    def partition_key(self) -> tuple[str, int]:
        return (self.ref.topic, self.ref.partition)

    @property
    def item_shape(self) -> tuple[int, ...]:
        return IMAGE_ITEM_SHAPE


@dataclass(slots=True)
class Outcome:
    pending: Pending
    result: ModerationResult | None = None
    rejection: JobRejected | None = None


# Every image is preprocessed to the model's fixed input, so all image jobs share one shape.
IMAGE_ITEM_SHAPE = (CROP, CROP, 3)


def no_image(job: ModerationJob) -> NothingToScore:
    """The rejection of a text-only job on the open_nsfw path: it has nothing to score."""
    return NothingToScore(f"policy {job.policy!r} runs open_nsfw only and the job has no "
                          "image: nothing to score")


class ModerationTask:
    """Turns batches of :class:`Pending` jobs into :class:`Outcome` futures without blocking."""

    def __init__(self, cfg: WorkerConfig, runner: Runner, spec: EngineSpec) -> None:
        self.cfg = cfg
        self.runner = runner
        self.model_id = spec.model_id
        self.input_name, self.output_name = spec.inputs[0].name, spec.outputs[0].name
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
        """Intake check: the policy is configured, and the job has an image to score."""
        if job.policy not in self.cfg.model.policies:
            known = ", ".join(sorted(self.cfg.model.policies))
            raise UnknownPolicy(f"policy {job.policy!r} is not configured (known: {known})")
        if job.image is None:
            raise no_image(job)

    def expired_result(self, p: Pending, now_ms: int) -> ModerationResult:
        """The answer for a job the batcher found past its deadline (never sent to the engine)."""
        deadline = p.job.deadline_ms or 0
        waited = (time.monotonic() - p.consumed_at) * 1e3
        return self._result(
            p, Status.EXPIRED, timings={"queue": waited, "total": waited},
            error=f"deadline {deadline} passed {now_ms - deadline} ms before the job reached "
                  "the engine",
        )

    def warm_up(self, profiles: tuple[Profile, ...]) -> None:
        """Run every batch size the batcher can produce once, on a real bundled photo, so the
        first jobs do not pay for lazy allocations (ORT's arena, cuDNN's kernel choice)."""
        sample = importlib.resources.files("worker").joinpath("samples", "coffee.png")
        row = preprocess_open_nsfw(decode_image(sample.read_bytes()))
        cap = self.cfg.batch.max_batch_size
        sizes: set[int] = set()
        for p in profiles:
            if isinstance(p, StaticProfile):
                sizes.update(b for b in p.batch_sizes if b <= p.padded(min(cap, p.max_batch)))
            else:
                sizes.add(min(cap, p.max_batch))
        for n in sorted(sizes):
            self.runner.infer({self.input_name: np.stack([row] * n)}).result()

    def pipeline_ready(self) -> bool:
        """True once warm-up is done and batches run at full speed."""
        return self.runner.active

    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]:
        return self._batch_pool.submit(self._run, batch)

    def close(self) -> None:
        self._batch_pool.shutdown(wait=True)
        self._decode_pool.shutdown(wait=True)

    def _prepare(self, p: Pending) -> np.ndarray | JobRejected:
        if p.job.image is None:  # check_policy refuses these at intake; never crash on one
            return no_image(p.job)
        try:
            img = decode_image(p.job.image, self._limits)
        except JobRejected as exc:
            return exc
        return preprocess_open_nsfw(img, jpeg_roundtrip=self.cfg.model.jpeg_roundtrip)

    def _run(self, batch: Batch[Pending]) -> list[Outcome]:
        started = time.monotonic()
        prepared = list(self._decode_pool.map(self._prepare, batch.items))
        decoded = time.monotonic()
        outcomes: list[Outcome] = []
        good: list[tuple[Pending, np.ndarray]] = []
        for p, x in zip(batch.items, prepared, strict=True):
            if isinstance(x, JobRejected):
                outcomes.append(Outcome(p, rejection=x))
            else:
                good.append((p, x))
        if not good:
            return outcomes
        rows = [x for _, x in good]
        # Static profiles run fixed batch sizes: repeat a real row as padding (outputs dropped).
        rows += [rows[0]] * (batch.profile.padded(len(rows)) - len(rows))
        feeds = {self.input_name: np.stack(rows)}
        try:
            scores = self.runner.infer(feeds).result()[self.output_name][: len(good)]
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

