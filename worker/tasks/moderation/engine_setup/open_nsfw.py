"""From the config to the open_nsfw engine: the config mapped onto engines' plain parameters.

The worker and ``trt-worker engines build`` both go through here, so the artifact a build
writes is exactly the one a worker with the same config loads (spec, profiles, cache recipe,
loader and runner are assembled by :class:`engines.assembly.EnginePlan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import structlog

from engines.assembly import EngineParams, EnginePlan
from engines.backends.base import Runner
from engines.cache import BuildRecipe, EngineFromCache
from engines.models.open_nsfw import ITEM_SHAPE, open_nsfw_spec
from engines.profiles import Profile, RangeProfile, StaticProfile
from worker.bundled import samples_dir
from worker.config import ProfileSettings, WorkerConfig

log = structlog.get_logger("worker")


def to_profile(p: ProfileSettings, item: tuple[int, ...]) -> Profile:
    if p.kind == "static":
        assert p.batch_sizes is not None
        return StaticProfile(p.name, item, tuple(p.batch_sizes))
    assert p.min_batch is not None and p.opt_batch is not None and p.max_batch is not None
    return RangeProfile(p.name, item, item, item, p.min_batch, p.opt_batch, p.max_batch)


def engine_params(cfg: WorkerConfig, backend: str, precision: str) -> EngineParams:
    """``[engines]`` and ``[model]`` as engine parameters, for ``backend`` at ``precision``."""
    e = cfg.engines
    return EngineParams(
        backend=backend, precision=precision, device=f"cuda:{cfg.model.device}",
        cache_dir=e.cache_dir, use_cache=e.use_cache, slots=e.in_flight_slots,
        intra_op_threads=cfg.model.intra_op_threads, workspace_mb=e.workspace_mb,
        timing_cache=e.timing_cache, calibration_dir=e.calibration_dir, autotune=e.autotune)


def _calibration_sample(data: bytes) -> np.ndarray:
    """An INT8 calibration image, preprocessed as the worker preprocesses a job's image."""
    from worker.tasks.moderation.images.cpu import decode_image, preprocess_open_nsfw

    return preprocess_open_nsfw(decode_image(data))


def engine_plan(cfg: WorkerConfig) -> EnginePlan:
    m = cfg.model
    profiles = tuple(to_profile(p, ITEM_SHAPE) for p in m.effective_profiles)
    params = engine_params(cfg, m.backend, m.effective_precision)
    if params.backend == "onnxruntime" and params.precision == "int8" \
            and params.calibration_dir is None:
        # A smoke-level calibration (8 stock photos, each also mirrored): enough to run, not
        # to trust. Production points engines.calibration_dir at a few hundred representative
        # frames of its own traffic (a different folder keys a different artifact).
        params = replace(params, calibration_dir=samples_dir())
        log.warning("int8_calibration_on_bundled_samples", calibration_dir=str(
            params.calibration_dir), hint="set engines.calibration_dir to a few hundred "
            "representative images for a production calibration")
    return EnginePlan(open_nsfw_spec(m.open_nsfw_onnx), profiles, params,
                      preprocess=_calibration_sample)


def engine_loader(cfg: WorkerConfig, plan: EnginePlan,
                  on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
    return plan.loader(on_build)


def make_runner(cfg: WorkerConfig, on_build: Callable[[BuildRecipe], None] | None = None
                ) -> tuple[Runner, EnginePlan]:
    plan = engine_plan(cfg)
    return plan.runner(on_build), plan
