"""CUDA-graph slots and result handles for :mod:`engines.models.sd.runner`.

A slot is one captured graph with its static device inputs/outputs and pinned host mirrors.
Replay = pinned host -> device copies, graph replay, device -> pinned host copy, an event; the
handle waits for that event only. Host buffers of a slot are reused only after its previous
handle's outputs were read (``retire``), so batches in flight never share memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.backends.base import Outputs


class CudaHandle:
    __slots__ = ("_event", "_host_out", "_keepalive", "_name", "_value")

    def __init__(self, event: Any, host_out: Any, name: str, keepalive: Any = None) -> None:
        self._event, self._host_out, self._name = event, host_out, name
        self._keepalive = keepalive  # eager inputs stay alive until their copies finished
        self._value: Outputs | None = None

    def done(self) -> bool:
        return self._value is not None or bool(self._event.query())

    def result(self, timeout: float | None = None) -> Outputs:
        if self._value is None:
            self._event.synchronize()
            self._value = {self._name: np.array(self._host_out.numpy(), copy=True)}
            self._keepalive = None
        return self._value


@dataclass
class GraphSlot:
    graph: Any  # torch.cuda.CUDAGraph
    dev_in: list[Any]
    dev_out: Any
    host_in: list[Any]  # pinned
    host_out: Any  # pinned
    event: Any
    pending: CudaHandle | None = None

    def retire(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def launch(self, arrays: list[np.ndarray], stream: Any, name: str) -> CudaHandle:
        import torch

        self.retire()
        for host, a in zip(self.host_in, arrays, strict=True):
            host.numpy()[...] = a
        with torch.cuda.stream(stream):
            for dev, host in zip(self.dev_in, self.host_in, strict=True):
                dev.copy_(host, non_blocking=True)
            self.graph.replay()
            self.host_out.copy_(self.dev_out, non_blocking=True)
            self.event.record(stream)
        self.pending = CudaHandle(self.event, self.host_out, name)
        return self.pending


def capture(fn: Any, dev_in: list[Any], pool: Any, warmup: int = 3) -> GraphSlot:
    """Warm ``fn`` up on a side stream (cuDNN/cuBLAS choose kernels, torch.compile compiles),
    then capture one replayable graph into the runner's shared memory pool."""
    import torch

    device = dev_in[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*dev_in)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another batch thread may run other engines while this one captures.
    with torch.no_grad(), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        dev_out = fn(*dev_in)
    host_in = [torch.zeros(tuple(t.shape), dtype=t.dtype, pin_memory=True) for t in dev_in]
    host_out = torch.empty(tuple(dev_out.shape), dtype=dev_out.dtype, pin_memory=True)
    return GraphSlot(graph, dev_in, dev_out, host_in, host_out, torch.cuda.Event())
