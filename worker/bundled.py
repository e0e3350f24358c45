"""The sample photos shipped inside the package (worker/samples): the demo's jobs, warm-up
inputs, conformance inputs and the int8 engine's fallback calibration set."""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def samples_dir() -> Path:
    return Path(str(importlib.resources.files("worker").joinpath("samples")))
