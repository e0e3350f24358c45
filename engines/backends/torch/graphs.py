"""CUDA-graph slots for :class:`engines.backends.torch.runner.TorchRunner`: capture and replay.

A slot owns one captured graph with its static device inputs and output and their pinned host
mirrors, for one batch size and item shape. Replay = host rows into the pinned inputs, then on
one stream: host -> device copies, graph replay, device -> host copy, an event; the returned
:class:`~engines.backends.base.EventHandle` waits for that event only. A slot is refilled only
after its previous handle's outputs were read (``retire``), so batches in flight never share
memory. Host inputs start as valid rows (id 1 for integer inputs such as token ids and masks,
0 for float inputs), so the rows past a short batch are always finite to compute; their outputs
are dropped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.backends.base import EventHandle
from engines.exceptions import RunnerStateError

# One capture at a time in a process. Entering torch.cuda.graph synchronises the whole device
# and empties the allocator's cache, which CUDA refuses while any stream is capturing (and
# which then invalidates that capture); with both tasks in one process, their engines can
# capture at once (warm-ups, a shape's first use). Eager work on other threads goes on
# meanwhile: captures are thread_local.
_CAPTURE_LOCK = threading.Lock()


def empty_cache() -> None:
    """``torch.cuda.empty_cache()`` between captures, never during one: freeing device memory
    synchronises the device."""
    import torch

    with _CAPTURE_LOCK:
        torch.cuda.empty_cache()


@dataclass
class GraphSlot:
    graph: Any  # torch.cuda.CUDAGraph
    dev_in: list[Any]
    dev_out: Any
    host_in: list[Any]  # pinned
    host_out: Any  # pinned
    event: Any
    name: str  # the output tensor's name
    pending: EventHandle | None = None

    @property
    def size(self) -> int:
        return int(self.host_in[0].shape[0])

    def fits(self, arrays: list[np.ndarray]) -> bool:
        """Whether ``arrays`` (rows <= this slot's batch size) have this slot's item shapes."""
        return arrays[0].shape[0] <= self.size and all(
            tuple(h.shape[1:]) == a.shape[1:] for h, a in zip(self.host_in, arrays, strict=True))

    def retire(self) -> None:
        """Read the slot's previous outputs (if not yet) before its buffers are reused."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def launch(self, arrays: list[np.ndarray], stream: Any) -> EventHandle:
        import torch

        self.retire()
        n = arrays[0].shape[0]
        for host, a in zip(self.host_in, arrays, strict=True):
            host[:n].numpy()[...] = a
        with torch.cuda.stream(stream):
            for dev, host in zip(self.dev_in, self.host_in, strict=True):
                dev.copy_(host, non_blocking=True)
            self.graph.replay()
            self.host_out.copy_(self.dev_out, non_blocking=True)
            self.event.record(stream)
        self.pending = EventHandle(self.event, self.host_out, self.name, n)
        return self.pending


def sample_input(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Plausible inputs for warm-up and capture: id 1 for integer inputs; normal values for
    float ones (x500 for a 1-D input: timesteps mid-range)."""
    if np.issubdtype(np.dtype(dtype), np.integer):
        return np.ones(shape, dtype=dtype)
    # Drawn in float32 (4x faster than float64 then a cast: 0.2 s instead of 0.9 s for one
    # batch of 128 images, paid per graph at start-up).
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    if len(shape) == 1:
        x *= 500.0
    return x


def capture(fn: Any, dev_in: list[Any], *, pool: Any = None, warmup: int = 3,
            stream: Any = None) -> tuple[Any, Any]:
    """(graph, its output tensor): ``fn`` warmed up on a side stream (cuDNN/cuBLAS choose
    kernels, torch.compile compiles), then captured reading ``dev_in`` (into ``pool``, when
    graphs share one). ``stream``: warm up and capture on it instead (a stream of an SM
    partition, engines.gpu_partition: the kernels are chosen for the partition's SMs, and the
    graph keeps its partition)."""
    import torch

    device = dev_in[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    side = stream if stream is not None else _warmup_stream(index)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*dev_in)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another batch thread may run other engines while this one captures.
    with _CAPTURE_LOCK:
        on = stream if stream is not None else _capture_stream(index)
        with torch.no_grad(), torch.cuda.graph(graph, pool=pool, stream=on,
                                               capture_error_mode="thread_local"):
            dev_out = fn(*dev_in)
    return graph, dev_out


# Warm-up and capture run on streams made here (cudaStreamCreate), not on torch's pooled
# streams: torch.cuda.Stream() hands out 32 pooled streams per priority round-robin to every
# caller, and torch.cuda.graph captures on one of them, so another thread's pooled stream can
# be the stream under capture; waiting on it then fails ("dependency created on uncaptured
# work in another stream") and launching on it joins the graph. One warm-up stream per thread
# and device; one capture stream per device, used under _CAPTURE_LOCK.
_local = threading.local()
_CAPTURE_STREAMS: dict[int, Any] = {}


def _own_stream(index: int) -> Any:
    import torch

    from engines.cudart import Stream

    with torch.cuda.device(index):
        made = Stream()
    return cuda_module().ExternalStream(made.ptr, device=torch.device("cuda", index))


def _warmup_stream(index: int) -> Any:
    return _stream_of(_local.__dict__.setdefault("streams", {}), index)


def _capture_stream(index: int) -> Any:
    return _stream_of(_CAPTURE_STREAMS, index)


def _stream_of(streams: dict[int, Any], index: int) -> Any:
    if index not in streams:
        streams[index] = _own_stream(index)
    return streams[index]


def capture_graph(fn: Any, dev_in: list[Any], name: str, *, pool: Any = None, warmup: int = 3,
                  stream: Any = None) -> GraphSlot:
    """A slot: :func:`capture` plus pinned host mirrors of the inputs and the output."""
    import torch

    graph, dev_out = capture(fn, dev_in, pool=pool, warmup=warmup, stream=stream)
    host_in = [torch.full(tuple(t.shape), 0 if t.dtype.is_floating_point else 1,
                          dtype=t.dtype, pin_memory=True) for t in dev_in]
    host_out = torch.empty(tuple(dev_out.shape), dtype=dev_out.dtype, pin_memory=True)
    return GraphSlot(graph, dev_in, dev_out, host_in, host_out, cuda_module().Event(), name)


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
