"""The garbage collector in the worker's process: the heap settled once the engines are warm,
and every collection's pause recorded.

CPython's cyclic collector holds the GIL while it walks the heap, so no other thread runs
Python code meanwhile, the loop and the batch threads alike. A GPU worker's heap is large before
the first job: importing torch and its compiler leaves ~330k tracked objects, and a full
collection walks all of them (200-240 ms on the 2-core VM, ~160 ms on the H200's host). A
backlog of held jobs promotes enough objects to start one every ~10k jobs, and at Python's young
threshold (700) a young collection every few hundred (bench/NOTES.md).
Freezing the heap once warm (``gc.freeze``, which CPython added for servers that fork, and which
serves a long-lived heap the same way: frozen objects are never walked) leaves full collections
with what the loop made since; a higher young threshold makes young ones rare while the jobs,
which are freed by reference counting, come and go.

Process-wide state: :meth:`HeapPolicy.release` restores it when the worker stops, so workers
that run in one process (the tests) leave no frozen heap and no changed threshold behind.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from worker.config import GcSettings
from worker.observe.buckets import LATENCY_BOUNDS, Buckets

# Workers that run side by side in one process (the tests) share the collector: the first to
# settle applies its settings, the last to release restores Python's.
_lock = threading.Lock()
_holders = 0
_saved_threshold: tuple[int, ...] | None = None
_frozen = False


class HeapPolicy:
    def __init__(self, settings: GcSettings) -> None:
        self.settings = settings
        # Per generation, made up front: a scrape iterates this while a collection may observe.
        self.pauses: dict[str, Buckets] = {g: Buckets(LATENCY_BOUNDS) for g in ("0", "1", "2")}
        self._started: float | None = None  # the running collection's start, if seen
        self._held = False

    def settle(self) -> float:
        """Apply the settings and start recording pauses; seconds it took (one full
        collection when freezing, so no garbage is frozen with the heap)."""
        global _holders, _saved_threshold, _frozen
        t = time.monotonic()
        with _lock:
            if not self._held:
                self._held = True
                _holders += 1
                try:
                    if _holders == 1:
                        if self.settings.freeze_after_warm_up:
                            gc.collect()
                            gc.freeze()
                            _frozen = True
                        if self.settings.young_threshold:
                            _saved_threshold = gc.get_threshold()
                            gc.set_threshold(self.settings.young_threshold,
                                             *_saved_threshold[1:])
                except BaseException:
                    self._release_locked()  # no half-applied policy outlives a failed start
                    raise
            if self._on_gc not in gc.callbacks:
                gc.callbacks.append(self._on_gc)
        return time.monotonic() - t

    def release(self) -> None:
        with _lock:
            if self._on_gc in gc.callbacks:
                gc.callbacks.remove(self._on_gc)
            self._release_locked()

    def _release_locked(self) -> None:
        global _holders, _saved_threshold, _frozen
        if not self._held:
            return
        self._held = False
        _holders -= 1
        if _holders == 0:
            if _saved_threshold is not None:
                gc.set_threshold(*_saved_threshold)
                _saved_threshold = None
            if _frozen:
                gc.unfreeze()  # back into the oldest generation: collectable again
                _frozen = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the collector on whichever thread triggered it, with the GIL held and no
        # other collection running, so the plain updates below cannot interleave.
        if phase == "start":
            self._started = time.perf_counter()
            return
        started, self._started = self._started, None
        buckets = self.pauses.get(str(info.get("generation")))
        if started is not None and buckets is not None:  # (a stop whose start came before
            buckets.observe(time.perf_counter() - started)  # the hook was installed: skipped)
