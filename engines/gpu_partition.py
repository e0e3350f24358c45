"""A stream whose kernels run on part of the GPU's SMs (a CUDA green context).

Two tasks in one process share the GPU: moderation's short, latency-bound batches and
generation's long UNet steps. A stream priority only orders blocks that wait for an SM; a
kernel already running keeps its SMs until it ends, so a moderation kernel queued behind a
generation kernel that fills the device waits for it. A green context holds a fixed subset of
the SMs: generation's streams made here leave the rest free, and moderation's kernels (on the
primary context, every SM) always find those free. Moderation may also be kept to that rest
(:func:`shared_rest`, a green context of the SMs the partition leaves), so that the two never
share an SM: generation's kernels then never wait for moderation's either.

Built on cuda-python's driver bindings (the card's CUDA binding; torch's own wrapper is beta
and its API changed between releases). Imported lazily by the GPU backends only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from engines.cudart import check
from engines.exceptions import BackendUnavailable, EngineError


def _driver() -> Any:
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        raise BackendUnavailable("cuda-python's driver bindings do not import") from exc
    return cu


@dataclass
class SmPartition:
    """A green context of ``sms`` of the device's ``total`` SMs and the streams made in it.

    Work launched on those streams, and every CUDA graph captured on one of them (a graph
    keeps the partition of the stream it was captured on, wherever it is replayed), runs on
    the partition's SMs only."""

    device: int
    sms: int
    total: int
    ctx: Any
    streams: list[Any] = field(default_factory=list)
    # The SMs this partition leaves, as the driver's resource (from the same split, so a
    # green context made of it never shares an SM with this one); None for such a rest.
    rest: Any = None

    @property
    def left(self) -> int:
        """SMs this partition's kernels never use."""
        return self.total - self.sms

    def stream(self, priority: int = 0) -> int:
        """A new non-blocking stream in the partition (``priority``: CUDA's, lower is more
        urgent); its raw handle, for ``torch.cuda.ExternalStream``."""
        cu = _driver()
        made = check(cu.cuGreenCtxStreamCreate(
            self.ctx, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, priority),
            "cuGreenCtxStreamCreate")
        self.streams.append(made)
        return int(made)

    def release(self, ptr: int) -> None:
        """Destroy a stream :meth:`stream` made (after its work is done)."""
        for made in self.streams:
            if int(made) == ptr:
                self.streams.remove(made)
                check(_driver().cuStreamDestroy(made), "cuStreamDestroy")
                return

    def close(self) -> None:
        cu = _driver()
        while self.streams:
            check(cu.cuStreamDestroy(self.streams.pop()), "cuStreamDestroy")
        if self.ctx is not None:
            check(cu.cuGreenCtxDestroy(self.ctx), "cuGreenCtxDestroy")
            self.ctx = None


def _sm_resource(device: int) -> tuple[Any, Any]:
    """The device's handle and its whole SM resource (the driver initialised)."""
    cu = _driver()
    try:
        check(cu.cuInit(0), "cuInit")
    except RuntimeError as exc:  # cuda-python finds no driver library at all
        raise BackendUnavailable(f"no CUDA driver: {exc}") from exc
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    res = check(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                 "cuDeviceGetDevResource")
    return dev, res


def _sizes(res: Any) -> tuple[int, int]:
    """An SM resource's count and the granularity a partition of it is rounded to."""
    align = int(getattr(res.sm, "smCoscheduledAlignment", 0) or 0)
    align = align or int(getattr(res.sm, "minSmPartitionSize", 0) or 0) or 8
    return int(res.sm.smCount), align


def device_sms(device: int = 0) -> tuple[int, int]:
    """The device's SM count and the granularity a partition of it is rounded to."""
    return _sizes(_sm_resource(device)[1])


def partition_size(total: int, align: int, leave: int) -> int:
    """The SMs of a partition that leaves at least ``leave`` of ``total`` free: the largest
    multiple of ``align`` that does (a green context's size is rounded to whole groups)."""
    if leave <= 0:
        return total
    sms = ((total - leave) // align) * align
    if sms < align:
        raise EngineError(f"leaving {leave} of {total} SMs free leaves no group of {align} "
                          "for the partition")
    return sms


def sm_partition(leave: int, *, device: int = 0) -> SmPartition:
    """A new green context on the device's SMs less at least ``leave`` of them."""
    cu = _driver()
    dev, res = _sm_resource(device)
    total, align = _sizes(res)
    want = partition_size(total, align, leave)
    groups, n, _rest = check(cu.cuDevSmResourceSplitByCount(1, res, 0, want),
                              "cuDevSmResourceSplitByCount")
    if int(n) < 1:
        raise EngineError(f"the device's {total} SMs do not split into a group of {want}")
    group = groups[0]
    sms = int(group.sm.smCount)
    if total - sms < leave:
        raise EngineError(f"a partition of {want} SMs came out as {sms} of {total}, which "
                          f"leaves fewer than {leave} free")
    return SmPartition(device=device, sms=sms, total=total, ctx=_green_ctx(dev, group),
                       rest=_rest)


def _green_ctx(dev: Any, resource: Any) -> Any:
    cu = _driver()
    desc = check(cu.cuDevResourceGenerateDesc([resource], 1), "cuDevResourceGenerateDesc")
    flags = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
    return check(cu.cuGreenCtxCreate(desc, dev, flags), "cuGreenCtxCreate")


def rest_of(part: SmPartition) -> SmPartition:
    """A new green context of the SMs ``part`` leaves (none of them in ``part``)."""
    if part.rest is None or int(part.rest.sm.smCount) < 1:
        raise EngineError(f"a partition of {part.sms} of {part.total} SMs leaves none to run on")
    dev = check(_driver().cuDeviceGet(part.device), "cuDeviceGet")
    return SmPartition(device=part.device, sms=int(part.rest.sm.smCount), total=part.total,
                       ctx=_green_ctx(dev, part.rest))


# One partition per (device, SMs left free) in a process: a task's engines (text encoder,
# UNet, VAE) each get a stream of their own in the same green context. Kept for the process's
# life, as the primary context is.
_SHARED: dict[tuple[int, int], SmPartition] = {}
_SHARED_REST: dict[tuple[int, int], SmPartition] = {}
_SHARED_LOCK = threading.Lock()


def _shared(key: tuple[int, int]) -> SmPartition:
    if key not in _SHARED:
        _SHARED[key] = sm_partition(key[1], device=key[0])
    return _SHARED[key]


def shared_partition(leave: int, *, device: int = 0) -> SmPartition:
    """The process's partition leaving ``leave`` SMs of ``device`` free (made at first use)."""
    with _SHARED_LOCK:
        return _shared((device, leave))


def shared_rest(leave: int, *, device: int = 0) -> SmPartition:
    """The process's green context of the SMs :func:`shared_partition` (same arguments)
    leaves free: its own streams never run on the partition's SMs (made at first use)."""
    with _SHARED_LOCK:
        key = (device, leave)
        if key not in _SHARED_REST:
            _SHARED_REST[key] = rest_of(_shared(key))
        return _SHARED_REST[key]
