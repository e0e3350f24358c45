"""open_nsfw's engine plan from the config (``[model]``): what the worker loads and
``trt-worker engines build`` builds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import structlog

from engines.assembly import EnginePlan
from engines.backends.base import Runner
from engines.backends.registry import backend
from engines.cache import BuildRecipe, EngineFromCache
from engines.models.open_nsfw import ITEM_SHAPE, open_nsfw_spec
from worker.bundled import samples_dir
from worker.config import WorkerConfig
from worker.tasks.moderation.engine_params import engine_params, to_profile

log = structlog.get_logger("worker")


def _calibration_sample(data: bytes) -> np.ndarray:
    """An INT8 calibration image, preprocessed as the worker preprocesses a job's image."""
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    return preprocess_open_nsfw(decode_image(data))


def engine_plan(cfg: WorkerConfig) -> EnginePlan:
    m = cfg.model
    profiles = tuple(to_profile(p, ITEM_SHAPE) for p in m.effective_profiles)
    params = engine_params(cfg, m.backend, m.effective_precision)
    if params.precision in backend(params.backend).smoke_calibrated_precisions \
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


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The model's ``engines build`` entry: its one engine."""
    return {"open_nsfw": engine_plan(cfg)}


def engine_loader(cfg: WorkerConfig, plan: EnginePlan,
                  on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
    return plan.loader(on_build)


def make_runner(cfg: WorkerConfig, on_build: Callable[[BuildRecipe], None] | None = None
                ) -> tuple[Runner, EnginePlan]:
    plan = engine_plan(cfg)
    return plan.runner(on_build), plan
