"""Helpers for the generation tests: tiny random SD engines on the CPU (torch fp32 and ONNX
Runtime) and settings that match them.

The tiny architecture keeps every SD 1.5 block type; at 64x64 pixels (8x8 latents) a UNet call
takes milliseconds, so whole jobs run in the unit suite. Tests needing torch, diffusers and
transformers (the ``gen`` extra) skip with that reason where they are missing.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from engines.cache import EngineCache
from engines.models.sd.arch import TINY
from engines.models.sd.engines import SdEngineOptions, SdEngines, make_sd_engines
from engines.models.sd.specs import Resolution
from engines.models.sd.weights import RandomSdWeights
from worker.config.generation import GenerationSettings

SIZES = ((64, 64), (128, 64))  # (width, height): square and non-square latents
UNET_SIZES = (2, 4, 8)  # at most 4 images per UNet call: a 5-image job needs two chunks
MISSING = [m for m in ("torch", "tokenizers", "safetensors") if importlib.util.find_spec(m) is None]
needs_sd = pytest.mark.skipif(
    bool(MISSING), reason=f"needs the gen extra ({', '.join(MISSING)} missing): "
                          "pip install 'kafka-trt-worker[gen]'")


def settings(backend: str = "torch", **overrides: Any) -> GenerationSettings:
    base: dict[str, Any] = {
        "random_weights": "tiny", "backend": backend, "device": "cpu",
        "sizes": [{"width": w, "height": h} for w, h in SIZES],
        "unet_batch_sizes": list(UNET_SIZES), "text_batch_sizes": [2, 4, 8],
        "vae_batch_sizes": [1, 2, 4], "max_steps": 30, "png_threads": 2,
        "results_max_bytes": 10_000_000,
    }
    return GenerationSettings(**(base | overrides))


def make_engines(backend: str, cache: EngineCache | None, seed: int = 0) -> SdEngines:
    opts = SdEngineOptions(backend=backend, precision="fp32", device="cpu",
                           intra_op_threads=1, unet_sizes=UNET_SIZES, text_sizes=(2, 4, 8),
                           vae_sizes=(1, 2, 4))
    return make_sd_engines(RandomSdWeights(TINY, seed),
                           tuple(Resolution(w, h) for w, h in SIZES), opts, cache)
