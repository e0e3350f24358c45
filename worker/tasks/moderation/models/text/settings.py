"""The text model's config section, ``moderation.text``: its MiniLM engine and chunking."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from worker.config.moderation import ModelSection, increasing
from worker.config.names import BackendName

if TYPE_CHECKING:
    from worker.config import WorkerConfig


class TextSettings(ModelSection):
    """The MiniLM text engine (weights from the `text` extra's package unless model_dir)."""

    backend: BackendName | None = None  # None: follow model.backend
    precision: Literal["fp32", "fp16"] | None = None  # None: fp32 on CPU, fp16 on torch
    model_dir: Path | None = None  # another Hugging Face BERT sentence encoder folder
    token_buckets: list[int] = Field(default_factory=lambda: [16, 32, 64, 128])
    overlap_tokens: int = Field(32, ge=0)
    max_chunks: int = Field(1024, ge=1)  # a text with more is rejected, never truncated
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 128])

    @model_validator(mode="after")
    def _sizes(self) -> TextSettings:
        increasing("token_buckets", self.token_buckets, hi=512)
        increasing("batch_sizes", self.batch_sizes, hi=4096)
        if self.overlap_tokens >= self.token_buckets[-1] // 2:
            raise ValueError("overlap_tokens must be under half the largest token bucket")
        return self


def settings_of(cfg: WorkerConfig) -> TextSettings:
    """``moderation.text`` of ``cfg``."""
    return cfg.moderation.section("text", TextSettings)
