"""Tiny reference networks (seeded) and a diffusers-layout folder saved from them. Every test
here compares the in-house modules with transformers and diffusers: each module skips without
them (``pytest.importorskip`` first thing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def tiny_refs() -> dict[str, Any]:
    """component -> the reference module on the TINY architecture, float32, CPU, seeded."""
    import torch

    from engines.models.sd.arch import TINY
    from engines.models.sd.weights import RandomSdWeights
    from tests.unit.engines.models.sd.modules.sd_references import COMPONENTS, reference

    weights = RandomSdWeights(TINY)
    refs = {}
    for i, component in enumerate(COMPONENTS):
        torch.manual_seed(100 + i)
        refs[component] = reference(component, weights.config(component))
    return refs


@pytest.fixture(scope="module")
def tiny_folder(tiny_refs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.engines.models.sd.modules.sd_references import write_folder

    return write_folder(tmp_path_factory.mktemp("sd-references"), tiny_refs)
