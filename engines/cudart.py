"""Thin helpers over cuda-python's runtime bindings: checked calls, buffers, streams, events.

Imported lazily by GPU backends and the pipeline; never at package import. Works with
cuda-python 12.x (``cuda.cudart``) and 13.x (``cuda.bindings.runtime``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from engines.exceptions import BackendUnavailable, EngineError


def runtime() -> Any:
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt  # cuda-python 12.x
        except ImportError as exc:
            raise BackendUnavailable("cuda-python does not import") from exc
    return rt


def check(result: Any, what: str | None = None) -> Any:
    """Unpack a cuda-python ``(err, *values)`` tuple, raising on any error; ``what`` names the
    call in the error (a driver call: "cuGreenCtxCreate")."""
    if not isinstance(result, tuple):
        result = (result,)
    err, *rest = result
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise EngineError(f"{what}: CUDA driver error {name}" if what
                          else f"CUDA runtime error {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class DeviceBuffer:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr = int(check(runtime().cudaMalloc(nbytes)))

    def free(self) -> None:
        if self.ptr:
            check(runtime().cudaFree(self.ptr))
            self.ptr = 0


class PinnedBuffer:
    """Page-locked host memory with a numpy view (fast, asynchronous H2D/D2H copies)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> None:
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.ptr = int(check(runtime().cudaMallocHost(self.nbytes)))
        raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)
        self.array: np.ndarray = np.frombuffer(memoryview(raw).cast("B"), dtype=self.dtype)
        self.array = self.array.reshape(shape)
        self.array[...] = 0

    def numpy(self) -> np.ndarray:
        """The host view (as a pinned torch tensor's ``numpy()``)."""
        return self.array

    def free(self) -> None:
        if self.ptr:
            self.array = np.empty(0, self.dtype)
            check(runtime().cudaFreeHost(self.ptr))
            self.ptr = 0


def greatest_stream_priority() -> int:
    """The current device's most urgent stream priority (CUDA orders lower numbers first; 0 is
    the default and least urgent)."""
    _least, greatest = check(runtime().cudaDeviceGetStreamPriorityRange())
    return int(greatest)


class Stream:
    def __init__(self, *, urgent: bool = False, adopt: int | None = None,
                 destroy: Callable[[int], None] | None = None) -> None:
        """``urgent``: the device's highest priority, so that the block scheduler dispatches this
        stream's kernels before those of default-priority streams queued beside them.
        ``adopt``: a stream made elsewhere (a green context's, engines.gpu_partition), by its
        raw handle; ``destroy`` gives it back to its maker."""
        rt = runtime()
        self._destroy = destroy
        if adopt is not None:
            self.handle = rt.cudaStream_t(adopt)
        elif urgent:
            self.handle = check(rt.cudaStreamCreateWithPriority(rt.cudaStreamNonBlocking,
                                                                greatest_stream_priority()))
        else:
            self.handle = check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def wait(self, event: Event) -> None:
        check(runtime().cudaStreamWaitEvent(self.handle, event.handle, 0))

    def synchronize(self) -> None:
        check(runtime().cudaStreamSynchronize(self.handle))

    def destroy(self) -> None:
        if self._destroy is not None:
            self._destroy(self.ptr)
        else:
            check(runtime().cudaStreamDestroy(self.handle))


class Event:
    def __init__(self, timing: bool = False) -> None:
        rt = runtime()
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        self.handle = check(rt.cudaEventCreateWithFlags(flags))

    def record(self, stream: Stream) -> None:
        check(runtime().cudaEventRecord(self.handle, stream.handle))

    def record_on(self, stream_ptr: int) -> None:
        """Record on a stream given by its raw handle (e.g. a torch stream's cuda_stream)."""
        check(runtime().cudaEventRecord(self.handle, stream_ptr))

    def query(self) -> bool:
        rt = runtime()
        (err,) = rt.cudaEventQuery(self.handle)
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        check((err,))
        return True

    def synchronize(self) -> None:
        check(runtime().cudaEventSynchronize(self.handle))

    def elapsed_ms(self, start: Event) -> float:
        return float(check(runtime().cudaEventElapsedTime(start.handle, self.handle)))

    def destroy(self) -> None:
        check(runtime().cudaEventDestroy(self.handle))


def memcpy_h2d(dst: DeviceBuffer, src: PinnedBuffer, nbytes: int, stream: Stream) -> None:
    rt = runtime()
    check(rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                             stream.handle))


def memcpy_d2h(dst: PinnedBuffer, src: DeviceBuffer, nbytes: int, stream: Stream) -> None:
    rt = runtime()
    check(rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                             stream.handle))
