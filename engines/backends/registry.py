"""The backends by name: what each one builds, for which device, and how it runs.

A :class:`Backend` record names its artifact file and reaches its version, builder and runner
factory through lazy references, so importing the registry imports no GPU library (onnxruntime,
torch, tensorrt and cuda-python load when a backend is first used). Adding a backend is one
module (a version function, a builder ``(plan, recipe, out)`` and a runner factory
``(plan, engine loader)``) and one record in :data:`BACKENDS`; the config validates backend names
and reads each backend's precisions and default profiles from that record alone, and models and
tools read what they need to know of a backend (calibration, the pixel pipeline, build hints)
there too, never by its name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.device import DeviceFingerprint, cpu_fingerprint, fingerprint_for
from engines.exceptions import EngineError

if TYPE_CHECKING:
    from engines.assembly import DeferredLoader, EngineParams, EnginePlan
    from engines.backends.base import Runner
    from engines.cache import BuildNotes, BuildRecipe


def _lazy(target: str) -> Callable[..., Any]:
    """``"module:function"``, imported on the first call."""
    module, _, name = target.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = target
    return call


def _no_flags(params: EngineParams) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Backend:
    name: str
    artifact_name: str  # the artifact's file name inside its cache entry
    version: Callable[[], str]  # the installed library's version (part of the cache key)
    fingerprint: Callable[[str], DeviceFingerprint]  # engine device ("cpu", "cuda:N") -> the
    # fingerprint of what the artifact is built for (cpu vs cuda)
    # Write the artifact to a path; may return notes for the sidecar (what it measured, chose).
    build: Callable[[EnginePlan, BuildRecipe, Path], BuildNotes | None]
    runner: Callable[[EnginePlan, DeferredLoader | None], Runner]  # a runner (not active)
    precisions: tuple[str, ...]  # what it runs, its default first
    from_onnx: bool  # the artifact is built from the spec's ONNX (not the native network)
    static_profiles: bool  # runs static profiles best (a captured graph per batch size)
    needs_artifact: bool = False  # runs only a built artifact: always through the cache
    key_flags: Callable[[EngineParams], Mapping[str, Any]] = field(default=_no_flags)
    # Precisions that exist only as a built artifact (onnxruntime's int8: a quantized model),
    # so they too always go through the cache.
    artifact_precisions: tuple[str, ...] = ()
    # The batch profiles a model runs when its config names none (item shapes come from the
    # model), in the config's form.
    default_profiles: tuple[Mapping[str, Any], ...] = ()
    static_only: bool = False  # builds one artifact per static batch size: no range profiles
    # Precisions calibrated on images that, with no calibration set configured
    # (engines.calibration_dir), calibrate on the model's own sample images instead: a
    # smoke-level calibration (logged as such), so the precision runs out of the box. Not
    # tensorrt's int8: calibrated on images too, its builder asks for a configured set.
    smoke_calibrated_precisions: tuple[str, ...] = ()
    # Its runner drives the overlapped pixel pipeline (engines.backends.torch.pipeline):
    # uint8 rows in pinned host slots, copied in, a captured graph (normalisation + network),
    # copied out, on three streams. Image models serve through it where the backend has it.
    pipelined: bool = False
    # What `engines build` prints beside its progress where a build is slow enough to look
    # stuck; None where builds are quick.
    build_hint: str | None = None
    # The backend a secondary model (the text and CLIP towers) runs on when this is the
    # worker's backend and the model's section names none; None: this one. The towers' plans
    # exist for onnxruntime, torch and aoti, but a worker on a compiled backend starts them
    # on torch so that it needs no tower build step.
    towers_on: str | None = None

    def runs_from_artifact(self, precision: str) -> bool:
        """Whether a runner of ``precision`` must get its artifact from the cache (even with
        the cache off)."""
        return self.needs_artifact or precision in self.artifact_precisions

    def precision(self, requested: str | None) -> str:
        """``requested`` where this backend runs it, else its default (onnxruntime runs
        fp16 models in fp32)."""
        return requested if requested in self.precisions else self.precisions[0]


def _calibration(params: EngineParams) -> str | None:
    """A fingerprint of the int8 calibration images (None when none are set): int8 artifacts
    key on it, so another calibration set builds another one."""
    if params.calibration_dir is None:
        return None
    from engines.calibration import calibration_fingerprint

    return calibration_fingerprint(params.calibration_dir)


def _ort_flags(params: EngineParams) -> dict[str, Any]:
    """int8 only (fp32 keys stay as they were): the quantization recipe and the calibration."""
    if params.precision != "int8":
        return {}
    from engines.backends.onnxruntime import INT8_RECIPE

    return {"int8": INT8_RECIPE, "calibration": _calibration(params)}


def _trt_flags(params: EngineParams) -> dict[str, Any]:
    flags: dict[str, Any] = {"workspace_mb": params.workspace_mb}
    if params.precision == "int8" and params.calibration_dir is not None:
        flags["calibration"] = _calibration(params)
    return flags


def _aoti_flags(params: EngineParams) -> dict[str, Any]:
    from engines.backends.aoti.options import inductor_options

    return {"inductor": inductor_options(params.device, params.autotune)}


# Default profiles. On the CPU one range: every padded row costs real CPU time. On a GPU static
# buckets: one CUDA graph or TensorRT profile each.
CPU_RANGE: tuple[Mapping[str, Any], ...] = (
    {"name": "cpu", "kind": "range", "min_batch": 1, "opt_batch": 8, "max_batch": 64},)
GPU_BUCKETS: tuple[Mapping[str, Any], ...] = (
    {"name": "gpu", "kind": "static", "batch_sizes": (1, 8, 32, 128)},)

_ORT, _TORCH, _TRT, _AOTI = ("engines.backends.onnxruntime", "engines.backends.torch",
                             "engines.backends.tensorrt", "engines.backends.aoti")

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend(name="onnxruntime", artifact_name="model.ort.onnx",
            version=_lazy(f"{_ORT}:ort_version"), fingerprint=lambda device: cpu_fingerprint(),
            build=_lazy(f"{_ORT}:build_ort_engine"), runner=_lazy(f"{_ORT}:make_ort_runner"),
            precisions=("fp32", "int8"), from_onnx=True, static_profiles=False,
            # int8: opt-in, calibrated on engines.calibration_dir (else the bundled samples).
            key_flags=_ort_flags, artifact_precisions=("int8",), default_profiles=CPU_RANGE,
            smoke_calibrated_precisions=("int8",)),
    Backend(name="torch", artifact_name="weights.pt",
            version=_lazy(f"{_TORCH}.artifact:torch_version"), fingerprint=fingerprint_for,
            build=_lazy(f"{_TORCH}.artifact:build_torch_engine"),
            runner=_lazy(f"{_TORCH}.runner:make_torch_runner"),
            precisions=("fp16", "fp32"), from_onnx=False, static_profiles=True,
            default_profiles=GPU_BUCKETS, pipelined=True),
    Backend(name="tensorrt", artifact_name="engine.plan",
            version=_lazy(f"{_TRT}.builder:trt_version"), fingerprint=fingerprint_for,
            build=_lazy(f"{_TRT}.builder:build_trt_engine"),
            runner=_lazy(f"{_TRT}.runner:make_trt_runner"),
            precisions=("fp16", "fp32", "int8", "fp8"), from_onnx=True, static_profiles=False,
            needs_artifact=True, key_flags=_trt_flags, default_profiles=GPU_BUCKETS,
            towers_on="torch"),
    Backend(name="aoti", artifact_name="engine.aoti.zip",
            version=_lazy(f"{_TORCH}.artifact:torch_version"), fingerprint=fingerprint_for,
            build=_lazy(f"{_AOTI}.build:build_aoti_engine"),
            runner=_lazy(f"{_AOTI}.runner:make_aoti_runner"),
            precisions=("fp16", "fp32"), from_onnx=False, static_profiles=True,
            needs_artifact=True, key_flags=_aoti_flags, default_profiles=GPU_BUCKETS,
            static_only=True, towers_on="torch",
            build_hint="AOTInductor compiles each batch size: minutes per size with "
            "max-autotune on CUDA (engines.autotune)"),
)}


def backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise EngineError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None
