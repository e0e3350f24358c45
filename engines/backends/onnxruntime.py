"""ONNX Runtime on the CPU: the embedded default on machines with no GPU."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.base import FutureHandle, InferHandle, Outputs, Runner
from engines.cache import BuildRecipe, CacheEntry
from engines.cpus import available_cpus
from engines.exceptions import BackendUnavailable, InferenceFailed, RunnerStateError
from engines.spec import EngineSpec

if TYPE_CHECKING:
    import onnxruntime as ort

    from engines.assembly import DeferredLoader, EnginePlan


def ort_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)


def build_ort_artifact(spec: EngineSpec, out: Path) -> None:
    """The artifact: the model after ORT's full graph optimization for this CPU (fused and
    layout-transformed nodes), which ORT documents as valid only on the hardware it ran on."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(out)
    # ORT warns that this file is hardware-specific; the cache key's device fingerprint is
    # exactly what handles that, so the warning is noise here.
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(spec.onnx().data, sess_options=opts,
                             providers=["CPUExecutionProvider"])
    except _ort_errors() as exc:
        raise InferenceFailed(f"onnxruntime could not optimize {spec.model_id}: {exc}") from exc


def build_ort_engine(plan: EnginePlan, recipe: BuildRecipe, out: Path) -> None:
    """The registry's builder: :func:`build_ort_artifact` of the plan's spec."""
    build_ort_artifact(plan.spec, out)


def make_ort_runner(plan: EnginePlan, engine: DeferredLoader | None) -> OrtRunner:
    """The registry's runner factory."""
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
