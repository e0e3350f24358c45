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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import structlog

from engines.exceptions import BackendUnavailable, RunnerStateError
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
from worker.tasks.generation.results import fit_result, images_for, in_version, store
from worker.tasks.generation.safety import Safety, generated_pixels
from worker.tasks.generation.schedulers import make_schedule
from worker.tasks.gpu_share import GpuShare
from worker.tasks.protocol import source_ref
from worker.wire.generation_codec import decode_generation_job, encode_generation_result
from worker.wire.generation_jobs import (
    GENERATION_RESULT_SCHEMAS,
    BlobRef,
    Check,
    GeneratedImage,
    GenerationJob,
    GenerationResult,
)
from worker.wire.moderation_jobs import Status, Verdict
from worker.wire.records import Headers, SourceRecord, SourceRef

log = structlog.get_logger("worker.tasks.generation")


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

    def images(self) -> int:
        """What the job weighs in a batch's image budget (the batcher's ``weight``)."""
        return self.job.num_images


@dataclass(slots=True)
class GenerationOutcome:
    pending: GenerationPending
    result: GenerationResult | None = None
    rejection: JobRejected | None = None


class GenerationTask(BatchedTask[GenerationPending]):
    def __init__(self, settings: GenerationSettings, engines: SdEngines, blobs: BlobStore, *,
                 max_in_flight_batches: int = 2, max_jobs_per_batch: int = 8,
                 own_engines: bool = True, safety: Safety | None = None,
                 quarantine: BlobStore | None = None) -> None:
        """``safety``: the prompt and image checks (None: neither); ``quarantine``: where
        blocked images' PNGs go (None: nowhere)."""
        self.settings, self.engines, self.blobs = settings, engines, blobs
        self.safety, self.quarantine = safety, quarantine
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
        if self.safety is not None:
            self.safety.warm_up()
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

    def share_gpu(self, share: GpuShare, *, yields: bool) -> None:
        super().share_gpu(share, yields=yields)
        if not yields or not share.free_sms or not self.settings.on_cuda:
            return  # (generation on the CPU: no SMs of its own to keep off)
        try:
            cannot = self.engines.leave_sms_free(share.free_sms)
        except RunnerStateError as exc:  # engines loaded already (shared with another task)
            log.warning("gpu_free_sms_ignored", reason=one_line(exc))
            return
        if cannot:
            log.warning("gpu_free_sms_ignored", engines=cannot, device=self.settings.device,
                        reason="these engines' backend or device has no SM partitions")
        else:
            share.left_free = share.free_sms
            log.info("gpu_free_sms", free_sms=share.free_sms)

    def submit(self, batch: Batch[GenerationPending]) -> Future[list[GenerationOutcome]]:
        self.engines.activate()  # no-op once active; here on the loop's thread, never racing
        return self._batch_pool.submit(self._run, batch)

    def close(self) -> None:
        self._batch_pool.shutdown(wait=True)
        self._png_pool.shutdown(wait=True)
        try:
            if self.safety is not None:
                self.safety.close()
        finally:
            if self._own_engines:
                self.engines.deactivate()

    def _run(self, batch: Batch[GenerationPending]) -> list[GenerationOutcome]:
        items = batch.items
        started = time.monotonic()
        # An engine failure is raised, never answered "error": out of memory waits and runs
        # again (an outage), anything else is split down to the job that fails alone, which
        # is dead-lettered (worker.tasks.batched).
        prompts = self._check_prompts(items)
        checked = time.monotonic()
        go = [p for p, c in zip(items, prompts, strict=True)
              if c is None or c.verdict is not Verdict.BLOCK]
        stamps: dict[str, float] = {}
        pngs: dict[tuple[int, int], bytes] = {}
        checks: dict[tuple[int, int], Check] = {}
        quarantined: dict[tuple[int, int], BlobRef] = {}
        if go:  # the UNet runs for the jobs whose prompt passed, and for them only
            stamps, pngs, checks = self._generate(go, checked)
            quarantined = self._quarantine(go, pngs, checks)
        if self.safety is not None and self.safety.prompt_policy is not None:
            stamps["prompt_check"] = (checked - started) * 1e3
        outcomes = []
        position = {id(p): pos for pos, p in enumerate(go)}
        for p, prompt in zip(items, prompts, strict=True):
            done = time.monotonic()
            timings = {"queue": (started - p.consumed_at) * 1e3, **stamps,
                       "total": (done - p.consumed_at) * 1e3}
            pos = position.get(id(p))
            if pos is None:
                assert prompt is not None
                timings = {k: timings[k] for k in ("queue", "prompt_check", "total")}
                result = self._result(p, Status.BLOCKED, timings=timings, error=(
                    f"prompt blocked by moderation: {prompt.rule}"), prompt_check=prompt)
                outcomes.append(GenerationOutcome(p, in_version(result)))
                continue
            seeds = [p.job.image_seed(i) for i in range(p.job.num_images)]
            images = images_for(pngs, pos, seeds, p.job.width, p.job.height, checks,
                                quarantined)
            result = self._result(p, Status.OK, timings=timings, images=images,
                                  prompt_check=prompt)
            fitted = fit_result(in_version(result), self.settings.results_max_bytes,
                                self.blobs, time.monotonic)
            outcomes.append(GenerationOutcome(p, fitted))
        return outcomes

    def _check_prompts(self, items: list[GenerationPending]) -> list[Check | None]:
        safety = self.safety
        if safety is None or safety.prompt_policy is None:
            return [None] * len(items)
        return list(safety.check_prompts([p.job for p in items]))

    def _generate(self, items: list[GenerationPending], started: float
                  ) -> tuple[dict[str, float], dict[tuple[int, int], bytes],
                             dict[tuple[int, int], Check]]:
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
            pace = self._vae_pace()
            sampler.denoise(e.runners["unet"], e.runners["vae"], chunks, vae_profiles,
                            before_step=self.yield_gpu, decode=pace is None)
            denoised = time.monotonic()
            if pace is not None:
                sampler.decode_paced(e.runners["vae"], chunks, vae_profiles, pace,
                                     self.settings.vae_yield_images)
            pixels = {row.tag: px for c in chunks
                      for row, px in zip(c.rows, sampler.images_of(c), strict=True)}
            decoded = time.monotonic()
        checks = self._check_images(items, pixels)
        moderated = time.monotonic()
        level = self.settings.png_compress_level
        # A blocked image is encoded only for a quarantine; otherwise it never becomes a PNG.
        keep = self.quarantine is not None
        futures = {tag: self._png_pool.submit(encode_png, px, level) for tag, px in pixels.items()
                   if keep or tag not in checks or checks[tag].verdict is not Verdict.BLOCK}
        pngs = {tag: f.result() for tag, f in futures.items()}
        done = time.monotonic()
        stamps = {"engines_wait": gpu_start - started, "text": encoded - gpu_start,
                  "denoise": denoised - encoded, "vae": decoded - denoised,
                  "png": done - moderated}
        if self.safety is not None and self.safety.image_policy is not None:
            stamps["moderation"] = moderated - decoded
        return {k: v * 1e3 for k, v in stamps.items()}, pngs, checks

    def _vae_pace(self) -> Callable[[], None] | None:
        """What runs before each VAE launch when the decode is paced (generation.vae_yield_ms
        beside another task on the GPU), else None: every launch enqueued at once."""
        wait_s = self.settings.vae_yield_ms / 1e3
        if wait_s <= 0 or self.gpu_share is None or not self._yields_gpu:
            return None
        return lambda: self.yield_gpu(wait_s)

    def _check_images(self, items: list[GenerationPending],
                      pixels: dict[tuple[int, int], np.ndarray]
                      ) -> dict[tuple[int, int], Check]:
        """Each image's check under the image policy (none when it is off), on the pixels the
        VAE made, images of one size scored together."""
        safety = self.safety
        if safety is None or safety.image_policy is None or not pixels:
            return {}
        by_shape: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for tag, px in pixels.items():
            by_shape.setdefault(px.shape, []).append(tag)
        checks: dict[tuple[int, int], Check] = {}
        for tags in by_shape.values():
            batch = generated_pixels([pixels[t] for t in tags])
            found = safety.check_images(batch, [items[pos].job.prompt for pos, _ in tags])
            checks.update(zip(tags, found, strict=True))
        return checks

    def _quarantine(self, items: list[GenerationPending], pngs: dict[tuple[int, int], bytes],
                    checks: dict[tuple[int, int], Check]) -> dict[tuple[int, int], BlobRef]:
        """Blocked images' PNGs in the quarantine store (when one is configured), then out of
        ``pngs``: they are never published."""
        out: dict[tuple[int, int], BlobRef] = {}
        for tag, check in checks.items():
            if check.verdict is not Verdict.BLOCK:
                continue
            png = pngs.pop(tag, None)
            if self.quarantine is not None and png is not None:
                job = items[tag[0]].job
                out[tag] = store(self.quarantine, job.id, tag[1], job.image_seed(tag[1]), png,
                                 "quarantine store")
        return out

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
                images: tuple[GeneratedImage, ...] = (), prompt_check: Check | None = None
                ) -> GenerationResult:
        return GenerationResult(
            id=p.job.id, status=status, model_id=self.model_id,
            engine_hashes=self.engines.engine_hashes(), random_weights=self.engines.random_weights,
            images=images, timings_ms=timings or {}, error=error, source=p.ref,
            schema_version=p.job.schema_version, prompt_check=prompt_check)
