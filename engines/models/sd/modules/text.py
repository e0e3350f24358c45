"""SD 1.5's text encoder: transformers' ``CLIPTextModel`` (token and position embeddings, a
causal pre-norm transformer with quick_gelu, a final layer norm), with its parameter names.

The transformer itself is the CLIP text tower the moderation engines already run
(:mod:`engines.models.clip.net`, same names: ``text_model.embeddings``, ``.encoder.layers``,
``.final_layer_norm``); this module adds the config reading, transformers' initialisation
(for random weights) and the output SD conditions on: every token's last normalised state
(no pooling, no projection). No position-ids buffer: positions are ``arange(L)``, which is what
transformers' buffer holds. Parameter names follow SD 1.5's published checkpoints (and
transformers 4.x); :func:`text_state` maps a checkpoint of either naming onto them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from engines.models.clip.net import ClipTextTransformer, TowerConfig
from engines.models.sd.modules.config import ConfigKeys, positive_int

KEYS = ConfigKeys(
    "CLIPTextModel",
    # transformers' CLIPTextConfig defaults.
    used={"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048,
          "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 77,
          "layer_norm_eps": 1e-5, "initializer_range": 0.02,
          "initializer_factor": 1.0},
    fixed={"hidden_act": ("quick_gelu", "gelu"), "model_type": ("clip_text_model",),
           "architectures": (None, "CLIPTextModel")},
    # transformers' configs carry dozens of generic keys (generation settings, label maps,
    # output switches) that no CLIPTextModel layer reads; the ones it reads are checked above.
    refuse_unknown=False,
)
PREFIX = "text_model."
POSITION_IDS = PREFIX + "embeddings.position_ids"


class ClipTextModel(nn.Module):
    """input_ids int64 [N, L] (L <= max_position_embeddings) -> last_hidden_state [N, L, D]."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        cfg = KEYS.read(config)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings"):
            positive_int(KEYS, cfg, key)
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise KEYS.error("num_attention_heads", cfg["num_attention_heads"],
                             f"a divisor of hidden_size {cfg['hidden_size']}")
        tower = TowerConfig(
            hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"], layer_norm_eps=cfg["layer_norm_eps"],
            hidden_act=cfg["hidden_act"], vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg["max_position_embeddings"])
        self.text_model = ClipTextTransformer(tower)
        _init_like_transformers(self.text_model, tower, float(cfg["initializer_range"]),
                                float(cfg["initializer_factor"] or 1.0))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        m, emb = self.text_model, self.text_model.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = emb.token_embedding(input_ids) + emb.position_embedding(positions)[None]
        return m.final_layer_norm(m.encoder(x, causal=True))


def text_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CLIPTextModel checkpoint's entries, named for :class:`ClipTextModel`.

    Two differences between transformers versions are undone here. Up to 4.x the model kept
    its layers under ``text_model.`` (so do SD 1.5's published files); 5.x dropped that level,
    saves ``embeddings.*``, ``encoder.*``, ``final_layer_norm.*`` and strips the prefix from
    older files when it loads them. The names here are the published files', and unprefixed
    entries get the prefix. And some versions saved the position ids, others did not; they are
    ``arange`` either way, so they are dropped.
    """
    out = {k if k.startswith(PREFIX) else PREFIX + k: v for k, v in state.items()}
    out.pop(POSITION_IDS, None)
    return out


def _init_like_transformers(model: nn.Module, c: TowerConfig, initializer_range: float,
                            factor: float) -> None:
    """CLIPPreTrainedModel._init_weights, so random weights have the value ranges real ones
    would (torch's defaults give the embeddings a standard deviation of 1, not 0.02). Goes
    through ``nn.init``, so a build that skips initialisation skips this too."""
    d, depth = c.hidden_size, (2 * c.num_hidden_layers) ** -0.5
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02 * factor)
        elif isinstance(module, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            std = {"q_proj": d**-0.5 * depth, "k_proj": d**-0.5 * depth,
                   "v_proj": d**-0.5 * depth, "out_proj": d**-0.5, "fc1": (2 * d) ** -0.5,
                   "fc2": d**-0.5 * depth}.get(leaf, initializer_range)
            nn.init.normal_(module.weight, std=std * factor)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
