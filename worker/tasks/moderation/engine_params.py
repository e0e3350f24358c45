"""From the config to engines' plain parameters, for every moderation model's engine plan.

The worker and ``trt-worker engines build`` both go through a model's plan (its package's
``engine.py``), so the artifact a build writes is exactly the one a worker with the same
config loads (spec, profiles, cache recipe, loader and runner are assembled by
:class:`engines.assembly.EnginePlan`).
"""

from __future__ import annotations

from engines.assembly import EngineParams
from engines.backends.registry import backend as registered
from engines.profiles import Profile, RangeProfile, StaticProfile
from worker.config import ProfileSettings, WorkerConfig


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


def engine_backend(cfg: WorkerConfig, explicit: str | None) -> str:
    """A secondary model's backend: its section's, else the one the worker's backend names
    for its towers (:attr:`engines.backends.registry.Backend.towers_on`), else the worker's."""
    if explicit:
        return explicit
    return registered(cfg.model.backend).towers_on or cfg.model.backend


def tower_params(cfg: WorkerConfig, explicit_backend: str | None,
                 precision: str | None) -> EngineParams:
    """A text or CLIP tower's engine parameters (fp16 on torch unless the section says)."""
    backend = engine_backend(cfg, explicit_backend)
    return engine_params(cfg, backend, registered(backend).precision(precision))
