"""CLIP from a local Hugging Face folder (config.json, model.safetensors, tokenizer.json).

No CLIP weights ship on the public package index, so the user names a folder (for example a
copy of openai/clip-vit-base-patch32); nothing is downloaded. Two engines come from it: the
image tower (``clip_image``: pixels -> unit embedding) and the text tower (``clip_text``: token
ids -> unit embedding), each with its own profiles (image size; token-length buckets up to 77).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.exceptions import EngineError, ModelNotFound
from engines.weights import load_safetensors

if TYPE_CHECKING:
    from torch import nn

    from engines.models.clip.net import TowerConfig

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
GRAPH_VERSION = "clip-towers-v1"
# OpenAI CLIP's pixel statistics (every released CLIP uses them).
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def vit_b32_vision() -> TowerConfig:
    """The ViT-B/32 image tower's architecture (for benchmarks on random weights)."""
    from engines.models.clip.net import TowerConfig

    return TowerConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                       num_attention_heads=12, image_size=224, patch_size=32)


@dataclass(frozen=True)
class ClipConfig:
    text: TowerConfig
    vision: TowerConfig
    projection_dim: int
    logit_scale: float  # exp of the checkpoint's log scale (100 for trained CLIPs)


def check_folder(folder: Path, names: tuple[str, ...] = REQUIRED) -> None:
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ModelNotFound(f"CLIP folder {folder} lacks {', '.join(missing)} (Hugging Face "
                            "layout expected: config.json, model.safetensors, tokenizer.json)")


def _tower(raw: dict[str, Any]) -> TowerConfig:
    from engines.models.clip.net import TowerConfig

    names = {f.name for f in fields(TowerConfig)}
    return TowerConfig(**{k: v for k, v in raw.items() if k in names})


def read_config(folder: Path) -> ClipConfig:
    raw = json.loads((folder / "config.json").read_text())
    scale = _trained_log_scale(folder / "model.safetensors")
    if scale is None:
        scale = raw.get("logit_scale_init_value", math.log(1 / 0.07))
    return ClipConfig(_tower(raw.get("text_config", {})), _tower(raw.get("vision_config", {})),
                      int(raw.get("projection_dim", 512)), math.exp(scale))


def _trained_log_scale(weights: Path) -> float | None:
    """The checkpoint's learned log logit scale (the config holds only its initial value)."""
    if not weights.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as f:
        if "logit_scale" not in f.keys():  # noqa: SIM118 - a safetensors handle, not a dict
            return None
        return float(f.get_tensor("logit_scale").reshape(()))


def build_towers(folder: Path) -> tuple[nn.Module, nn.Module, ClipConfig]:
    """(image encoder, text encoder, config) in fp32 on the CPU with the folder's weights."""
    from engines.models.clip.net import ClipImageEncoder, ClipTextEncoder

    check_folder(folder, REQUIRED[:2])
    state = load_safetensors(folder / "model.safetensors")
    cfg = read_config(folder)
    image = ClipImageEncoder(cfg.vision, cfg.projection_dim)
    text = ClipTextEncoder(cfg.text, cfg.projection_dim)
    for net, prefixes in ((image, ("vision_model.", "visual_projection.")),
                          (text, ("text_model.", "text_projection."))):
        part = {k: v for k, v in state.items()
                if k.startswith(prefixes) and not k.endswith("position_ids")}
        missing, unexpected = net.load_state_dict(part, strict=False)
        if missing or unexpected:
            raise EngineError(f"{folder} is not a CLIP checkpoint: missing {sorted(missing)[:4]}"
                              f", unexpected {sorted(unexpected)[:4]}")
        net.eval()
    return image, text, cfg
