"""CUDA-graph slots for :mod:`engines.backends.torch.module_runner`: capture, replay, handles.

A slot owns one captured graph and its device and pinned host buffers for one (batch size,
item shape). Host buffers start as valid inputs (token id 1, mask 1; zero pixels), so the rows
past a short batch are always finite to compute; their outputs are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.backends.base import Outputs
from engines.exceptions import RunnerStateError
from engines.spec import EngineSpec


class SlotHandle:
    __slots__ = ("_event", "_host_out", "_keepalive", "_n", "_name", "_value")

    def __init__(self, event: Any, host_out: Any, n: int, name: str, keepalive: Any = None
                 ) -> None:
        self._event, self._host_out, self._n, self._name = event, host_out, n, name
        self._keepalive = keepalive  # host inputs of an eager run, alive until H2D is done
        self._value: Outputs | None = None

    def done(self) -> bool:
        return self._value is not None or bool(self._event.query())

    def result(self, timeout: float | None = None) -> Outputs:
        if self._value is None:
            self._event.synchronize()
            self._value = {self._name: self._host_out[: self._n].numpy().copy()}
        return self._value

    @classmethod
    def eager(cls, net: Any, arrays: list[np.ndarray], stream: Any, name: str) -> SlotHandle:
        import torch

        device = next(net.parameters()).device
        host = [torch.from_numpy(a).pin_memory() for a in arrays]
        with torch.no_grad(), torch.cuda.stream(stream):
            out = net(*(h.to(device, non_blocking=True) for h in host))
            host_out = torch.empty(tuple(out.shape), dtype=torch.float32, pin_memory=True)
            host_out.copy_(out, non_blocking=True)
            event = cuda_module().Event()
            event.record(stream)
        return cls(event, host_out, arrays[0].shape[0], name, keepalive=host)


@dataclass
class GraphSlot:
    graph: Any
    dev_in: list[Any]
    dev_out: Any
    host_in: list[Any]
    host_out: Any
    event: Any
    name: str
    pending: SlotHandle | None = None

    def release(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def run(self, arrays: list[np.ndarray], stream: Any) -> SlotHandle:
        import torch

        n = arrays[0].shape[0]
        for host, a in zip(self.host_in, arrays, strict=True):
            host[:n].numpy()[...] = a
        with torch.cuda.stream(stream):
            for dev, host in zip(self.dev_in, self.host_in, strict=True):
                dev.copy_(host, non_blocking=True)
            self.graph.replay()
            self.host_out.copy_(self.dev_out, non_blocking=True)
            self.event.record(stream)
        self.pending = SlotHandle(self.event, self.host_out, n, self.name)
        return self.pending


def capture_slot(net: Any, spec: EngineSpec, size: int, item: tuple[int, ...], device: Any
                 ) -> GraphSlot:
    import torch

    host_in = []
    for t in spec.inputs:
        dtype = getattr(torch, t.dtype)
        fill = 1 if not dtype.is_floating_point else 0
        host_in.append(torch.full((size, *item), fill, dtype=dtype, pin_memory=True))
    dev_in = [h.to(device) for h in host_in]
    side = cuda_module().Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # warm-up: kernels are chosen and workspaces allocated first
            net(*dev_in)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        dev_out = net(*dev_in)
    host_out = torch.empty(tuple(dev_out.shape), dtype=torch.float32, pin_memory=True)
    return GraphSlot(graph, dev_in, dev_out, host_in, host_out, cuda_module().Event(),
                     spec.outputs[0].name)


def as_torch_stream(stream: Any) -> Any:
    """Accept a torch stream, or a raw CUDA stream handle (e.g. from cuda-python)."""
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return stream
    if isinstance(stream, int) or hasattr(stream, "getPtr"):
        ptr = int(stream.getPtr()) if hasattr(stream, "getPtr") else stream
        return cuda_module().ExternalStream(ptr)
    raise RunnerStateError(f"unsupported stream object {type(stream).__name__}")


def cuda_module() -> Any:
    """``torch.cuda`` as Any: its stream and event constructors are unannotated, and whether
    mypy sees them depends on torch being installed where it runs."""
    import torch

    return torch.cuda
