"""CLIP's config section, ``moderation.clip``: its image and text towers, from a local Hugging
Face folder (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from worker.config.moderation import ModelSection, increasing
from worker.config.names import BackendName

if TYPE_CHECKING:
    from worker.config import WorkerConfig


class ClipSettings(ModelSection):
    """CLIP image and text towers, from a local Hugging Face folder (nothing is downloaded)."""

    weights_dir: Path | None = None
    backend: BackendName | None = None  # None: follow model.backend
    precision: Literal["fp32", "fp16"] | None = None
    token_buckets: list[int] = Field(default_factory=lambda: [16, 32, 77])
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32])
    # Prompts for "none of the labels": without them the softmax over the labels alone would
    # hand a harmless image's probability mass to some label.
    neutral_prompts: list[str] = Field(default_factory=lambda: [
        "a photo", "an ordinary everyday photo", "a photo of people, objects or scenery"])

    @model_validator(mode="after")
    def _sizes(self) -> ClipSettings:
        increasing("token_buckets", self.token_buckets, hi=77)
        increasing("batch_sizes", self.batch_sizes, hi=4096)
        if not self.neutral_prompts:
            raise ValueError("neutral_prompts must not be empty")
        return self

    def unserved(self) -> str | None:
        if self.weights_dir is None:
            return "moderation.clip.weights_dir is not set (no CLIP weights ship with the worker)"
        return None


def settings_of(cfg: WorkerConfig) -> ClipSettings:
    """``moderation.clip`` of ``cfg``."""
    return cfg.moderation.section("clip", ClipSettings)
