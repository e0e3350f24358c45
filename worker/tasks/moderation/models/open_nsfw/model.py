"""open_nsfw as a moderation model: one part per job, its image, scored as a person may see it.

Each image is decoded into its views (orientation, alpha on white and on black, sampled
animation frames: :func:`worker.tasks.moderation.images.cpu.decode_views`) on a CPU pool, each
view preprocessed to the engine's fixed input (:mod:`.preprocess`), and the job scores its
worst view (the highest ``nsfw``). On a backend whose registry record is ``pipelined`` (torch)
the GPU pipeline path takes over (:mod:`worker.tasks.moderation.models.open_nsfw.gpu`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import structlog

from engines.backends.base import Runner
from engines.backends.registry import BACKENDS
from engines.exceptions import InferenceFailed
from engines.models.open_nsfw import LABELS
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec
from worker.bundled import samples_dir
from worker.config import WorkerConfig
from worker.exceptions import JobRejected, is_transient, one_line
from worker.tasks.batched import sticky_device_error
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images.budgets import guard_for
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image, decode_views
from worker.tasks.moderation.models.base import Finished, ModelContext, ModerationModel
from worker.tasks.moderation.models.open_nsfw.preprocess import (
    CROP,
    RESIZE,
    normalize_pixels,
    preprocess_open_nsfw,
)
from worker.tasks.moderation.parts import JobState, Part
from worker.tasks.moderation.results import no_image
from worker.wire.moderation_jobs import ModerationJob

KIND = "open_nsfw"  # its part kind, and the key of its value
NSFW = LABELS.index("nsfw")  # the score a job's worst view is picked by
# Every image is preprocessed to the model's fixed input, so all image parts share one shape.
IMAGE_ITEM_SHAPE = (CROP, CROP, 3)
log = structlog.get_logger("worker")


class OpenNsfwModel(ModerationModel):
    """``own_runner``: :meth:`close` deactivates the runner (False: a runner shared with the
    caller stays active)."""

    name = "open_nsfw"
    scores_pixels = True

    def __init__(self, cfg: WorkerConfig, runner: Runner, spec: EngineSpec,
                 profiles: tuple[Profile, ...], *, own_runner: bool = False) -> None:
        self.cfg, self.runner, self.spec = cfg, runner, spec
        self._profiles = profiles
        self._own_runner = own_runner
        self.input_name, self.output_name = spec.inputs[0].name, spec.outputs[0].name
        self._limits = ImageLimits(cfg.limits.max_image_pixels, cfg.limits.max_image_side,
                                   guard_for(cfg))
        self._decode_pool = ThreadPoolExecutor(cfg.model.decode_threads,
                                               thread_name_prefix="decode")

    @classmethod
    def create(cls, ctx: ModelContext) -> OpenNsfwModel:
        """On its runner: built here from the config (and deactivated at close), or
        ``ctx.runner``, shared with the caller (left active). The GPU pipeline model on a
        backend whose runner drives the pixel pipeline (captured graphs on pinned rows: its
        registry record's ``pipelined``)."""
        from worker.tasks.moderation.models.open_nsfw.engine import engine_plan, make_runner

        runner = ctx.runner
        if runner is None:
            runner, plan = make_runner(ctx.cfg)
            own = True
        else:
            plan, own = engine_plan(ctx.cfg), False
        # The runner's backend decides (a shared runner is the caller's); a runner of a
        # backend the registry does not know (a stand-in) takes the plain path.
        record = BACKENDS.get(runner.backend)
        if record is not None and record.pipelined:
            from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel

            return OpenNsfwGpuModel(ctx.cfg, runner, plan.spec, plan.profiles, own_runner=own)
        return cls(ctx.cfg, runner, plan.spec, plan.profiles, own_runner=own)

    # -- intake ---------------------------------------------------------------------------
    def feeds(self, job: ModerationJob) -> bool:
        return bool(job.image)

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {KIND: self._profiles}

    def parts(self, state: JobState) -> list[Part]:
        return [Part(state, self.name, KIND, IMAGE_ITEM_SHAPE, key=KIND)]

    # -- scores ---------------------------------------------------------------------------
    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        scores: dict[str, float] = values[KIND]
        return scores

    def identity(self) -> tuple[str, str]:
        return self.spec.model_id, self.runner.engine_hash

    def score_pixels(self, policy: str, pixels: Any, captions: Sequence[str]
                     ) -> list[dict[str, float]]:
        """Generated images: resized and cropped where they live (the GPU preprocessing's
        geometry, :func:`.gpu_preprocess.crop_generated`), then the engine's input on the
        host. No image file in between, so no JPEG re-encode either (``model.jpeg_roundtrip``
        is for decoded files)."""
        from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import crop_generated

        rows = crop_generated(pixels).cpu().numpy()
        profile = max(self._profiles, key=lambda p: p.max_batch)
        scores = self._infer_chunks([normalize_pixels(r) for r in rows], profile)
        return [self.named(row) for row in scores]

    # -- lifecycle ------------------------------------------------------------------------
    def warm_up(self, profiles: tuple[Profile, ...] | None = None) -> None:
        """Activate the runner and run every batch size the batcher can produce once (of
        ``profiles``, default the model's), on a real bundled photo, so the first jobs do not
        pay for lazy allocations (ORT's arena, cuDNN's kernel choice)."""
        self.runner.activate()
        row = preprocess_open_nsfw(decode_image((samples_dir() / "coffee.png").read_bytes()))
        cap = self.cfg.batch.max_batch_size
        sizes: set[int] = set()
        for p in self._profiles if profiles is None else profiles:
            if isinstance(p, StaticProfile):
                sizes.update(b for b in p.batch_sizes if b <= p.padded(min(cap, p.max_batch)))
            else:
                sizes.add(min(cap, p.max_batch))
        for n in sorted(sizes):
            self.runner.infer({self.input_name: np.stack([row] * n)}).result()

    def ready(self) -> bool:
        return self.runner.active

    def close(self) -> None:
        try:
            self._stop()
        finally:
            if self._own_runner:
                self.runner.deactivate()

    def _stop(self) -> None:
        """Stop the decode pool (the runner is left as it is)."""
        self._decode_pool.shutdown(wait=True)

    # -- a batch --------------------------------------------------------------------------
    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        return self._run(batch)

    def _prepare(self, p: Part) -> np.ndarray | JobRejected:
        """The job's rows: one per view a person may be shown; the job scores its worst."""
        image = p.job.image
        if image is None:  # feeds() keeps these out; never crash on one
            return no_image(p.job)
        try:
            views = decode_views(image, self._limits, draft_side=RESIZE
                                 if self.cfg.moderation.jpeg_dct_scaling else None)
        except JobRejected as exc:
            return exc
        roundtrip = self.cfg.model.jpeg_roundtrip
        return np.stack([preprocess_open_nsfw(v, jpeg_roundtrip=roundtrip) for v in views])

    def _infer_chunks(self, rows: list[np.ndarray], profile: Profile) -> np.ndarray:
        """Scores for ``rows`` (one row each), in engine calls of at most the profile's
        largest batch (a batch's jobs bring more rows than jobs: several views each).

        A call out of memory is halved until it fits: a smaller call needs less memory. Any
        other failure (and out of memory on one row) is raised: the task isolates the batch
        (worker.tasks.batched: split down to the job that fails alone, dead-lettered; an
        outage waits; a sticky CUDA error stops the worker)."""
        out = np.empty((len(rows), len(LABELS)), dtype=np.float32)
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
                if hi - lo == 1 or sticky_device_error(one_line(exc)) or not is_transient(exc):
                    raise
                log.warning("engine_call_split_out_of_memory", rows=hi - lo,
                            error=one_line(exc))
                mid = (lo + hi) // 2
                spans += [(mid, hi), (lo, mid)]
                continue
            out[lo:hi] = scores[self.output_name][: hi - lo]
        return out

    def _run(self, batch: Batch[Part]) -> list[Finished]:
        started = time.monotonic()
        prepared = list(self._decode_pool.map(self._prepare, batch.items))
        decoded = time.monotonic()
        done: list[Finished] = []
        good: list[tuple[Part, np.ndarray]] = []
        for p, x in zip(batch.items, prepared, strict=True):
            if isinstance(x, JobRejected):
                done.append((p, x))
            else:
                good.append((p, x))
        if not good:
            return done
        all_scores = self._infer_chunks([row for _, views in good for row in views],
                                        batch.profile)
        at = 0
        for p, views in good:  # each job's worst view: the highest nsfw score
            mine = all_scores[at:at + len(views)]
            at += len(views)
            p.decoded(decoded - started)
            worst = mine[0] if len(views) == 1 else mine[int(np.argmax(mine[:, NSFW]))]
            done.append((p, self.named(worst)))
        return done

    @staticmethod
    def named(row: np.ndarray) -> dict[str, float]:
        return dict(zip(LABELS, row.tolist(), strict=True))  # tolist: Python floats, in C
