"""The ``[engines]`` section: the engine cache and build options."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from worker.config.base import Section


def _default_engine_cache() -> Path:
    base = os.environ.get("KTW_CACHE_DIR") or Path.home() / ".cache" / "kafka-trt-worker"
    return Path(base) / "engines"


class EngineSettings(Section):
    cache_dir: Path = Field(default_factory=_default_engine_cache)
    # Use the engine cache (build once, load after). Off: build in memory at every start.
    use_cache: bool = True
    calibration_dir: Path | None = None  # real sample images for INT8 calibration
    timing_cache: Path | None = None  # TensorRT timing cache (default: inside cache_dir)
    workspace_mb: int = Field(4096, ge=64)
    # aoti: compile with Inductor's max-autotune (minutes per batch size, once). Off: a build in
    # about a minute per size; a different cache key. open_nsfw's 61.8k img/s on the H200 were
    # measured with it; the SD UNet at batch 2 measured slower with it (7.4 against 7.0 ms).
    autotune: bool = True
    in_flight_slots: int = Field(2, ge=1, le=16)  # per batch size, GPU runners
