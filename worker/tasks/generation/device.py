"""Where the generation engines run: ``generation.device`` and ``generation.warm_up`` resolved
against the machine when the task is built.

``device = "auto"`` (the default) is ``cuda:0`` when a CUDA device is visible, else the CPU, so
a worker started on a laptop serves jobs instead of failing on a missing GPU. ``warm_up =
"auto"`` runs every static shape before the first poll on a GPU (CUDA graphs captured before any
job waits on them) and none on the CPU, where running every shape of the default sizes and batch
sizes takes minutes and buys nothing (no graphs to capture). A device the machine cannot give is
a :class:`~worker.exceptions.ConfigError` naming the setting to change, raised before any engine
loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from engines.backends.registry import backend
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError

log = structlog.get_logger("worker.tasks.generation")


def cuda_device_count() -> int:
    """CUDA devices torch can see (0 without torch, a driver or a device): torch's own count,
    so the answer is the one the torch runner meets when it loads."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except RuntimeError:  # a broken driver install counts as no device
        return 0


@dataclass(frozen=True, slots=True)
class Placement:
    """The settings with ``device`` and ``warm_up`` made concrete, and why."""

    settings: GenerationSettings
    reason: str


def resolve_device(g: GenerationSettings,
                   cuda_count: Callable[[], int] | None = None) -> Placement:
    """``g`` with ``device`` and ``warm_up`` concrete; raises ConfigError when the configured
    device (or fp16) cannot run on this machine. ``cuda_count``: the probe (default
    :func:`cuda_device_count`, looked up when called)."""
    probe = cuda_count or cuda_device_count
    # Backends that run the torch network (torch, aoti) have a device; ONNX ones the CPU.
    runs_torch = not backend(g.backend).from_onnx
    device, reason = g.device, f"generation.device = {g.device!r}"
    if not runs_torch:
        device, reason = "cpu", f"generation.backend = {g.backend!r} runs on the CPU"
    elif g.device == "auto":
        count = probe()
        device = "cuda:0" if count else "cpu"
        reason = (f"generation.device = 'auto': {count} CUDA device(s) visible" if count
                  else "generation.device = 'auto': no CUDA device is visible")
    elif g.device.startswith("cuda"):
        count = probe()
        index = int(g.device.partition(":")[2] or 0)
        if count == 0:
            raise ConfigError(f"generation.device = {g.device!r} but no CUDA device is visible: "
                              "set generation.device = 'cpu' (or 'auto')")
        if index >= count:
            raise ConfigError(f"generation.device = {g.device!r} but only {count} CUDA "
                              f"device(s) are visible: set generation.device = 'cuda:0' "
                              "(or 'auto')")
    on_cuda = runs_torch and device.startswith("cuda")
    if g.precision == "fp16" and not on_cuda:
        raise ConfigError(f"generation.precision = 'fp16' needs a CUDA device and the engines "
                          f"run on the CPU ({reason}): set generation.precision = 'fp32' (or "
                          "leave it unset)")
    warm_up = g.warm_up
    if warm_up == "auto":
        warm_up = "all_shapes" if on_cuda else "first_use"
    resolved = g.model_copy(update={"device": device, "warm_up": warm_up})
    return Placement(resolved, reason)


def placed(g: GenerationSettings,
           cuda_count: Callable[[], int] | None = None) -> GenerationSettings:
    """:func:`resolve_device`, logged (the start-up log says where the engines run)."""
    p = resolve_device(g, cuda_count)
    s = p.settings
    log.info("generation_device", device=s.device, warm_up=s.warm_up,
             precision=s.effective_precision, backend=s.backend, why=p.reason)
    return s
