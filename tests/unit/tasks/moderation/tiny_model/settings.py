"""``moderation.tiny``: the tiny classifier's input side, weights seed and batch sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from worker.config.moderation import ModelSection, increasing

if TYPE_CHECKING:
    from worker.config import WorkerConfig


class TinySettings(ModelSection):
    size: int = Field(8, ge=1, le=64)  # images are resized to size x size
    seed: int = Field(0, ge=0)  # the random weights (and the model id)
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 4])

    @model_validator(mode="after")
    def _sizes(self) -> TinySettings:
        increasing("batch_sizes", self.batch_sizes, hi=64)
        return self


def settings_of(cfg: WorkerConfig) -> TinySettings:
    return cfg.moderation.section("tiny", TinySettings)
