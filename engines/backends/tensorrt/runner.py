"""TensorRT runtime: deserialize, then per batch set_input_shape / set_tensor_address /
execute_async_v3 on the caller's stream, with pinned host staging and cuda-python copies.

One execution context per optimization profile (so batches of different profiles can be in
flight together); each context owns device buffers sized for its profile's largest shape and a
ring of ``slots`` pinned host buffer pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.base import EventHandle, InferHandle, Runner
from engines.backends.tensorrt.shapes import OptShapes, optimization_profiles, profile_index_for
from engines.cache import CacheEntry
from engines.exceptions import BackendUnavailable, InferenceFailed
from engines.profiles import Profile
from engines.spec import EngineSpec

if TYPE_CHECKING:
    from engines.assembly import DeferredLoader, EnginePlan


def make_trt_runner(plan: EnginePlan, engine: DeferredLoader | None) -> TrtRunner:
    """The registry's runner factory: a TensorRT plan only exists as a build, so there is
    always an engine loader (the registry marks the backend ``needs_artifact``)."""
    if engine is None:
        raise BackendUnavailable("the TensorRT runner needs its built plan (an engine loader)")
    return TrtRunner(plan.spec, profiles=plan.profiles, engine=engine, slots=plan.params.slots)


@dataclass
class _Slot:
    host_in: Any  # PinnedBuffer
    host_out: Any
    event: Any
    pending: EventHandle | None = None


@dataclass
class _Context:
    context: Any
    shapes: OptShapes
    dev_in: Any
    dev_out: Any
    out_per_item: int
    ring: list[_Slot] = field(default_factory=list)
    next: int = 0


class TrtRunner(Runner):
    backend = "tensorrt"

    def __init__(self, spec: EngineSpec, *, profiles: tuple[Profile, ...],
                 engine: Callable[[], CacheEntry], slots: int = 2) -> None:
        super().__init__()
        self.spec, self.profiles, self._engine, self._slots = spec, profiles, engine, slots
        self._runtime: Any = None
        self._cuda_engine: Any = None
        self._contexts: list[_Context] = []
        self._stream: Any = None
        self._shapes: list[OptShapes] = []

    def _activate(self) -> None:
        try:
            import tensorrt as trt
        except ImportError as exc:
            raise BackendUnavailable("tensorrt does not import on this machine") from exc
        from engines.cudart import DeviceBuffer, Event, PinnedBuffer, Stream

        entry = self._engine()
        self._hash = f"tensorrt-{entry.key[:12]}"
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._cuda_engine = self._runtime.deserialize_cuda_engine(entry.artifact.read_bytes())
        if self._cuda_engine is None:
            raise InferenceFailed(f"TensorRT could not deserialize {entry.artifact}")
        self._stream = Stream()
        item = self.spec.inputs[0].shape[1:]
        out_item = self.spec.outputs[0].shape[1:]
        per_item_out = int(np.prod(out_item))
        self._shapes = optimization_profiles(self.profiles, item)
        for index, shapes in enumerate(self._shapes):
            ctx = self._cuda_engine.create_execution_context()
            ctx.set_optimization_profile_async(index, self._stream.ptr)
            max_b = shapes.max[0]
            in_elems = int(np.prod(shapes.max))
            c = _Context(ctx, shapes, DeviceBuffer(in_elems * 4),
                         DeviceBuffer(max_b * per_item_out * 4), per_item_out)
            for _ in range(self._slots):
                c.ring.append(_Slot(PinnedBuffer(shapes.max, np.float32),
                                    PinnedBuffer((max_b, *out_item), np.float32), Event()))
            self._contexts.append(c)
        self._stream.synchronize()

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        from engines.cudart import memcpy_d2h, memcpy_h2d

        x = feeds[self.spec.inputs[0].name]
        try:
            c = self._contexts[profile_index_for(self._shapes, tuple(x.shape))]
        except ValueError as exc:
            raise InferenceFailed(str(exc)) from exc
        s = stream if stream is not None else self._stream
        slot = c.ring[c.next]
        c.next = (c.next + 1) % len(c.ring)
        if slot.pending is not None:  # read the slot's previous outputs before reusing it
            slot.pending.result()
        host_in, host_out, event = slot.host_in, slot.host_out, slot.event
        n = int(x.shape[0])
        host_in.array.reshape(-1)[: x.size] = x.reshape(-1)
        in_name, out_name = self.spec.inputs[0].name, self.spec.outputs[0].name
        if not c.context.set_input_shape(in_name, tuple(x.shape)):
            raise InferenceFailed(f"TensorRT rejected input shape {x.shape}")
        c.context.set_tensor_address(in_name, c.dev_in.ptr)
        c.context.set_tensor_address(out_name, c.dev_out.ptr)
        memcpy_h2d(c.dev_in, host_in, x.nbytes, s)
        if not c.context.execute_async_v3(s.ptr):
            raise InferenceFailed("TensorRT execute_async_v3 failed")
        memcpy_d2h(host_out, c.dev_out, n * c.out_per_item * 4, s)
        event.record(s)
        slot.pending = EventHandle(event, host_out, out_name, n)
        return slot.pending

    def _deactivate(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        for c in self._contexts:
            c.dev_in.free()
            c.dev_out.free()
            for slot in c.ring:
                slot.host_in.free()
                slot.host_out.free()
                slot.event.destroy()
        self._contexts.clear()
        self._cuda_engine = None
        self._runtime = None
