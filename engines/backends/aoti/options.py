"""What the packages are compiled with; part of the cache key (the registry's ``key_flags``),
so it lives apart from the builder and imports nothing heavy."""

from __future__ import annotations

from typing import Any


def inductor_options(device: str, autotune: bool = True) -> dict[str, Any]:
    """The weights left out of the compiled library (the bundle stores them once and the load
    binds them: :mod:`engines.backends.aoti.weights`), on every device so that the CPU tests
    take the same path; max-autotune on CUDA (minutes per shape, once) unless turned off
    (tests); the CPU build keeps Inductor's other defaults (autotuning CPU kernels costs more
    than it gains for the small models built there)."""
    tune = {"max_autotune": True} if autotune and device.startswith("cuda") else {}
    return {"aot_inductor.package_constants_in_so": False, **tune}
