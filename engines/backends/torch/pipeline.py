"""Overlapped H2D / compute / D2H on three CUDA streams (cuda-python), for the torch engine.

Per batch size, a ring of slots; each slot owns a pinned host input, a device input, a CUDA
graph (normalisation + network) reading that device input, a device output and a pinned host
output, plus three events. A batch goes:

    host fills slot.host_in ──H2D stream──> dev_in ─(e_h2d)─> compute stream: graph replay
    ─(e_comp)─> D2H stream: dev_out -> host_out ─(e_d2h)─> handle.result()

so batch k+1's copy-in overlaps batch k's compute and batch k-1's copy-out. Nothing is
allocated per batch. A slot is refilled only after its previous outputs were read (the ring
applies backpressure by blocking ``acquire`` when all slots of a size are in flight).
``overlap=False`` runs the same work on one stream, synchronising after each stage: the
serial baseline the benchmark compares against. With ``pixels=True`` the slots take uint8 RGB
NHWC pixels and the graph starts with the spec's own pixel transform
(:attr:`engines.spec.NativeNet.pixel_input`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.backends.torch.artifact import native_net
from engines.backends.torch.graphs import capture
from engines.backends.torch.runner import TorchRunner
from engines.cudart import Event, PinnedBuffer, Stream, check, greatest_stream_priority, runtime
from engines.exceptions import BackendUnavailable, EngineError, InferenceFailed

log = logging.getLogger("engines")


@dataclass
class PipelineSlot:
    size: int
    host_in: PinnedBuffer
    dev_in: Any  # torch tensor on the GPU (graph input)
    dev_out: Any  # torch tensor on the GPU (graph output)
    host_out: PinnedBuffer
    graph: Any
    e_h2d: Event
    e_comp: Event
    e_d2h: Event
    pending: PipelineHandle | None = None
    # Held from acquire() until the outputs are read, so two threads never share a slot.
    free: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.free.set()


class PipelineHandle:
    __slots__ = ("_n", "_slot", "_value")

    def __init__(self, slot: PipelineSlot, n: int) -> None:
        self._slot, self._n = slot, n
        self._value: np.ndarray | None = None

    def done(self) -> bool:
        return self._value is not None or self._slot.e_d2h.query()

    def result(self, timeout: float | None = None) -> np.ndarray:
        if self._value is None:
            self._slot.e_d2h.synchronize()
            self._value = self._slot.host_out.array[: self._n].copy()
            if self._slot.pending is self:
                self._slot.pending = None
                self._slot.free.set()
        return self._value


class TorchPipeline:
    """Three-stream pipeline over an active :class:`TorchRunner`'s network."""

    def __init__(self, runner: TorchRunner, sizes: tuple[int, ...], *, slots: int = 3,
                 pixels: bool = True, overlap: bool = True, urgent: bool = False) -> None:
        self.runner, self.sizes, self.slots_per_size = runner, tuple(sorted(sizes)), slots
        self.pixels, self.overlap = pixels, overlap
        # The three streams at the device's highest priority (engines.cudart.Stream): set
        # before activate(). A graph launched into a stream runs at that stream's priority.
        self.urgent = urgent
        # Set before activate(), with SMs left free by another task's engines: the three
        # streams are made in the green context of those free SMs (engines.gpu_partition
        # .shared_rest) and the graphs captured there, so this pipeline never runs on an SM
        # of the engines that left them. 0: every SM.
        self.on_free_sms = 0
        self.partition: Any = None
        self.partition_error: str | None = None
        self._slots: dict[int, list[PipelineSlot]] = {}
        self._next: dict[int, int] = {}
        self.h2d: Stream | None = None
        self.compute: Stream | None = None
        self.d2h: Stream | None = None
        self._torch_compute: Any = None
        self._pixels_to_input: Any = None
        self._lock = threading.Lock()

    @property
    def item_shape(self) -> tuple[int, ...]:
        return tuple(self.runner.spec.inputs[0].shape[1:])

    def activate(self) -> None:
        import torch

        if not self.runner.active:
            self.runner.activate()
        if self.pixels:
            make = native_net(self.runner.spec).pixel_input
            if make is None:
                raise BackendUnavailable(f"{self.runner.spec.model_id} takes no pixel input")
            # Made before capture: a host-to-device copy cannot happen inside graph capture.
            self._pixels_to_input = make(torch.device(self.runner.device))
        started = time.monotonic()
        self.h2d, self.compute, self.d2h = self._streams()
        self._torch_compute = torch.cuda.ExternalStream(self.compute.ptr)
        for size in self.sizes:
            # One eager pass initialises what a capture cannot (cuDNN and cuBLAS handles, the
            # kernels' choice for the shape); the next slots of the size capture without one.
            self._slots[size] = [self._make_slot(size, warmup=1 if i == 0 else 0)
                                 for i in range(self.slots_per_size)]
            self._next[size] = 0
        # The slots' inputs and captures are on the current stream (see runner._capture for
        # why not the whole device).
        torch.cuda.current_stream(torch.device(self.runner.device)).synchronize()
        log.info("pipeline_activated: %s, %d graphs for batch sizes %s in %.3f s",
                 self.runner.spec.model_id, self.slots_per_size * len(self.sizes),
                 list(self.sizes), time.monotonic() - started)

    def _streams(self) -> tuple[Stream, Stream, Stream]:
        """The three streams: in the free SMs' green context where asked and the driver makes
        one, else on every SM at the pipeline's priority."""
        made = self._partition_streams() if self.on_free_sms else None
        if made is None:
            return Stream(urgent=self.urgent), Stream(urgent=self.urgent), Stream(
                urgent=self.urgent)
        return made

    def _partition_streams(self) -> tuple[Stream, Stream, Stream] | None:
        """The three streams in the green context of the SMs left free, or None where the
        driver refuses the context or a stream in it (a driver without green contexts, say):
        the pipeline then runs on every SM, which costs latency beside generation, never the
        start."""
        import torch

        from engines import gpu_partition

        index = torch.device(self.runner.device).index or 0
        priority = greatest_stream_priority() if self.urgent else 0
        part: Any = None
        ptrs: list[int] = []
        try:
            part = gpu_partition.shared_rest(self.on_free_sms, device=index)
            for _ in range(3):
                ptrs.append(part.stream(priority))
        except EngineError as exc:
            for ptr in ptrs:  # the context is shared: only this pipeline's streams go
                part.release(ptr)
            self.partition_error = str(exc)
            log.warning("pipeline_partition_refused: %s runs on every SM: %s",
                        self.runner.spec.model_id, exc)
            return None
        self.partition = part
        log.info("pipeline_partitioned: %s runs on %d of %d SMs", self.runner.spec.model_id,
                 part.sms, part.total)
        h2d, compute, d2h = (Stream(adopt=ptr, destroy=part.release) for ptr in ptrs)
        return h2d, compute, d2h

    def _forward(self, x: Any) -> Any:
        if self._pixels_to_input is not None:  # uint8 RGB NHWC -> the network's input
            x = self._pixels_to_input(x)
        return self.runner.net(x)

    def _make_slot(self, size: int, *, warmup: int) -> PipelineSlot:
        import torch

        device = torch.device(self.runner.device)
        shape = (size, *self.item_shape)
        dtype = np.uint8 if self.pixels else np.float32
        gen = torch.Generator(device=device).manual_seed(size)
        if self.pixels:
            dev_in = torch.randint(0, 256, shape, device=device, dtype=torch.uint8, generator=gen)
        else:
            dev_in = torch.randn(shape, device=device, generator=gen) * 50
        # In a partition, warmed up and captured on its compute stream (a graph keeps the
        # partition it was captured in; the kernels are chosen for its SMs).
        on = self._torch_compute if self.partition is not None else None
        graph, dev_out = capture(self._forward, [dev_in], warmup=warmup, stream=on)
        host_in = PinnedBuffer(shape, dtype)
        host_out = PinnedBuffer(tuple(dev_out.shape), np.float32)
        return PipelineSlot(size, host_in, dev_in, dev_out, host_out, graph,
                            Event(), Event(), Event())

    def size_for(self, n: int) -> int:
        for size in self.sizes:
            if size >= n:
                return size
        raise InferenceFailed(f"batch of {n} exceeds the pipeline's sizes {self.sizes}")

    def acquire(self, n: int) -> PipelineSlot:
        """The next free slot that holds ``n`` items; waits for its previous batch if needed."""
        size = self.size_for(n)
        while True:
            with self._lock:
                ring = self._slots[size]
                slot = ring[self._next[size]]
                self._next[size] = (self._next[size] + 1) % len(ring)
                if slot.free.is_set():
                    slot.free.clear()
                    break
                pending = slot.pending
            # Every slot of this size is busy: finish the oldest batch, then try again.
            if pending is not None:
                pending.result()
            else:
                slot.free.wait()
        # The H2D copy of the previous use must be done before the host rewrites host_in.
        slot.e_h2d.synchronize()
        return slot

    def release(self, slot: PipelineSlot) -> None:
        """Give back a slot acquired but not launched (e.g. every image in it was bad)."""
        slot.free.set()

    def launch(self, slot: PipelineSlot, n: int, *, input_ready: Event | None = None
               ) -> PipelineHandle:
        """Enqueue a slot whose input is in ``host_in`` (or, with ``input_ready``, already in
        ``dev_in``, written by work that records ``input_ready``)."""
        import torch

        assert self.h2d is not None and self.compute is not None and self.d2h is not None
        rt = runtime()
        h2d, comp, d2h = (self.h2d, self.compute, self.d2h) if self.overlap else (
            self.compute, self.compute, self.compute)
        if input_ready is None:
            nbytes = n * slot.host_in.array[0].nbytes
            check(rt.cudaMemcpyAsync(slot.dev_in.data_ptr(), slot.host_in.ptr, nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyHostToDevice, h2d.handle))
            slot.e_h2d.record(h2d)
            if not self.overlap:
                h2d.synchronize()
            comp.wait(slot.e_h2d)
        else:
            comp.wait(input_ready)
            slot.e_h2d.record(comp)
        stream = self._torch_compute if comp is self.compute else torch.cuda.ExternalStream(
            comp.ptr)
        with torch.cuda.stream(stream):
            slot.graph.replay()
        slot.e_comp.record(comp)
        if not self.overlap:
            comp.synchronize()
        d2h.wait(slot.e_comp)
        out_bytes = n * slot.host_out.array[0].nbytes
        check(rt.cudaMemcpyAsync(slot.host_out.ptr, slot.dev_out.data_ptr(), out_bytes,
                                 rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, d2h.handle))
        slot.e_d2h.record(d2h)
        if not self.overlap:
            d2h.synchronize()
        slot.pending = PipelineHandle(slot, n)
        return slot.pending

    def deactivate(self) -> None:
        for ring in self._slots.values():
            for slot in ring:
                if slot.pending is not None:
                    slot.pending.result()
                slot.host_in.free()
                slot.host_out.free()
                for e in (slot.e_h2d, slot.e_comp, slot.e_d2h):
                    e.destroy()
        self._slots.clear()
        for s in (self.h2d, self.compute, self.d2h):
            if s is not None:
                s.synchronize()
                s.destroy()
        self.h2d = self.compute = self.d2h = None
        self.partition = None
