"""torch for any native module with named inputs: CUDA graphs per (batch size, item shape).

The text and CLIP engines take several inputs (token ids and mask) and their static profiles
differ by item shape (a token-length bucket) as well as batch size, so a graph is captured per
(batch size, item shape) and per in-flight slot. Otherwise the same design as
:class:`engines.backends.torch.runner.TorchRunner`: ``infer`` copies into pinned host memory,
enqueues H2D, graph replay and D2H on the caller's stream and records an event; ``result()``
waits for that event only. Shapes without a graph run eagerly on the same stream.
``device="cpu"`` runs eagerly on the CPU in fp32 (no graphs): the same plumbing, testable
without a GPU. torch is imported lazily, in ``activate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engines.backends.base import FutureHandle, InferHandle, Outputs, Runner
from engines.backends.torch.graphs import (
    GraphSlot,
    SlotHandle,
    as_torch_stream,
    capture_slot,
    cuda_module,
)
from engines.exceptions import BackendUnavailable, InferenceFailed
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec

DTYPES = {"fp32": "float32", "fp16": "float16"}


class TorchModuleRunner(Runner):
    backend = "torch"

    def __init__(self, spec: EngineSpec, build: Callable[[], Any], *,
                 profiles: tuple[Profile, ...], identity: Callable[[], str],
                 precision: str = "fp16", device: int | str = 0, slots: int = 2,
                 cuda_graphs: bool = True) -> None:
        super().__init__()
        if precision not in DTYPES:
            raise BackendUnavailable(f"torch backend supports {sorted(DTYPES)}, not {precision}")
        if device == "cpu" and precision != "fp32":
            raise BackendUnavailable("the CPU mode of the torch runner is fp32 only")
        self.spec, self.profiles, self.precision = spec, profiles, precision
        self._build, self._identity, self._device = build, identity, device
        self._slots_per_key, self._cuda_graphs = slots, cuda_graphs
        self._net: Any = None
        self._stream: Any = None
        self._cpu: ThreadPoolExecutor | None = None
        self._slots: dict[tuple[int, tuple[int, ...]], list[GraphSlot]] = {}
        self._next: dict[tuple[int, tuple[int, ...]], int] = {}
        self._hash = ""

    @property
    def engine_hash(self) -> str:
        return self._hash

    @property
    def default_stream(self) -> Any:
        return self._stream

    @property
    def graph_keys(self) -> list[tuple[int, tuple[int, ...]]]:
        return sorted(self._slots)

    def _activate(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailable("torch does not import") from exc
        self._hash = f"torch-{torch.__version__}-{self.precision}-{self._identity()[:12]}"
        net = self._build()
        if self._device == "cpu":
            self._net = net.float().eval()
            self._cpu = ThreadPoolExecutor(1, thread_name_prefix=f"torch-{self.spec.model_id}")
            return
        if not torch.cuda.is_available():
            raise BackendUnavailable("torch backend needs CUDA; none is available")
        device = torch.device("cuda", int(self._device))
        if self.precision == "fp32":  # IEEE fp32, as TorchRunner: no TF32 matmuls
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        dtype = getattr(torch, DTYPES[self.precision])
        self._net = net.to(device=device, dtype=dtype).eval()
        self._stream = cuda_module().Stream(device)
        if not self._cuda_graphs:
            return
        for p in self.profiles:
            if isinstance(p, StaticProfile):
                for size in p.batch_sizes:
                    key = (size, p.item_shape)
                    self._slots[key] = [capture_slot(self._net, self.spec, size, p.item_shape,
                                                     device) for _ in range(self._slots_per_key)]
                    self._next[key] = 0

    def _pick(self, n: int, item: tuple[int, ...]) -> GraphSlot | None:
        sizes = sorted(b for b, shape in self._slots if shape == item and b >= n)
        if not sizes:
            return None
        key = (sizes[0], item)
        i = self._next[key]
        self._next[key] = (i + 1) % len(self._slots[key])
        slot = self._slots[key][i]
        slot.release()  # reads the slot's previous outputs before its buffers are reused
        return slot

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        arrays = [np.ascontiguousarray(feeds[t.name]) for t in self.spec.inputs]
        n, item = int(arrays[0].shape[0]), tuple(int(d) for d in arrays[0].shape[1:])
        if self._cpu is not None:
            return FutureHandle(self._cpu.submit(self._eager_cpu, arrays))
        stream = as_torch_stream(stream) if stream is not None else self._stream
        try:
            slot = self._pick(n, item)
            if slot is not None:
                return slot.run(arrays, stream)
            return SlotHandle.eager(self._net, arrays, stream, self.spec.outputs[0].name)
        except RuntimeError as exc:
            raise InferenceFailed(f"torch inference failed: {exc}") from exc

    def _eager_cpu(self, arrays: list[np.ndarray]) -> Outputs:
        import torch

        with torch.no_grad():
            out = self._net(*(torch.from_numpy(a) for a in arrays))
        return {self.spec.outputs[0].name: out.float().numpy()}

    def _deactivate(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        if self._cpu is not None:
            self._cpu.shutdown(wait=True)
            self._cpu = None
        self._slots.clear()
        self._net = self._stream = None
