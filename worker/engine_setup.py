"""From the config to a runner: spec, profiles, cache recipe, lazy loader, backend.

The worker and ``trt-worker engines build`` both go through here, so the artifact a build
writes is exactly the one a worker with the same config loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.backends.base import Runner
from engines.cache import BuildRecipe, EngineCache, EngineFromCache
from engines.device import DeviceFingerprint, cpu_fingerprint, cuda_fingerprint
from engines.models.open_nsfw import open_nsfw_spec
from engines.profiles import Profile, RangeProfile, StaticProfile
from engines.spec import EngineSpec
from worker.config import ProfileSettings, WorkerConfig

ARTIFACT_NAMES = {"onnxruntime": "model.ort.onnx", "torch": "weights.pt",
                  "tensorrt": "engine.plan"}


def to_profile(p: ProfileSettings, item: tuple[int, ...]) -> Profile:
    if p.kind == "static":
        assert p.batch_sizes is not None
        return StaticProfile(p.name, item, tuple(p.batch_sizes))
    assert p.min_batch is not None and p.opt_batch is not None and p.max_batch is not None
    return RangeProfile(p.name, item, item, item, p.min_batch, p.opt_batch, p.max_batch)


@dataclass(frozen=True)
class EnginePlan:
    spec: EngineSpec
    profiles: tuple[Profile, ...]
    backend: str
    precision: str


def engine_plan(cfg: WorkerConfig) -> EnginePlan:
    spec = open_nsfw_spec(cfg.model.open_nsfw_onnx)
    item = spec.inputs[0].shape[1:]
    profiles = tuple(to_profile(p, item) for p in cfg.model.effective_profiles)
    return EnginePlan(spec, profiles, cfg.model.backend, cfg.model.effective_precision)


def _device(cfg: WorkerConfig) -> DeviceFingerprint:
    return cpu_fingerprint() if cfg.model.backend == "onnxruntime" else cuda_fingerprint(
        cfg.model.device)


def _backend_version(backend: str) -> str:
    if backend == "onnxruntime":
        from engines.backends.onnxruntime import ort_version

        return ort_version()
    if backend == "torch":
        from engines.backends.torch.runner import torch_version

        return torch_version()
    from engines.backends.tensorrt.builder import trt_version

    return trt_version()


def recipe_for(cfg: WorkerConfig, plan: EnginePlan) -> BuildRecipe:
    flags: dict[str, object] = {}
    if plan.backend == "tensorrt":
        flags["workspace_mb"] = cfg.engines.workspace_mb
    return BuildRecipe(
        model_id=plan.spec.model_id, onnx_sha256=plan.spec.onnx().sha256, backend=plan.backend,
        backend_version=_backend_version(plan.backend), device=_device(cfg),
        precision=plan.precision, profiles=tuple(p.to_dict() for p in plan.profiles),
        flags=flags, artifact_name=ARTIFACT_NAMES[plan.backend],
    )


def _builder(cfg: WorkerConfig, plan: EnginePlan, recipe: BuildRecipe) -> Callable[[Path], None]:
    if plan.backend == "onnxruntime":
        from engines.backends.onnxruntime import build_ort_artifact

        return lambda out: build_ort_artifact(plan.spec, out)
    if plan.backend == "torch":
        from engines.backends.torch.runner import build_torch_artifact

        return lambda out: build_torch_artifact(plan.spec, plan.precision, out)
    return lambda out: _build_trt(cfg, plan, recipe, out)


def _build_trt(cfg: WorkerConfig, plan: EnginePlan, recipe: BuildRecipe, out: Path) -> None:
    from engines.backends.tensorrt.builder import TrtBuildOptions, build_trt_plan

    calibrator = None
    if plan.precision == "int8":
        from engines.backends.tensorrt.calibration import (
            CalibrationBatches,
            entropy_calibrator,
            samples_from_folder,
        )
        from worker.images import decode_image, preprocess_open_nsfw

        assert cfg.engines.calibration_dir is not None
        samples = samples_from_folder(cfg.engines.calibration_dir,
                                      lambda b: preprocess_open_nsfw(decode_image(b)))
        batches = CalibrationBatches(samples, 8, plan.spec.inputs[0].shape[1:])
        calibrator = entropy_calibrator(batches, plan.spec.inputs[0].name,
                                        out.with_name("calibration.cache"))
    major, _, minor = recipe.device.arch.partition(".")
    timing = cfg.engines.timing_cache or cfg.engines.cache_dir / (
        f"timing-{recipe.backend_version}-{recipe.device.name.replace(' ', '_')}.cache")
    options = TrtBuildOptions(plan.precision, cfg.engines.workspace_mb << 20, timing, calibrator,
                              (int(major), int(minor)))
    build_trt_plan(plan.spec, plan.profiles, options, out)


def engine_loader(cfg: WorkerConfig, plan: EnginePlan,
                  on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
    recipe = recipe_for(cfg, plan)
    return EngineFromCache(EngineCache(cfg.engines.cache_dir), recipe,
                           _builder(cfg, plan, recipe), on_build)


def make_runner(cfg: WorkerConfig, on_build: Callable[[BuildRecipe], None] | None = None
                ) -> tuple[Runner, EnginePlan]:
    plan = engine_plan(cfg)
    loader = engine_loader(cfg, plan, on_build) if cfg.engines.use_cache else None
    if plan.backend == "onnxruntime":
        from engines.backends.onnxruntime import OrtRunner

        return OrtRunner(plan.spec, intra_op_threads=cfg.model.intra_op_threads,
                         engine=loader), plan
    if plan.backend == "torch":
        from engines.backends.torch.runner import TorchRunner

        return TorchRunner(plan.spec, profiles=plan.profiles, precision=plan.precision,
                           engine=loader, device=cfg.model.device,
                           slots=cfg.engines.in_flight_slots), plan
    from engines.backends.tensorrt.runner import TrtRunner

    if loader is None:
        loader = engine_loader(cfg, plan, on_build)  # a TensorRT plan only exists as a build
    return TrtRunner(plan.spec, profiles=plan.profiles, engine=loader,
                     slots=cfg.engines.in_flight_slots), plan
