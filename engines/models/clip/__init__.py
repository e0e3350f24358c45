"""CLIP from a local Hugging Face folder: the folder, config and networks' builds
(:mod:`.build`), the image and text specs (:mod:`.spec`), the native torch towers (:mod:`.net`,
imports torch) and the engines (:mod:`.engine`)."""

from __future__ import annotations

from engines.models.clip.build import (
    MEAN,
    STD,
    ClipConfig,
    build_towers,
    check_folder,
    read_config,
    vit_b32_vision,
)
from engines.models.clip.spec import IMAGE_ID, TEXT_ID, clip_specs

__all__ = ["IMAGE_ID", "MEAN", "STD", "TEXT_ID", "ClipConfig", "build_towers", "check_folder",
           "clip_specs", "read_config", "vit_b32_vision"]
