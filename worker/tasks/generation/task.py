"""The generation task: intake checks, then batches -> text encoding, denoising, VAE, PNG.

A :class:`worker.tasks.batched.BatchedTask`, like moderation
(:class:`worker.tasks.moderation.task.ModerationTask`): ``decode``/``pending`` validate at
intake and raise :class:`~worker.exceptions.JobRejected` subclasses (the loop dead-letters
them), ``submit(batch)`` returns a future of outcomes without blocking the poll loop,
``warm_up`` and ``close``. Batches come from the dynamic batcher, one per resolution
(``batcher_profiles``); inside a batch, jobs of the same step count share UNet batches.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engines.exceptions import BackendUnavailable
from engines.models.sd.engines import SdEngines
from engines.profiles import RangeProfile
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError, JobRejected, one_line
from worker.tasks.batched import BatchedTask, QueuedJob
from worker.tasks.batcher import Batch
from worker.tasks.generation import sampler
from worker.tasks.generation.blobs import BlobStore
from worker.tasks.generation.intake import IntakeRules
from worker.tasks.generation.png import encode_png
from worker.tasks.generation.results import fit_result, images_for
from worker.tasks.generation.schedulers import make_schedule
from worker.tasks.protocol import source_ref
from worker.wire.generation_codec import decode_generation_job, encode_generation_result
from worker.wire.generation_jobs import (
    GENERATION_RESULT_SCHEMAS,
    GeneratedImage,
    GenerationJob,
    GenerationResult,
)
from worker.wire.moderation_jobs import Status
from worker.wire.records import Headers, SourceRecord, SourceRef


@dataclass(slots=True)
class GenerationPending(QueuedJob):
    ref: SourceRef
    job: GenerationJob
    consumed_at: float  # time.monotonic()
    record: SourceRecord | None
    latent_shape: tuple[int, ...]
    # The source partition's epoch at intake (see worker.tasks.moderation.parts.Pending).
    epoch: int = 0

    # The batcher's view (worker.tasks.batcher.Batchable): QueuedJob and this, one queue per
    # resolution.
    @property
    def item_shape(self) -> tuple[int, ...]:
        return self.latent_shape


@dataclass(slots=True)
class GenerationOutcome:
    pending: GenerationPending
    result: GenerationResult | None = None
    rejection: JobRejected | None = None


class GenerationTask(BatchedTask[GenerationPending]):
    def __init__(self, settings: GenerationSettings, engines: SdEngines, blobs: BlobStore, *,
                 max_in_flight_batches: int = 2, max_jobs_per_batch: int = 8,
                 own_engines: bool = True) -> None:
        self.settings, self.engines, self.blobs = settings, engines, blobs
        self._own_engines = own_engines  # False: engines shared with others stay loaded
        self.rules = IntakeRules(frozenset((s.width, s.height) for s in settings.sizes),
                                 settings.min_steps, settings.max_steps,
                                 settings.max_images_per_job)
        self.max_jobs_per_batch = max_jobs_per_batch
        self._png_pool = ThreadPoolExecutor(settings.png_threads, thread_name_prefix="png")
        self._batch_pool = ThreadPoolExecutor(max_in_flight_batches, thread_name_prefix="gen")
        # One batch at a time on the engines: their CUDA graphs share one memory pool and
        # per-shape slots, which must never be replayed concurrently (two batches did so on the
        # H200 and hung at 100% GPU). PNG encoding of one batch still overlaps the next batch's
        # GPU work, which is what several batches in flight buy here.
        self._engines_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self.engines.model_id

    @property
    def engine_hash(self) -> str:
        hashes = self.engines.engine_hashes()
        return ",".join(f"{k}={v}" for k, v in sorted(hashes.items()))

    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float
               ) -> GenerationPending:
        p = self.pending(value, source_ref(record), record, consumed_at)
        p.epoch = epoch
        return p

    def encode(self, result: GenerationResult) -> tuple[bytes, Headers]:
        headers: Headers = [*self.headers(result)]
        return self.encode_result(result), headers

    def headers(self, result: GenerationResult) -> list[tuple[str, bytes]]:
        return [("ktw.schema", GENERATION_RESULT_SCHEMAS[result.schema_version].encode()),
                ("ktw.model", result.model_id.encode()),
                ("ktw.engine", result.engine_hashes.get("unet", "").encode())]

    def encode_result(self, result: GenerationResult) -> bytes:
        return encode_generation_result(result)

    def decode(self, payload: bytes) -> GenerationJob:
        job = decode_generation_job(payload)
        self.rules.check(job)
        return job

    def pending(self, payload: bytes, ref: SourceRef, record: SourceRecord | None = None,
                consumed_at: float | None = None) -> GenerationPending:
        job = self.decode(payload)
        return GenerationPending(ref, job, time.monotonic() if consumed_at is None
                                 else consumed_at, record,
                                 self.engines.dims.latent_shape(job.width, job.height))

    def batcher_profiles(self) -> tuple[RangeProfile, ...]:
        """One batcher queue per resolution; no padding at this level (the task pads rows)."""
        out = []
        for res, unet in self.engines.profiles.unet.items():
            item = unet.item_shape
            out.append(RangeProfile(f"gen-{res.name}", item, item, item, 1,
                                    self.max_jobs_per_batch, self.max_jobs_per_batch))
        return tuple(out)

    def expired_result(self, p: GenerationPending, now_ms: int) -> GenerationResult:
        waited = (time.monotonic() - p.consumed_at) * 1e3
        deadline = p.job.deadline_ms or 0
        return self._result(p, Status.EXPIRED, timings={"queue": waited, "total": waited},
                            error=f"deadline {deadline} passed {now_ms - deadline} ms before "
                                  "the job reached the engines")

    def warm_up(self) -> None:
        """Load the engines; with ``warm_up = "all_shapes"`` (``auto`` on CUDA) also run every
        static shape once (CUDA graphs are captured here, else on each shape's first use).

        A backend this machine cannot run is a ConfigError naming the settings to change: the
        cause is the configuration, and the command line reports it as one line."""
        g = self.settings
        try:
            self.engines.activate()
            if g.warm_up == "first_use" or (g.warm_up == "auto" and not g.on_cuda):
                return
            for runner in self.engines.runners.values():
                warm = getattr(runner, "warm_up", None)
                if callable(warm):
                    warm()
        except BackendUnavailable as exc:
            raise ConfigError(
                f"generation.backend = {g.backend!r} on generation.device = {g.device!r} "
                f"cannot run here: {one_line(exc)}: change generation.backend, "
                "generation.device or generation.precision") from exc

    def submit(self, batch: Batch[GenerationPending]) -> Future[list[GenerationOutcome]]:
        self.engines.activate()  # no-op once active; here on the loop's thread, never racing
        return self._batch_pool.submit(self._run, batch)

    def close(self) -> None:
        self._batch_pool.shutdown(wait=True)
        self._png_pool.shutdown(wait=True)
        if self._own_engines:
            self.engines.deactivate()

    def _run(self, batch: Batch[GenerationPending]) -> list[GenerationOutcome]:
        items = batch.items
        started = time.monotonic()
        # An engine failure is raised, never answered "error": out of memory waits and runs
        # again (an outage), anything else is split down to the job that fails alone, which
        # is dead-lettered (worker.tasks.batched).
        stamps, pngs = self._generate(items, started)
        outcomes = []
        for pos, p in enumerate(items):
            timings = {"queue": (started - p.consumed_at) * 1e3, **stamps,
                       "total": (time.monotonic() - p.consumed_at) * 1e3}
            seeds = [p.job.image_seed(i) for i in range(p.job.num_images)]
            images = images_for(pngs, pos, seeds, p.job.width, p.job.height)
            result = self._result(p, Status.OK, timings=timings, images=images)
            fitted = fit_result(result, self.settings.results_max_bytes, self.blobs,
                                time.monotonic)
            outcomes.append(GenerationOutcome(p, fitted))
        return outcomes

    def _generate(self, items: list[GenerationPending], started: float
                  ) -> tuple[dict[str, float], dict[tuple[int, int], bytes]]:
        e = self.engines
        with self._engines_lock:
            gpu_start = time.monotonic()
            texts = sorted({t for p in items for t in (p.job.prompt, p.job.negative_prompt)})
            emb = sampler.encode_texts(e.runners["text_encoder"], e.profiles.text,
                                       e.tokenizer(texts))
            row_of = {t: emb[i] for i, t in enumerate(texts)}
            encoded = time.monotonic()
            chunks = self._chunks(items, row_of)
            vae_profiles = {v.item_shape: v for v in e.profiles.vae.values()}
            sampler.denoise(e.runners["unet"], e.runners["vae"], chunks, vae_profiles)
            denoised = time.monotonic()
            pixels = {row.tag: px for c in chunks
                      for row, px in zip(c.rows, sampler.images_of(c), strict=True)}
            decoded = time.monotonic()
        level = self.settings.png_compress_level
        futures = {tag: self._png_pool.submit(encode_png, px, level) for tag, px in pixels.items()}
        pngs = {tag: f.result() for tag, f in futures.items()}
        done = time.monotonic()
        stamps = {"engines_wait": gpu_start - started, "text": encoded - gpu_start,
                  "denoise": denoised - encoded,
                  "vae": decoded - denoised, "png": done - decoded}
        return {k: v * 1e3 for k, v in stamps.items()}, pngs

    def _chunks(self, items: list[GenerationPending], emb: dict[str, np.ndarray]
                ) -> list[sampler.DenoiseChunk]:
        groups: dict[tuple[tuple[int, ...], int], list[sampler.RowSpec]] = {}
        for pos, p in enumerate(items):
            j = p.job
            schedule = make_schedule(j.scheduler, j.steps)
            for i in range(j.num_images):
                groups.setdefault((p.latent_shape, j.steps), []).append(sampler.RowSpec(
                    (pos, i), j.image_seed(i), schedule, j.guidance_scale, emb[j.prompt],
                    emb[j.negative_prompt]))
        unets = {u.item_shape: u for u in self.engines.profiles.unet.values()}
        chunks = []
        for (shape, _), rows in groups.items():
            unet = unets[shape]
            per = unet.max_batch // 2
            chunks += [sampler.DenoiseChunk(rows[i:i + per], shape, unet)
                       for i in range(0, len(rows), per)]
        return chunks

    def _result(self, p: GenerationPending, status: Status, *,
                timings: dict[str, float] | None = None, error: str | None = None,
                images: tuple[GeneratedImage, ...] = ()) -> GenerationResult:
        return GenerationResult(
            id=p.job.id, status=status, model_id=self.model_id,
            engine_hashes=self.engines.engine_hashes(), random_weights=self.engines.random_weights,
            images=images, timings_ms=timings or {}, error=error, source=p.ref,
            schema_version=p.job.schema_version)
