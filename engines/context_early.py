"""The CUDA context made while ``import torch`` runs, instead of after it.

A cached start's first engine step imports torch (Python work: it holds the GIL) and then
makes the device's CUDA context on its first tensor (driver work). cuda-python's driver calls
release the GIL, so a thread can make that context, the device's *primary* context, which
torch's runtime then adopts, during the import instead of after it
(bench/cuda_start_probe.py measures both orders).

``KTW_CUDA_CONTEXT_EARLY=0`` turns it off. Best effort: where cuda-python is missing or a call
fails, the thread logs one line and torch makes the context itself as before. The retained
context is never released: torch's runtime holds the same one for the life of the process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger("engines")
_started: dict[int, threading.Thread] = {}
_lock = threading.Lock()


def begin_context(index: int) -> threading.Thread | None:
    """Start making device ``index``'s primary context in a daemon thread, once per process,
    and only while torch is not imported yet (after that torch makes its own in no more time
    than the thread would). Returns the thread, or None where nothing was started."""
    if "torch" in sys.modules or os.environ.get("KTW_CUDA_CONTEXT_EARLY", "1") == "0":
        return None
    with _lock:
        if index in _started:
            return None
        thread = threading.Thread(target=_retain_primary, args=(index,), daemon=True,
                                  name=f"cuda-context-{index}")
        _started[index] = thread
    thread.start()
    return thread


def _retain_primary(index: int) -> None:
    t0 = time.monotonic()
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        log.info("cuda_context_early: cuda-python does not import (%s); torch makes it", exc)
        return
    err, = driver.cuInit(0)
    if int(err) == 0:
        err, device = driver.cuDeviceGet(index)
    if int(err) == 0:
        err, _ctx = driver.cuDevicePrimaryCtxRetain(device)
    if int(err) != 0:
        log.info("cuda_context_early: device %d: %s; torch makes the context", index, err)
        return
    log.info("cuda_context_early: device %d in %.3f s", index, time.monotonic() - t0)
