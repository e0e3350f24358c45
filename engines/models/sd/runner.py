"""A torch runner for multi-input networks: CUDA (fp16, CUDA graphs per static shape, optional
torch.compile) or CPU (fp32, eager; the reference the ONNX Runtime engines are checked against).

Graphs are captured lazily per exact input shape that a static profile offers (``warm_up``
captures them all up front), ``slots`` per shape. All graphs of one runner share one memory
pool, which is only safe when replays never overlap: they are all enqueued on the runner's own
stream, in order. Eager calls (shapes outside every static profile) use the caller's stream.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engines.backends.base import FutureHandle, InferHandle, Outputs, Runner
from engines.exceptions import BackendUnavailable, InferenceFailed
from engines.models.sd.graphs import CudaHandle, GraphSlot, capture
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec

NetLoader = Callable[[str], tuple[Any, str]]  # device -> (module with weights, engine hash)
Shapes = tuple[tuple[int, ...], ...]
DTYPES = {"fp32": "float32", "fp16": "float16"}


def static_shapes(spec: EngineSpec, profiles: tuple[Profile, ...]) -> list[Shapes]:
    """Every input-shape tuple a static profile offers (the first input carries the item)."""
    out = []
    for p in profiles:
        if isinstance(p, StaticProfile):
            for b in p.batch_sizes:
                rest = tuple((b, *t.shape[1:]) for t in spec.inputs[1:])
                out.append(((b, *p.item_shape), *rest))
    return out


class NetRunner(Runner):
    backend = "torch"

    def __init__(self, spec: EngineSpec, *, net: NetLoader, profiles: tuple[Profile, ...],
                 precision: str = "fp16", device: str = "cuda:0", cuda_graphs: bool = True,
                 compile: bool = False, compile_cache: Path | None = None, slots: int = 2) -> None:
        super().__init__()
        if precision not in DTYPES:
            raise BackendUnavailable(f"torch runner supports {sorted(DTYPES)}, not {precision}")
        self.spec, self.profiles, self.precision, self.device = spec, profiles, precision, device
        self._load, self._graphs, self._compile = net, cuda_graphs, compile
        self._compile_cache, self._slots_per_shape = compile_cache, slots
        self._static = set(static_shapes(spec, profiles))
        self._slots: dict[Shapes, list[GraphSlot]] = {}
        self._next: dict[Shapes, int] = {}
        self._lock = threading.Lock()
        self._hash = ""
        self.compile_cache_error: str | None = None
        self.graph_errors: dict[Shapes, str] = {}
        self._fn: Any = None
        self._stream: Any = None
        self._pool: Any = None
        self._exec: ThreadPoolExecutor | None = None

    @property
    def engine_hash(self) -> str:
        return self._hash

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def _activate(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailable("torch does not import") from exc
        if self.cuda and not torch.cuda.is_available():
            raise BackendUnavailable("torch runner on CUDA: no CUDA device is available")
        if not self.cuda and self.precision != "fp32":
            raise BackendUnavailable("the torch runner on CPU runs fp32 only")
        if self.cuda and self.precision == "fp32":
            # fp32 means IEEE fp32 here, as in engines.backends.torch.runner (process-wide).
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        module, self._hash = self._load(self.device)
        dtype = getattr(torch, DTYPES[self.precision])
        net = module.to(device=self.device, dtype=dtype).eval()
        if self._compile:
            if self._compile_cache is not None and self._compile_cache.is_file():
                torch.compiler.load_cache_artifacts(self._compile_cache.read_bytes())
            net = torch.compile(net, dynamic=False)
        self._fn = net
        if self.cuda:
            self._stream = torch.cuda.Stream(self.device)
            self._pool = torch.cuda.graph_pool_handle()
        else:
            self._exec = ThreadPoolExecutor(1, thread_name_prefix=f"torch-{self.spec.model_id}")

    def warm_up(self) -> None:
        """Capture (or on CPU run once) every static shape; save torch.compile's cache."""
        for shapes in sorted(self._static):
            feeds = {t.name: _sample(t.dtype, s) for t, s in zip(self.spec.inputs, shapes,
                                                                  strict=True)}
            self.infer(feeds).result()
        self._save_compile_cache()

    def _save_compile_cache(self) -> None:
        cache = self._compile_cache
        if not self._compile or cache is None or cache.is_file():
            return
        import torch

        try:
            saved = torch.compiler.save_cache_artifacts()
        except (RuntimeError, AttributeError) as exc:  # a cache miss later costs time only
            self.compile_cache_error = str(exc)
            return
        if saved is not None:
            tmp = cache.with_suffix(".tmp")
            tmp.write_bytes(saved[0])
            tmp.rename(cache)  # atomic: a second worker never reads half a file

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        try:
            arrays = [np.ascontiguousarray(feeds[t.name], dtype=t.dtype) for t in self.spec.inputs]
        except KeyError as exc:
            raise InferenceFailed(f"{self.spec.model_id}: missing input {exc}") from exc
        if self._exec is not None:
            return FutureHandle(self._exec.submit(self._run_cpu, arrays))
        shapes = tuple(a.shape for a in arrays)
        try:
            with self._lock:
                if self._graphs and shapes in self._static:
                    slot = self._capture_or_none(shapes)
                    if slot is not None:
                        return slot.launch(arrays, self._stream, self.spec.outputs[0].name)
                return self._eager(arrays, stream or self._stream)
        except RuntimeError as exc:
            raise InferenceFailed(f"torch inference failed: {exc}") from exc

    def _capture_or_none(self, shapes: Shapes) -> GraphSlot | None:
        """A graph slot, or None when this shape cannot be captured (the network syncs with
        the host somewhere): then it runs eagerly from now on, with a warning, not a crash."""
        try:
            return self._slot(shapes)
        except RuntimeError as exc:
            self._static.discard(shapes)
            self.graph_errors[shapes] = str(exc)
            warnings.warn(f"{self.spec.model_id}: CUDA graph capture failed for {shapes}, "
                          f"running it eagerly: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def _slot(self, shapes: Shapes) -> GraphSlot:
        import torch

        if shapes not in self._slots:
            slots = []
            for i in range(self._slots_per_shape):
                dev_in = [torch.from_numpy(_sample(t.dtype, s)).to(self.device)
                          for t, s in zip(self.spec.inputs, shapes, strict=True)]
                # Kernels are chosen (and compiled) by the first slot's warm-up runs already.
                slots.append(capture(self._fn, dev_in, self._pool, warmup=3 if i == 0 else 0))
            torch.cuda.synchronize(self.device)  # inputs and capture done before any replay
            self._slots[shapes], self._next[shapes] = slots, 0
        i = self._next[shapes]
        self._next[shapes] = (i + 1) % len(self._slots[shapes])
        return self._slots[shapes][i]

    def _eager(self, arrays: list[np.ndarray], stream: Any) -> InferHandle:
        import torch

        hosts = [torch.from_numpy(a).pin_memory() for a in arrays]
        with torch.no_grad(), torch.cuda.stream(stream):
            out = self._fn(*[h.to(self.device, non_blocking=True) for h in hosts])
            host_out = torch.empty(tuple(out.shape), dtype=out.dtype, pin_memory=True)
            host_out.copy_(out, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return CudaHandle(event, host_out, self.spec.outputs[0].name, keepalive=hosts)

    def _run_cpu(self, arrays: list[np.ndarray]) -> Outputs:
        import torch

        with torch.no_grad():
            out = self._fn(*[torch.from_numpy(a) for a in arrays])
        return {self.spec.outputs[0].name: out.numpy()}

    def _deactivate(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        if self._exec is not None:
            self._exec.shutdown(wait=True)
        self._slots.clear()
        self._fn = self._stream = self._pool = self._exec = None

    def graph_count(self) -> int:
        return sum(len(v) for v in self._slots.values())


def _sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Plausible non-zero inputs for warm-up and capture (ids 0, timesteps mid-range)."""
    if dtype == "int64":
        return np.zeros(shape, dtype=np.int64)
    return np.random.default_rng(0).standard_normal(shape).astype(dtype) * (
        500.0 if len(shape) == 1 else 1.0)
