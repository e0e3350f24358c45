"""Short batches first on a GPU shared by the tasks of one process.

A process serving several tasks (``processing.task = "moderation,generation"``) runs their
batches on one GPU. A generation batch is many UNet steps (20 steps of ~10 ms each on an H200);
queued behind it, a moderation batch would wait the whole batch. Instead each batch of a task
that does not yield (moderation) holds a claim from its submit to its outcome, and the task
that yields (generation, ``yields_gpu`` in :mod:`worker.tasks.registry`) calls
:meth:`GpuShare.yield_turn` before each step, which waits while any claim is held: the
moderation batch's kernels are queued between two denoising steps instead of behind all of
them. The wait is bounded per step (``processing.gpu_yield_ms``) so a steady stream of
moderation batches slows generation down but never starves it.

With one task per process nobody builds a share: the tasks' hooks are no-ops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal


class GpuShare:
    def __init__(self, max_wait_s: float, free_sms: int = 0, *, disjoint: bool = False,
                 priority: bool | Literal["auto"] = "auto") -> None:
        self.max_wait_s = max_wait_s
        # SMs the yielding task's engines leave free for the others (processing.gpu_free_sms),
        # whether the others keep to them (processing.gpu_disjoint_sms), and whether the
        # others' streams go first (processing.gpu_priority: see ``urgent``)
        self.free_sms = free_sms
        self.disjoint = disjoint
        self.priority = priority
        # Set by the yielding task once its engines do leave free_sms free (on the GPU, with
        # a backend that can): the SMs the others may keep to. 0 until then.
        self.left_free = 0
        self._claims = 0
        self._cond = threading.Condition()
        self.yields = 0  # steps that waited
        self.waited_s = 0.0  # their waits, together

    @property
    def urgent(self) -> bool:
        """Whether the tasks that do not yield make their CUDA streams at the device's highest
        priority. "auto": only where the yielding task left no SMs free (read it after the
        yielding tasks shared: with SMs free, a priority also sends the others' blocks onto
        the yielding task's SMs ahead of its own)."""
        return not self.left_free if self.priority == "auto" else self.priority

    @property
    def claims(self) -> int:
        return self._claims

    def claim(self) -> Callable[[], None]:
        """A batch that must not queue behind a yielding task's steps starts; call what this
        returns once it finished (further calls do nothing)."""
        with self._cond:
            self._claims += 1
        released = [False]

        def release() -> None:
            with self._cond:
                if released[0]:
                    return
                released[0] = True
                self._claims -= 1
                if self._claims == 0:
                    self._cond.notify_all()

        return release

    def yield_turn(self, max_wait_s: float | None = None) -> float:
        """Before a step of a yielding task: wait while claims are held, at most
        ``max_wait_s`` (the share's own when None); the seconds waited."""
        bound = self.max_wait_s if max_wait_s is None else max_wait_s
        with self._cond:
            if self._claims == 0 or bound <= 0:
                return 0.0
            t = time.monotonic()
            self._cond.wait_for(lambda: self._claims == 0, bound)
            waited = time.monotonic() - t
            self.yields += 1
            self.waited_s += waited
            return waited
