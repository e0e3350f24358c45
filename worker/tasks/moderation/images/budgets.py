"""Budgets for images that cost CPU time and memory rather than bytes.

The byte limits (limits.max_image_bytes, the intake's watermark) count compressed bytes, and
the size check counts one frame's pixels; a small file can still decode for seconds or to
gigabytes. Three guards close that, all answering ``bad_image`` with a one-line reason:

- Counts read from the headers before anything is decoded (:func:`admit`): a progressive
  JPEG's scans (:func:`~.jpeg_tables.too_many_scans`) and a PNG's frame controls, fcTL chunks
  with or without an acTL (:func:`~.png_rows.count_frames`), against the frame limits.
- Decoded pixels (:class:`PixelBudget`), shared by every thread of the process that decodes
  (the decode pools of open_nsfw and CLIP alike; decoding memory is the process's): a job
  waits, first come first served, until the pixels it will hold fit, so together the decodes
  never hold more. A job needing more than the whole budget is refused, not decoded alone:
  alone it would still break the bound the budget is for, and every other job would wait on
  it; the same rule as the per-image pixel limit.
- A decode time limit per job (:class:`DecodeGuard`), counted once the job holds its pixels
  (waiting for them is not its fault). A Pillow decode is C code that cannot be interrupted
  or killed in a thread, so the limit is checked where the decode comes back to Python: each
  time the decoder pulls compressed input (:class:`TimedBytes`: every 64 KiB Pillow feeds
  libjpeg, zlib or an APNG frame's chunks) and before each sampled frame's views are built.
  It cannot stop one C call that is already running: the output pass of a progressive JPEG
  after its last input, one WebP frame, the inflate of one 64 KiB block. Those are bounded
  by the counts and sizes checked first; the time limit catches what slips between them.
"""

from __future__ import annotations

import io
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from worker.config.moderation import DECODE_PIXEL_BUDGET, DECODE_TIME_LIMIT_S
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.jpeg_tables import too_many_scans
from worker.tasks.moderation.images.png_rows import count_frames

if TYPE_CHECKING:
    from worker.config import WorkerConfig


class PixelBudget:
    """Decoded pixels the holders may hold together, at most ``capacity``: a weighted semaphore
    served in arrival order (a large job is not starved by a stream of small ones)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a pixel budget must be positive")
        self.capacity = capacity
        self.peak = 0  # the most held at once so far (tests, diagnostics)
        self._held = 0
        self._line: deque[object] = deque()
        self._cond = threading.Condition()

    @property
    def held(self) -> int:
        with self._cond:
            return self._held

    def admit(self, pixels: int) -> None:
        """Refuse a job that could never hold its pixels."""
        if pixels > self.capacity:
            raise ImageRejected(f"decoding needs {pixels} pixels at once, over the decode "
                                f"budget of {self.capacity} (moderation.decode_pixel_budget)")

    @contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        """Hold ``pixels`` for the block, waiting for them first."""
        self.admit(pixels)
        ticket = object()
        with self._cond:
            self._line.append(ticket)
            try:
                self._cond.wait_for(lambda: self._line[0] is ticket
                                    and self._held + pixels <= self.capacity)
                self._held += pixels
                self.peak = max(self.peak, self._held)
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()  # the next in line may fit as well
        try:
            yield
        finally:
            with self._cond:
                self._held -= pixels
                self._cond.notify_all()


_local = threading.local()  # this thread's decode deadline and limit, while it decodes


def check_time() -> None:
    """Refuse the job this thread is decoding once its time limit has passed (no-op outside
    :meth:`DecodeGuard.decoding`)."""
    deadline: float | None = getattr(_local, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise ImageRejected(f"decoding took over its {_local.limit:g} s limit "
                            "(moderation.decode_time_limit_s)")


class TimedBytes(io.BytesIO):
    """The image's bytes, as Pillow reads them: every read checks the time limit."""

    def read(self, size: int | None = -1, /) -> bytes:
        check_time()
        return super().read(size)


@dataclass(frozen=True, slots=True, eq=False)
class DecodeGuard:
    budget: PixelBudget
    time_limit_s: float

    @contextmanager
    def decoding(self, pixels: int) -> Iterator[None]:
        """Hold ``pixels`` of the budget and run the block under the time limit."""
        if getattr(_local, "deadline", None) is not None:
            yield  # already decoding on this thread: its pixels and deadline are held
            return
        with self.budget.hold(pixels):
            _local.deadline = time.monotonic() + self.time_limit_s
            _local.limit = self.time_limit_s
            try:
                yield
            finally:
                _local.deadline = None


@cache
def shared_guard(pixels: int, seconds: float) -> DecodeGuard:
    """One guard per setting for the whole process: the tasks that decode (open_nsfw, CLIP)
    share one budget, as they share the memory."""
    return DecodeGuard(PixelBudget(pixels), seconds)


def default_guard() -> DecodeGuard:
    """The guard with the config's defaults (callers given no guard: tools, warm-up)."""
    return shared_guard(DECODE_PIXEL_BUDGET, DECODE_TIME_LIMIT_S)


def guard_for(cfg: WorkerConfig) -> DecodeGuard:
    m = cfg.moderation
    return shared_guard(m.decode_pixel_budget, m.decode_time_limit_s)


def admit(data: bytes, fmt: str | None, size: tuple[int, int], frames: int, *,
          max_pixels: int, max_frames: int, sampled: int, guard: DecodeGuard,
          scans_checked: bool = False) -> int:
    """Checks on the headers before anything is decoded; the pixels the decode will hold at
    once (for :meth:`DecodeGuard.decoding`). ``frames``: what the decoder reports;
    ``sampled``: the most frames whose views are kept; ``scans_checked``: a JPEG's scans were
    already counted against the limit (:func:`~.cpu.jpeg_plain`'s walk refuses more), so they
    are not searched for again. Raises :class:`ImageRejected`.

    Frames are the larger of the decoder's count and a PNG's fcTL chunks, against the same
    limits as an animation's: at most ``max_frames``, and all of them together at most four
    times ``max_pixels``. The pixels held: the sampled frames' views (an animation's) plus the
    canvas the decoder composes the next frame on."""
    width, height = size
    if fmt == "PNG":
        counted = count_frames(data, max_frames)
        if counted > max_frames:
            raise ImageRejected(f"PNG with over {max_frames} frame controls (fcTL) exceeds "
                                f"the maximum {max_frames} frames")
        if counted * width * height > max_pixels * 4:
            raise ImageRejected(f"PNG with {counted} frame controls (fcTL) of {width}x{height} "
                                "exceeds the pixel budget")
        frames = max(frames, counted)
    elif fmt in ("JPEG", "MPO") and not scans_checked:
        reason = too_many_scans(data)
        if reason is not None:
            raise ImageRejected(reason)
    held = min(frames, sampled) + (1 if frames > 1 else 0)
    pixels = width * height * held
    guard.budget.admit(pixels)
    return pixels
