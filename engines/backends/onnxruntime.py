"""ONNX Runtime on the CPU: the embedded default on machines with no GPU.

Precisions: fp32 (the default), and int8 on request: ORT static quantization calibrated on
real images (``engines.calibration_dir``), which changes scores slightly (docs/engines-and-gpu.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.base import FutureHandle, InferHandle, Outputs, Runner
from engines.cache import BuildNotes, BuildRecipe, CacheEntry
from engines.cpus import available_cpus
from engines.exceptions import BackendUnavailable, EngineError, InferenceFailed, RunnerStateError
from engines.spec import EngineSpec

if TYPE_CHECKING:
    import onnxruntime as ort

    from engines.assembly import DeferredLoader, EnginePlan


def ort_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)


# How an int8 artifact is made; part of its cache key (registry), so changing it rebuilds.
# ORT static quantization in QDQ format: int8 per-channel weights, uint8 activations, MinMax
# ranges over each calibration image and its mirror image, on the model converted to opset 13
# or later where older (QDQ's per-channel DequantizeLinear needs its ``axis`` attribute).
QDQ_MIN_OPSET = 13
INT8_RECIPE: dict[str, Any] = {"format": "qdq", "weights": "int8-per-channel",
                               "activations": "uint8", "calibrate": "minmax", "mirrored": True,
                               "min_opset": QDQ_MIN_OPSET}


def build_ort_artifact(spec: EngineSpec, out: Path) -> None:
    """The artifact: the model after ORT's full graph optimization for this CPU (fused and
    layout-transformed nodes), which ORT documents as valid only on the hardware it ran on."""
    _optimize(spec.onnx().data, spec.model_id, out)


def _optimize(source: str | bytes, model_id: str, out: Path) -> None:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(out)
    # ORT warns that this file is hardware-specific; the cache key's device fingerprint is
    # exactly what handles that, so the warning is noise here.
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
    except _ort_errors() as exc:
        raise InferenceFailed(f"onnxruntime could not optimize {model_id}: {exc}") from exc


def build_ort_engine(plan: EnginePlan, recipe: BuildRecipe, out: Path) -> BuildNotes | None:
    """The registry's builder: :func:`build_ort_artifact` of the plan's spec; for int8, the
    model quantized on the plan's calibration images (:func:`quantize_int8`), then optimized
    the same way (the runner loads artifacts with ORT's optimizations off)."""
    if plan.precision != "int8":
        build_ort_artifact(plan.spec, out)
        return None
    with tempfile.TemporaryDirectory(prefix="ort-int8-") as work:
        quantized, notes = quantize_int8(plan, Path(work))
        _optimize(str(quantized), plan.spec.model_id, out)
    return notes


def quantize_int8(plan: EnginePlan, work: Path) -> tuple[Path, BuildNotes]:
    """The plan's model quantized to int8 (:data:`INT8_RECIPE`) in ``work``, calibrated on
    the images of ``plan.params.calibration_dir`` preprocessed by ``plan.preprocess`` (one row
    each, in the engine's input layout, plus its mirror image)."""
    spec, folder = plan.spec, plan.params.calibration_dir
    if folder is None:
        raise EngineError(f"int8 on onnxruntime calibrates {spec.model_id} on real images: set "
                          "engines.calibration_dir to a folder of representative ones")
    if plan.preprocess is None or len(spec.inputs) != 1:
        raise EngineError(f"{spec.model_id} cannot be calibrated for int8: onnxruntime "
                          "quantizes single-input image models with a calibration preprocess")
    try:
        import onnx
        from onnx import version_converter
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as exc:  # onnx is not a core dependency (the CPU image lacks it)
        raise BackendUnavailable(f"int8 on onnxruntime needs the onnx package ({exc}); "
                                 "install onnx (the version in constraints.txt)") from exc

    from engines.calibration import CalibrationBatches, samples_from_folder

    tensor = spec.inputs[0]
    batches = CalibrationBatches(samples_from_folder(folder, plan.preprocess), 1,
                                 tuple(tensor.shape[1:]))
    reader = _CalibrationReader(tensor.name, batches, folder)
    converted, pre, quantized = work / "opset.onnx", work / "pre.onnx", work / "int8.onnx"
    try:
        model = onnx.load_from_string(spec.onnx().data)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < QDQ_MIN_OPSET:
            model = version_converter.convert_version(model, QDQ_MIN_OPSET)
        onnx.save(model, str(converted))
        del model
        quant_pre_process(str(converted), str(pre))
        quantize_static(str(pre), str(quantized), reader, quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True, calibrate_method=CalibrationMethod.MinMax)
    except _quant_errors() as exc:
        raise EngineError(f"onnxruntime could not quantize {spec.model_id} to int8: "
                          f"{type(exc).__name__}: {exc}") from exc
    return quantized, {"int8": {**INT8_RECIPE, "opset": [opset, max(opset, QDQ_MIN_OPSET)],
                                "calibration_dir": str(folder),
                                "calibration_rows": reader.rows}}


class _CalibrationReader:
    """An ``onnxruntime.quantization.CalibrationDataReader``: one feed per calibration row
    (batch of 1), each image followed by its mirror image, read lazily from the folder."""

    def __init__(self, name: str, batches: Iterable[np.ndarray], folder: Path) -> None:
        self.name, self.folder, self.rows = name, folder, 0
        self._rows = self._mirrored(iter(batches))

    @staticmethod
    def _mirrored(batches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        for batch in batches:
            yield batch
            axis = _width_axis(batch.shape)
            if axis is not None:
                yield np.ascontiguousarray(np.flip(batch, axis))

    def get_next(self) -> dict[str, np.ndarray] | None:
        try:
            row = next(self._rows, None)
        except EngineError:
            raise
        except Exception as exc:  # the caller's preprocess, on a file it may refuse
            raise EngineError(f"a calibration image in {self.folder} could not be used: "
                              f"{type(exc).__name__}: {exc}") from exc
        if row is None:
            if self.rows == 0:
                raise EngineError(f"no calibration images in {self.folder} "
                                  "(engines.calibration_dir)")
            return None
        self.rows += 1
        return {self.name: row}


def _width_axis(shape: tuple[int, ...]) -> int | None:
    """The width axis of an image batch (N, H, W, C) or (N, C, H, W) with 1, 3 or 4 channels;
    None for any other input (not mirrored)."""
    if len(shape) != 4:
        return None
    if shape[3] in (1, 3, 4):
        return 2
    if shape[1] in (1, 3, 4):
        return 3
    return None


def _quant_errors() -> tuple[type[BaseException], ...]:
    """What converting, pre-processing and quantizing a model raise (onnx's checker and shape
    inference, ORT's session errors, the quantizer's own ValueError/RuntimeError)."""
    import onnx.checker
    import onnx.shape_inference
    from google.protobuf.message import DecodeError

    return (*_ort_errors(), onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
            DecodeError, KeyError, TypeError)


def make_ort_runner(plan: EnginePlan, engine: DeferredLoader | None) -> OrtRunner:
    """The registry's runner factory (int8 always gets its artifact: the registry marks it an
    artifact-only precision)."""
    return OrtRunner(plan.spec, intra_op_threads=plan.params.intra_op_threads, engine=engine)


def _ort_errors() -> tuple[type[BaseException], ...]:
    """ORT's pybind exceptions derive from Exception directly, not RuntimeError."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidProtobuf", "NoSuchFile", "InvalidGraph",
             "RuntimeException", "NotImplemented", "EPFail")
    found = tuple(getattr(state, n) for n in names if hasattr(state, n))
    return (*found, RuntimeError, ValueError)


class OrtRunner(Runner):
    """Runs an :class:`EngineSpec`'s ONNX with onnxruntime's CPU provider.

    The "stream" is an executor: ``infer`` submits the run and returns immediately, so the
    worker loop keeps polling Kafka while a batch computes. Without a caller's executor the
    runner uses its own single thread, which keeps batches in submission order.
    """

    backend = "onnxruntime"

    def __init__(self, spec: EngineSpec, *, intra_op_threads: int | None = None,
                 engine: Callable[[], CacheEntry] | None = None) -> None:
        super().__init__()
        self.spec = spec
        self._engine = engine
        self._threads = intra_op_threads or available_cpus()
        self._session: ort.InferenceSession | None = None
        self._own_stream: ThreadPoolExecutor | None = None

    def _activate(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - a hard dependency of the package
            raise BackendUnavailable("onnxruntime does not import") from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self._threads
        source: str | bytes
        if self._engine is not None:
            # A cached artifact is already optimized for this CPU: do not optimize it again.
            entry = self._engine()
            source, where = str(entry.artifact), str(entry.artifact)
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._hash = f"onnxruntime-{entry.key[:12]}"
        else:
            model = self.spec.onnx()
            source, where = model.data, model.source
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            self._hash = f"onnxruntime-{ort.__version__}-{model.sha256[:12]}"
        try:
            self._session = ort.InferenceSession(
                source, sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except _ort_errors() as exc:
            raise InferenceFailed(f"onnxruntime could not load {where}: {exc}") from exc
        self._own_stream = ThreadPoolExecutor(1, thread_name_prefix=f"ort-{self.spec.model_id}")

    def _run(self, feeds: Mapping[str, np.ndarray]) -> Outputs:
        assert self._session is not None
        names = [o.name for o in self.spec.outputs]
        try:
            values = self._session.run(names, dict(feeds))
        except _ort_errors() as exc:
            raise InferenceFailed(f"onnxruntime run failed: {exc}") from exc
        return {name: np.asarray(v) for name, v in zip(names, values, strict=True)}

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        executor: Executor | None = stream if stream is not None else self._own_stream
        if executor is None:
            raise RunnerStateError("runner has no executor; was it deactivated?")
        return FutureHandle(executor.submit(self._run, feeds))

    def _deactivate(self) -> None:
        if self._own_stream is not None:
            self._own_stream.shutdown(wait=True)
            self._own_stream = None
        self._session = None
