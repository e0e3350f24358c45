"""Begin importing torch while the worker does the rest of its start-up.

``import torch`` is 1.4-1.8 s of a 4-6 s warm start on the H200 (bench/NOTES.md, 2026-12-02);
the task imports it in its warm-up, after the worker has built its clients and checked its
topics. Started in a thread as soon as the config says the engine needs torch, the import
overlaps those steps (they wait on the broker, and much of the import is loading native
libraries); the warm-up's own ``import torch`` then finds it done or waits on the import lock.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

from worker.config import WorkerConfig
from worker.config.model import TORCH_NETWORK_BACKENDS


def needs_torch(cfg: WorkerConfig) -> bool:
    if cfg.processing.task == "generation":
        return cfg.generation.on_cuda
    return cfg.model.backend in TORCH_NETWORK_BACKENDS


def preload_torch(cfg: WorkerConfig) -> threading.Thread | None:
    """The importing thread (a daemon), or None where the engine does not use torch."""
    if not needs_torch(cfg):
        return None
    thread = threading.Thread(target=_import, args=("torch",), name="preload-torch",
                              daemon=True)
    thread.start()
    return thread


def _import(name: str) -> None:
    # A failure is the engine's own import's to report, with its context (BackendUnavailable).
    with contextlib.suppress(Exception):
        importlib.import_module(name)
