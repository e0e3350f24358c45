"""The tiny SD engines of the generation suite (tests/unit/generation/conftest.py), shared
with the SD engine tests here."""

from __future__ import annotations

from tests.unit.tasks.generation.conftest import engine_cache, ort_engines, torch_engines

__all__ = ["engine_cache", "ort_engines", "torch_engines"]
