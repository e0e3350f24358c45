"""open_nsfw moderation: decode + preprocess on a CPU pool, score a batch, build results.

:class:`OpenNsfwTask` is the task a worker serves when no ``[moderation.policies]`` are
configured (the fast path: one batcher in front of the open_nsfw engine), and the engine code
behind the open_nsfw plug-in of image-and-text moderation
(:mod:`worker.tasks.moderation.models.open_nsfw`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import structlog

from engines.backends.base import Runner
from engines.exceptions import InferenceFailed
from engines.models.open_nsfw import LABELS
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec
from worker.bundled import samples_dir
from worker.config import WorkerConfig
from worker.exceptions import (
    JobRejected,
    NothingToScore,
    TaskFailed,
    Transient,
    UnknownPolicy,
    is_transient,
    one_line,
)
from worker.tasks.batched import BatchedTask, QueuedJob, sticky_device_error
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images.budgets import guard_for
from worker.tasks.moderation.images.cpu import (
    CROP,
    RESIZE,
    ImageLimits,
    decode_image,
    decode_views,
    preprocess_open_nsfw,
)
from worker.tasks.moderation.scoring.verdict import OPEN_NSFW_RULES, verdict_for
from worker.tasks.protocol import source_ref
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, encode_result
from worker.wire.moderation_jobs import (
    RESULT_SCHEMAS,
    ModerationJob,
    ModerationResult,
    Status,
    Verdict,
)
from worker.wire.records import Headers, SourceRecord, SourceRef
from worker.wire.versions import V1

NSFW = LABELS.index("nsfw")  # the score a job's worst view is picked by
OPEN_NSFW = "open_nsfw"  # the model's name in image-and-text policies (and in contract v2)
_QUALIFIED = {label: f"{OPEN_NSFW}.{label}" for label in LABELS}
log = structlog.get_logger("worker")


@dataclass(slots=True)
class Pending(QueuedJob):
    """A consumed, decoded job waiting for its result."""

    ref: SourceRef
    job: ModerationJob
    consumed_at: float  # time.monotonic()
    record: SourceRecord
    # The source partition's epoch at intake (worker.loop.worker): an answer whose partition was
    # revoked, lost or rewound since is stale and discarded.
    epoch: int = 0

    # The batcher's view of a job (worker.tasks.batcher.Batchable): QueuedJob and this.
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


def moderation_headers(model_id: str, engine_hash: str, version: int) -> Headers:
    """The headers of a moderation result on the results topic, in contract ``version``."""
    return [("ktw.schema", RESULT_SCHEMAS[version].encode()), ("ktw.model", model_id.encode()),
            ("ktw.engine", engine_hash.encode())]


def as_open_nsfw_policy(result: ModerationResult) -> ModerationResult:
    """An open_nsfw-only result as an image-and-text policy running open_nsfw alone gives it,
    contract v2's one shape: scores keyed ``open_nsfw.<label>``, the rule that decided
    (:data:`OPEN_NSFW_RULES`) and ``models`` ``("open_nsfw",)``. A result not ok is returned as
    it is: it has no scores, no rule and no models (the v2 encoder writes ``rule: "none"``).

    Done when a v2 result is encoded, not when it is made: the open_nsfw plug-in of the
    image-and-text task reads the plain labels of the results it gets from this task."""
    r, verdict = result, result.verdict
    if r.status is not Status.OK or verdict is None:  # ok without a verdict: the encoder says
        return r
    return ModerationResult(
        id=r.id, status=r.status, policy=r.policy, model_id=r.model_id,
        engine_hash=r.engine_hash, verdict=verdict,
        scores={_QUALIFIED[label]: v for label, v in r.scores.items()},
        timings_ms=r.timings_ms, error=r.error, source=r.source,
        rule=OPEN_NSFW_RULES[verdict], models=(OPEN_NSFW,), schema_version=r.schema_version)


class OpenNsfwTask(BatchedTask[Pending]):
    """Turns batches of :class:`Pending` jobs into :class:`Outcome` futures without blocking.

    ``profiles``: the engine's (what :meth:`warm_up` runs and the batcher batches for);
    ``own_runner``: :meth:`close` deactivates the runner (False: a runner shared with the
    caller stays active)."""

    def __init__(self, cfg: WorkerConfig, runner: Runner, spec: EngineSpec,
                 profiles: tuple[Profile, ...] = (), *, own_runner: bool = False) -> None:
        self.cfg = cfg
        self.runner = runner
        self.model_id = spec.model_id
        self.profiles = profiles
        self._own_runner = own_runner
        self._decode_limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        self._headers: dict[int, Headers] = {}  # by contract version
        self.input_name, self.output_name = spec.inputs[0].name, spec.outputs[0].name
        self._limits = ImageLimits(cfg.limits.max_image_pixels, cfg.limits.max_image_side,
                                   guard_for(cfg))
        self._decode_pool = ThreadPoolExecutor(cfg.model.decode_threads,
                                               thread_name_prefix="decode")
        # One orchestrating thread per batch in flight; the runner serialises the compute.
        self._batch_pool = ThreadPoolExecutor(cfg.batch.max_in_flight_batches,
                                              thread_name_prefix="batch")

    @property
    def engine_hash(self) -> str:
        return self.runner.engine_hash

    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float
               ) -> Pending:
        job = decode_moderation_job(value, self._decode_limits)
        self.check_policy(job)
        return Pending(source_ref(record), job, consumed_at, record, epoch)

    def encode(self, result: ModerationResult) -> tuple[bytes, Headers]:
        # Every result of one contract version carries the same headers: built once per
        # version (after warm-up: the engine hash is the loaded artifact's).
        version = result.schema_version
        headers = self._headers.get(version)
        if headers is None:
            headers = self._headers[version] = moderation_headers(
                self.model_id, self.engine_hash, version)
        if version != V1:
            result = as_open_nsfw_policy(result)
        return encode_result(result), headers

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

    def warm_up(self, profiles: tuple[Profile, ...] | None = None) -> None:
        """Activate the runner and run every batch size the batcher can produce once (of
        ``profiles``, default the task's), on a real bundled photo, so the first jobs do not
        pay for lazy allocations (ORT's arena, cuDNN's kernel choice)."""
        self.runner.activate()
        row = preprocess_open_nsfw(decode_image((samples_dir() / "coffee.png").read_bytes()))
        cap = self.cfg.batch.max_batch_size
        sizes: set[int] = set()
        for p in self.profiles if profiles is None else profiles:
            if isinstance(p, StaticProfile):
                sizes.update(b for b in p.batch_sizes if b <= p.padded(min(cap, p.max_batch)))
            else:
                sizes.add(min(cap, p.max_batch))
        for n in sorted(sizes):
            self.runner.infer({self.input_name: np.stack([row] * n)}).result()

    def ready(self) -> bool:
        """True once warm-up is done and batches run at full speed."""
        return self.runner.active

    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]:
        return self._batch_pool.submit(self._run, batch)

    def close(self) -> None:
        try:
            self._stop()
        finally:
            if self._own_runner:
                self.runner.deactivate()

    def _stop(self) -> None:
        """Wait for the batches in flight and stop the pools (the runner is left as it is)."""
        self._batch_pool.shutdown(wait=True)
        self._decode_pool.shutdown(wait=True)

    def _prepare(self, p: Pending) -> np.ndarray | JobRejected:
        """The job's rows: one per view a person may be shown (decode_views: orientation,
        alpha on white and on black, sampled animation frames); the job scores its worst."""
        if p.job.image is None:  # check_policy refuses these at intake; never crash on one
            return no_image(p.job)
        try:
            views = decode_views(p.job.image, self._limits, draft_side=RESIZE
                                 if self.cfg.moderation.jpeg_dct_scaling else None)
        except JobRejected as exc:
            return exc
        roundtrip = self.cfg.model.jpeg_roundtrip
        return np.stack([preprocess_open_nsfw(v, jpeg_roundtrip=roundtrip) for v in views])

    def _infer_chunks(self, rows: list[np.ndarray], profile: Profile
                      ) -> tuple[np.ndarray, dict[int, str]]:
        """Scores for ``rows`` (one row each) and the rows that failed with why.

        Engine calls take at most the profile's largest batch (a batch's jobs can bring more
        rows than jobs: several views each). A call that fails is halved and retried (an out
        of memory on a large batch), down to the one row that keeps failing, so one bad input
        fails its own job, not the batch: that job is dead-lettered (``internal_error``), never
        answered ``error`` (a consumer that fails open would publish it unmoderated). A row
        still out of memory alone is an outage, not the job's fault: it is raised, and the
        batch waits and runs again (worker.tasks.batched). A CUDA error other than out of
        memory is sticky (every later call fails): it is raised, which stops the worker
        without committing those jobs."""
        out = np.full((len(rows), len(LABELS)), np.nan, dtype=np.float32)
        failed: dict[int, str] = {}
        step = profile.max_batch
        spans = [(lo, min(lo + step, len(rows))) for lo in range(0, len(rows), step)][::-1]
        while spans:
            lo, hi = spans.pop()
            chunk = rows[lo:hi]
            # Static profiles run fixed batch sizes: repeat a real row as padding.
            chunk += [chunk[0]] * (profile.padded(len(chunk)) - len(chunk))
            try:
                scores = self.runner.infer({self.input_name: np.stack(chunk)}).result()
            except InferenceFailed as exc:
                why = one_line(exc)
                if sticky_device_error(why):
                    raise
                if hi - lo == 1:
                    if is_transient(exc):
                        raise
                    failed[lo] = why
                    continue
                log.warning("batch_split_after_failure", rows=hi - lo, error=why)
                mid = (lo + hi) // 2
                spans += [(mid, hi), (lo, mid)]
                continue
            out[lo:hi] = scores[self.output_name][: hi - lo]
        if len(rows) > 1 and len(failed) == len(rows):
            # Every row failed alone: the engine, not an input, is at fault (nothing to pin on
            # one job). Waited out like any outage rather than dead-lettering the batch.
            raise Transient(f"the engine failed on every row of the batch: {failed[0]}")
        return out, failed

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
        rows = [row for _, views in good for row in views]
        all_scores, failed = self._infer_chunks(rows, batch.profile)
        done = time.monotonic()
        scored: list[tuple[Pending, np.ndarray]] = []
        at = 0
        for p, views in good:  # each job's worst view: the highest nsfw score
            errors = [failed[i] for i in range(at, at + len(views)) if i in failed]
            if errors:
                outcomes.append(Outcome(p, rejection=TaskFailed(
                    f"the engine failed on this job alone: {errors[0]}")))
            else:
                mine = all_scores[at:at + len(views)]
                scored.append((p, mine[int(np.argmax(mine[:, NSFW]))]))
            at += len(views)
        for p, row in scored:
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
            error=error, source=p.ref, verdict=verdict, schema_version=p.job.schema_version,
        )

