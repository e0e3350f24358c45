"""What the packages are compiled with; part of the cache key (the registry's ``key_flags``),
so it lives apart from the builder and imports nothing heavy."""

from __future__ import annotations

from typing import Any


def inductor_options(device: str, autotune: bool = True) -> dict[str, Any]:
    """max-autotune on CUDA (minutes per shape, once) unless turned off (tests); the CPU build
    keeps Inductor's defaults (autotuning CPU kernels costs more than it gains for the small
    models built there)."""
    return {"max_autotune": True} if autotune and device.startswith("cuda") else {}
