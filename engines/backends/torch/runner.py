"""torch on CUDA: FP16, channels-last, one CUDA graph per static batch size and ring slot.

``infer`` copies the batch into a pinned host slot, then enqueues H2D copy, graph replay and
D2H copy on the caller's stream and records an event; the handle's ``result()`` waits for that
event only. Each static batch size has ``slots`` independent (graph, buffers) sets so several
batches of the same size can be in flight without sharing buffers; a slot is reused only after
its previous batch's outputs were read. Range profiles run eagerly (no graph).
torch is imported lazily, in ``activate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engines.backends.base import InferHandle, Outputs, Runner
from engines.cache import CacheEntry
from engines.exceptions import BackendUnavailable, InferenceFailed, RunnerStateError
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec

DTYPES = {"fp32": "float32", "fp16": "float16"}


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def build_torch_artifact(spec: EngineSpec, precision: str, out: Path) -> None:
    """The artifact: the native module's weights in the engine precision (``torch.save``)."""
    import torch

    from engines.models.open_nsfw.net import build_module

    net = build_module(spec.onnx().data).to(getattr(torch, DTYPES[precision]))
    torch.save(net.state_dict(), out)


@dataclass
class _Slot:
    graph: Any  # torch.cuda.CUDAGraph | None (eager for range profiles)
    dev_in: Any
    dev_out: Any
    host_in: Any  # pinned torch tensor
    host_out: Any
    event: Any
    pending: _TorchHandle | None = None


class _TorchHandle:
    __slots__ = ("_event", "_host_out", "_keepalive", "_n", "_name", "_value")

    def __init__(self, event: Any, host_out: Any, n: int, name: str, keepalive: Any = None
                 ) -> None:
        self._event, self._host_out, self._n, self._name = event, host_out, n, name
        self._keepalive = keepalive  # host input of an eager run, alive until its H2D is done
        self._value: Outputs | None = None

    def done(self) -> bool:
        return self._value is not None or bool(self._event.query())

    def result(self, timeout: float | None = None) -> Outputs:
        if self._value is None:
            self._event.synchronize()
            self._value = {self._name: self._host_out[: self._n].numpy().copy()}
        return self._value


class TorchRunner(Runner):
    backend = "torch"

    def __init__(
        self,
        spec: EngineSpec,
        *,
        profiles: tuple[Profile, ...],
        precision: str = "fp16",
        engine: Callable[[], CacheEntry] | None = None,
        device: int = 0,
        slots: int = 2,
        cuda_graphs: bool = True,
    ) -> None:
        super().__init__()
        if precision not in DTYPES:
            raise BackendUnavailable(f"torch backend supports {sorted(DTYPES)}, not {precision}")
        self.spec, self.profiles, self.precision = spec, profiles, precision
        self._engine, self._device_index, self._slots_per_size = engine, device, slots
        self._cuda_graphs = cuda_graphs
        self._hash = ""
        self._net: Any = None
        self._stream: Any = None
        self._slots: dict[int, list[_Slot]] = {}
        self._next: dict[int, int] = {}
        self._eager_max = 0

    @property
    def engine_hash(self) -> str:
        return self._hash

    @property
    def default_stream(self) -> Any:
        return self._stream

    def _activate(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailable("torch does not import") from exc
        if not torch.cuda.is_available():
            raise BackendUnavailable("torch backend needs CUDA; none is available")
        from engines.models.open_nsfw.net import OpenNsfwNet, build_module

        device = torch.device("cuda", self._device_index)
        dtype = getattr(torch, DTYPES[self.precision])
        if self.precision == "fp32":
            # torch lets cuDNN use TF32 (10-bit mantissa) for "float32" convolutions by default,
            # which is off from a float32 reference by ~2e-3. fp32 here means IEEE fp32.
            # These flags are process-wide; an fp16 engine in the same process is unaffected.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        if self._engine is not None:
            entry = self._engine()
            net = OpenNsfwNet()
            net.load_state_dict(torch.load(entry.artifact, map_location="cpu",
                                           weights_only=True))
            self._hash = f"torch-{entry.key[:12]}"
        else:
            model = self.spec.onnx()
            net = build_module(model.data)
            self._hash = f"torch-{torch.__version__}-{self.precision}-{model.sha256[:12]}"
        self._net = net.to(device=device, dtype=dtype).to(memory_format=torch.channels_last)
        self._net.eval()
        self._stream = torch.cuda.Stream(device)
        item = self.spec.inputs[0].shape[1:]
        for profile in self.profiles:
            if isinstance(profile, StaticProfile) and self._cuda_graphs:
                for size in profile.batch_sizes:
                    self._slots[size] = [self._capture(size, item, device)
                                         for _ in range(self._slots_per_size)]
                    self._next[size] = 0
            else:
                self._eager_max = max(self._eager_max, profile.max_batch)

    def _capture(self, size: int, item: tuple[int, ...], device: Any) -> _Slot:
        import torch

        dev_in = torch.randn((size, *item), device=device, dtype=torch.float32)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(3):  # warm-up: cuDNN picks its kernels before capture
                self._net(dev_in)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            dev_out = self._net(dev_in)
        # Zeroed, so rows past a short batch hold finite values (never uninitialised memory).
        host_in = torch.zeros((size, *item), dtype=torch.float32, pin_memory=True)
        host_out = torch.empty(tuple(dev_out.shape), dtype=torch.float32, pin_memory=True)
        return _Slot(graph, dev_in, dev_out, host_in, host_out, torch.cuda.Event())

    def _slot_for(self, n: int) -> tuple[int, _Slot] | None:
        sizes = [s for s in sorted(self._slots) if s >= n]
        if not sizes:
            return None
        size = sizes[0]
        i = self._next[size]
        self._next[size] = (i + 1) % len(self._slots[size])
        slot = self._slots[size][i]
        if slot.pending is not None:  # free the slot: read its last outputs before reuse
            slot.pending.result()
            slot.pending = None
        return size, slot

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        import torch

        x = feeds[self.spec.inputs[0].name]
        n = int(x.shape[0])
        stream = _as_torch_stream(stream) if stream is not None else self._stream
        name = self.spec.outputs[0].name
        picked = self._slot_for(n)
        try:
            if picked is not None:
                _, slot = picked
                slot.host_in[:n].numpy()[...] = x  # host copy into pinned memory
                with torch.cuda.stream(stream):
                    slot.dev_in.copy_(slot.host_in, non_blocking=True)
                    slot.graph.replay()
                    slot.host_out.copy_(slot.dev_out, non_blocking=True)
                    slot.event.record(stream)
                handle = _TorchHandle(slot.event, slot.host_out, n, name)
                slot.pending = handle
                return handle
            if n > self._eager_max:
                raise InferenceFailed(f"batch of {n} exceeds every profile of {self.spec.model_id}")
            return self._eager(x, stream, name)
        except RuntimeError as exc:
            raise InferenceFailed(f"torch inference failed: {exc}") from exc

    def _eager(self, x: np.ndarray, stream: Any, name: str) -> InferHandle:
        import torch

        host_in = torch.from_numpy(np.ascontiguousarray(x)).pin_memory()
        with torch.no_grad(), torch.cuda.stream(stream):
            dev_in = host_in.to(self._net.conv1.weight.device, non_blocking=True)
            out = self._net(dev_in)
            host_out = torch.empty(tuple(out.shape), dtype=torch.float32, pin_memory=True)
            host_out.copy_(out, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return _TorchHandle(event, host_out, x.shape[0], name, keepalive=host_in)

    def _deactivate(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._slots.clear()
        self._net = None
        self._stream = None


def _as_torch_stream(stream: Any) -> Any:
    """Accept a torch stream, or a raw CUDA stream handle (e.g. from cuda-python)."""
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return stream
    if isinstance(stream, int) or hasattr(stream, "getPtr"):
        ptr = int(stream.getPtr()) if hasattr(stream, "getPtr") else stream
        return torch.cuda.ExternalStream(ptr)
    raise RunnerStateError(f"unsupported stream object {type(stream).__name__}")
