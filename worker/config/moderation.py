"""The ``[moderation]`` config section: the text and CLIP engines and the policies by name.

Cross-section rules live here, checked at start-up: a policy that runs CLIP needs
``moderation.clip.weights_dir`` (no CLIP weights ship with the worker). Whether the text model's
package is installed is checked where the engines are made
(:mod:`worker.tasks.moderation.scoring.policies`), so this
validation never depends on what is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from worker.config.base import Section
from worker.config.policies import PolicySettings
from worker.wire.moderation_codec import POLICY_NAME


class TextSettings(Section):
    """The MiniLM text engine (weights from the `text` extra's package unless model_dir)."""

    backend: Literal["onnxruntime", "torch"] | None = None  # None: follow model.backend
    precision: Literal["fp32", "fp16"] | None = None  # None: fp32 on CPU, fp16 on torch
    model_dir: Path | None = None  # another Hugging Face BERT sentence encoder folder
    token_buckets: list[int] = Field(default_factory=lambda: [16, 32, 64, 128])
    overlap_tokens: int = Field(32, ge=0)
    max_chunks: int = Field(1024, ge=1)  # a text with more is rejected, never truncated
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 128])

    @model_validator(mode="after")
    def _sizes(self) -> TextSettings:
        _increasing("token_buckets", self.token_buckets, hi=512)
        _increasing("batch_sizes", self.batch_sizes, hi=4096)
        if self.overlap_tokens >= self.token_buckets[-1] // 2:
            raise ValueError("overlap_tokens must be under half the largest token bucket")
        return self


class ClipSettings(Section):
    """CLIP image and text towers, from a local Hugging Face folder (nothing is downloaded)."""

    weights_dir: Path | None = None
    backend: Literal["onnxruntime", "torch"] | None = None
    precision: Literal["fp32", "fp16"] | None = None
    token_buckets: list[int] = Field(default_factory=lambda: [16, 32, 77])
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32])
    # Prompts for "none of the labels": without them the softmax over the labels alone would
    # hand a harmless image's probability mass to some label.
    neutral_prompts: list[str] = Field(default_factory=lambda: [
        "a photo", "an ordinary everyday photo", "a photo of people, objects or scenery"])

    @model_validator(mode="after")
    def _sizes(self) -> ClipSettings:
        _increasing("token_buckets", self.token_buckets, hi=77)
        _increasing("batch_sizes", self.batch_sizes, hi=4096)
        if not self.neutral_prompts:
            raise ValueError("neutral_prompts must not be empty")
        return self


def _increasing(name: str, values: list[int], *, hi: int) -> None:
    if not values or values != sorted(set(values)) or values[0] < 1 or values[-1] > hi:
        raise ValueError(f"{name} must be strictly increasing, within 1..{hi}")


# Decoded pixels every thread decoding images in one process may hold at once
# (worker/tasks/moderation/images/budgets.py). At least the largest still image the default
# limits admit (limits.max_image_pixels, 40M), so no such image is refused by default; a job
# whose decode needs more than the whole budget is refused. Measured with decode_views on the
# 2-core VM: a 40M-pixel RGB JPEG peaked at 7 bytes a pixel (0.27 GB), an RGBA PNG with alpha
# (two views) at 20: 64M pixels bound decoding to roughly 0.45-1.3 GB whatever decode_threads
# is, where 2 threads on two such images could take 1.5 GB before and 16 threads 12 GB.
DECODE_PIXEL_BUDGET = 64_000_000
# Per job, from the moment it holds its pixels: the largest images the limits admit took 1.1 s
# (40M-pixel progressive JPEG) and 2.3 s (40M-pixel RGBA PNG) alone on the 2-core VM; 10 s
# leaves room for a loaded machine. A backstop for what the header counts miss (see budgets.py
# for what it can and cannot stop), not the first defence.
DECODE_TIME_LIMIT_S = 10.0


class ModerationSettings(Section):
    text: TextSettings = Field(default_factory=TextSettings)
    clip: ClipSettings = Field(default_factory=ClipSettings)
    decode_pixel_budget: int = Field(DECODE_PIXEL_BUDGET, ge=1_000_000)
    decode_time_limit_s: float = Field(DECODE_TIME_LIMIT_S, gt=0, le=600)
    # Image-and-text policies by name; a name here replaces the same name in model.policies.
    policies: dict[str, PolicySettings] = Field(default_factory=dict)
    # CPU open_nsfw: libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 size (never below the 256 resize)
    # before the resize: a 1080p frame's decode + resize ~4x faster, but scores move (up to
    # 0.047 on real 720p/1080p frames, bench/NOTES.md "DCT scaling"), so it is opt-in.
    jpeg_dct_scaling: bool = False

    @model_validator(mode="after")
    def _resolvable(self) -> ModerationSettings:
        for name, policy in self.policies.items():
            if not POLICY_NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r} can never be named by a job "
                                 f"(pattern {POLICY_NAME.pattern})")
            if "clip" in policy.models and self.clip.weights_dir is None:
                raise ValueError(f"policy {name!r} uses clip but moderation.clip.weights_dir "
                                 "is not set (no CLIP weights ship with the worker)")
        return self
