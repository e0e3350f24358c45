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
from engines.onnx_export import ExportSpec
from engines.weights import load_safetensors

if TYPE_CHECKING:
    from torch import nn

    from engines.models.clip.net import TowerConfig

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
CLIP_GRAPH_VERSION = "clip-towers-v1"
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


class ClipTowers:
    """Builds both towers once and hands out each (the torch runners need one module each)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._built: tuple[Any, Any, ClipConfig] | None = None

    def get(self, index: int) -> Any:
        if self._built is None:
            self._built = build_towers(self.folder)
        return self._built[index]


def pad_token_id(folder: Path) -> int:
    """CLIP pads with its end-of-text token; any id works (attention is causal, the pooled
    token is the last real one), but a real vocabulary id keeps every row valid."""
    raw = json.loads((folder / "config.json").read_text()).get("text_config", {})
    return int(raw.get("pad_token_id", 1) or 0)


def image_export(folder: Path, size: int) -> ExportSpec:
    def example() -> tuple[Any, ...]:
        import torch

        return (torch.randn(2, 3, size, size),)

    return ExportSpec(build=lambda: build_towers(folder)[0], example=example,
                      input_names=("pixel_values",), output_names=("embedding",),
                      dynamic_axes={"pixel_values": {0: "batch"}, "embedding": {0: "batch"}},
                      graph_version=f"{CLIP_GRAPH_VERSION}-image")


def text_export(folder: Path) -> ExportSpec:
    def example() -> tuple[Any, ...]:
        import torch

        ids = torch.tensor([[1, 5, 6, 2], [1, 2, 0, 0]], dtype=torch.int64)
        return ids, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.int64)

    axes = {0: "batch", 1: "tokens"}
    return ExportSpec(build=lambda: build_towers(folder)[1], example=example,
                      input_names=("input_ids", "attention_mask"), output_names=("embedding",),
                      dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                    "embedding": {0: "batch"}},
                      graph_version=f"{CLIP_GRAPH_VERSION}-text")
