"""ONNX -> serialized TensorRT plan (TensorRT 10 Python API).

One optimization profile per engine profile (a static profile contributes one fixed-shape
profile per batch size), FP16, INT8 with an entropy calibrator fed from real samples, FP8 on
GPUs that have it (compute capability >= 8.9, and an ONNX with explicit Q/DQ nodes: TensorRT 10
has no implicit FP8 calibration), and a timing cache persisted next to the engine cache so
rebuilds for new profiles reuse measured tactics.
"""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.backends.tensorrt.shapes import optimization_profiles
from engines.cache import BuildRecipe
from engines.exceptions import BackendUnavailable, EngineError
from engines.profiles import Profile
from engines.spec import EngineSpec

if TYPE_CHECKING:
    from engines.assembly import EnginePlan

CALIBRATION_BATCH = 8


# The builder sets precisions with weak typing (BuilderFlag.FP16/INT8/FP8, int8_calibrator),
# which TensorRT 11 removed; pyproject pins the extra to this range too.
SUPPORTED_MAJOR = 10


def trt_version() -> str:
    import tensorrt as trt

    return str(trt.__version__)


def check_supported(version: str) -> None:
    """Refuse a TensorRT this builder cannot drive, before building anything."""
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_MAJOR:
        raise BackendUnavailable(
            f"TensorRT {version} is installed; this builder drives TensorRT "
            f"{SUPPORTED_MAJOR}.x (TensorRT 11 removed the weakly typed precision flags and "
            f"the INT8 calibrator it uses): pip install 'tensorrt>={SUPPORTED_MAJOR},"
            f"<{SUPPORTED_MAJOR + 1}', or use the torch or aoti backend")


@dataclass(frozen=True, slots=True)
class TrtBuildOptions:
    precision: str = "fp16"  # fp32 | fp16 | int8 | fp8
    workspace_bytes: int = 4 << 30
    timing_cache: Path | None = None
    calibrator: Any = None  # tensorrt.IInt8Calibrator for int8
    compute_capability: tuple[int, int] | None = None  # to refuse fp8 where it cannot run


def build_trt_engine(plan: EnginePlan, recipe: BuildRecipe, out: Path) -> None:
    """The registry's builder: the plan's profiles and precision, INT8 calibrated on the
    plan's calibration images, the timing cache shared per TensorRT version and GPU."""
    check_supported(recipe.backend_version)
    p, spec = plan.params, plan.spec
    calibrator = None
    if p.precision == "int8" and p.calibration_dir is not None and plan.preprocess is not None:
        from engines.backends.tensorrt.calibration import entropy_calibrator
        from engines.calibration import CalibrationBatches, samples_from_folder

        samples = samples_from_folder(p.calibration_dir, plan.preprocess)
        batches = CalibrationBatches(samples, CALIBRATION_BATCH, spec.inputs[0].shape[1:])
        calibrator = entropy_calibrator(batches, spec.inputs[0].name,
                                        out.with_name("calibration.cache"))
    major, _, minor = recipe.device.arch.partition(".")
    timing = p.timing_cache or plan.cache.root / (
        f"timing-{recipe.backend_version}-{recipe.device.name.replace(' ', '_')}.cache")
    options = TrtBuildOptions(p.precision, p.workspace_mb << 20, timing, calibrator,
                              (int(major), int(minor)))
    build_trt_plan(spec, plan.profiles, options, out)


def _logger() -> Any:
    import tensorrt as trt

    return trt.Logger(trt.Logger.WARNING)


def build_trt_plan(spec: EngineSpec, profiles: tuple[Profile, ...], options: TrtBuildOptions,
                   out: Path) -> None:
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailable("tensorrt does not import on this machine") from exc
    logger = _logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(spec.onnx().data):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT could not parse {spec.model_id}'s ONNX: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    _set_precision(trt, config, options)

    tensor = spec.inputs[0]
    for shapes in optimization_profiles(profiles, tensor.shape[1:]):
        profile = builder.create_optimization_profile()
        profile.set_shape(tensor.name, shapes.min, shapes.opt, shapes.max)
        config.add_optimization_profile(profile)
        if options.precision == "int8":
            config.set_calibration_profile(profile)  # calibrate at the first profile's shape

    cache = _load_timing_cache(config, options.timing_cache)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"TensorRT failed to build {spec.model_id} (see the log above)")
    out.write_bytes(bytes(plan))
    if options.timing_cache is not None and cache is not None:
        _save_timing_cache(config.get_timing_cache(), options.timing_cache)


def _set_precision(trt: Any, config: Any, options: TrtBuildOptions) -> None:
    if options.precision == "fp32":
        return
    if options.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif options.precision == "int8":
        if options.calibrator is None:
            raise EngineError("int8 needs a calibrator fed from real samples "
                              "(engines.calibration_dir)")
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers INT8 cannot take fall back to FP16
        config.int8_calibrator = options.calibrator
    elif options.precision == "fp8":
        cc = options.compute_capability
        if cc is None or cc < (8, 9):
            raise EngineError(f"fp8 needs compute capability >= 8.9 (Ada/Hopper), this GPU is {cc}")
        config.set_flag(trt.BuilderFlag.FP8)
        config.set_flag(trt.BuilderFlag.FP16)
    else:
        raise EngineError(f"unknown precision {options.precision!r}")


def _load_timing_cache(config: Any, path: Path | None) -> Any:
    if path is None:
        return None
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def _save_timing_cache(cache: Any, path: Path) -> None:
    """Merge into the file under a lock: two builders may finish at the same time."""
    import tensorrt as trt

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            config = trt.Builder(_logger()).create_builder_config()
            on_disk = config.create_timing_cache(path.read_bytes())
            cache.combine(on_disk, ignore_mismatch=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(bytes(cache.serialize()))
        tmp.replace(path)
