"""The decoding half of SD 1.5's VAE: diffusers' ``AutoencoderKL.post_quant_conv`` and
``.decoder`` (``Decoder``: a mid block with one self-attention, ``UpDecoderBlock2D`` blocks),
with diffusers' parameter names. The encoder is never built: generation only decodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from engines.models.sd.modules.config import ConfigKeys, positive_int
from engines.models.sd.modules.layers import Attention, activation
from engines.models.sd.modules.resnet import ResnetBlock2D, Upsample2D

KEYS = ConfigKeys(
    "AutoencoderKL",
    used={"out_channels": 3, "latent_channels": 4, "up_block_types": ("UpDecoderBlock2D",),
          "block_out_channels": (64,), "layers_per_block": 1, "act_fn": "silu",
          "norm_num_groups": 32, "scaling_factor": 0.18215, "use_post_quant_conv": True,
          "mid_block_add_attention": True},
    # Both would change what the decoder is given, and VaeDecoderNet applies neither.
    fixed={"shift_factor": (None,), "latents_mean": (None,), "latents_std": (None,)},
    # The encoder's (not built), tiling's and a pipeline's precision hint.
    ignored=frozenset({"in_channels", "down_block_types", "use_quant_conv", "sample_size",
                       "force_upcast"}),
)
_EPS = 1e-6  # diffusers' Decoder hard-codes it for every norm


class MidBlock2D(nn.Module):
    """UNetMidBlock2D without a timestep embedding: resnet, (attention, resnet) once."""

    def __init__(self, channels: int, groups: int, act_fn: str, attention: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D(channels, channels, None, groups=groups, eps=_EPS, act_fn=act_fn)
            for _ in range(2))
        # One head as wide as the channels; without attention diffusers keeps a None here.
        self.attentions = nn.ModuleList(
            [Attention(channels, 1, channels, bias=True, norm_groups=groups, norm_eps=_EPS)]
            if attention else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        for attention in self.attentions:
            x = attention(x)
        return self.resnets[1](x)


class UpDecoderBlock2D(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, *, layers: int, groups: int,
                 act_fn: str, add_upsample: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, None,
                          groups=groups, eps=_EPS, act_fn=act_fn) for i in range(layers))
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels)]) if add_upsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class Decoder(nn.Module):
    """latents [N, latent_channels, h, w] -> image [N, out_channels, h * 2^(B-1), ...] in
    about [-1, 1]."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        channels = tuple(cfg["block_out_channels"])[::-1]
        groups, act, layers = cfg["norm_num_groups"], cfg["act_fn"], cfg["layers_per_block"] + 1
        self.conv_in = nn.Conv2d(cfg["latent_channels"], channels[0], 3, padding=1)
        self.mid_block = MidBlock2D(channels[0], groups, act, bool(cfg["mid_block_add_attention"]))
        self.up_blocks = nn.ModuleList(
            UpDecoderBlock2D(channels[max(i - 1, 0)], channels[i], layers=layers, groups=groups,
                             act_fn=act, add_upsample=i < len(channels) - 1)
            for i in range(len(channels)))
        self.conv_norm_out = nn.GroupNorm(groups, channels[-1], eps=_EPS)
        self.conv_act = nn.SiLU()  # diffusers' Decoder: SiLU here whatever act_fn says
        self.conv_out = nn.Conv2d(channels[-1], cfg["out_channels"], 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(self.conv_act(self.conv_norm_out(x)))


class VaeDecoder(nn.Module):
    """``post_quant_conv`` (a 1x1 convolution, absent with ``use_post_quant_conv: false``) then
    ``decoder``; parameter names as in the full AutoencoderKL's state dict."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        cfg = KEYS.read(config)
        for key in ("out_channels", "latent_channels", "layers_per_block", "norm_num_groups"):
            positive_int(KEYS, cfg, key)
        types = tuple(cfg["up_block_types"])
        if not types or any(t != "UpDecoderBlock2D" for t in types):
            raise KEYS.error("up_block_types", types, "UpDecoderBlock2D only")
        if len(cfg["block_out_channels"]) != len(types):
            raise KEYS.error("block_out_channels", cfg["block_out_channels"],
                             f"{len(types)} entries, one per up block")
        activation(cfg["act_fn"])
        self.scaling_factor = float(cfg["scaling_factor"])
        latent = cfg["latent_channels"]
        self.post_quant_conv = (nn.Conv2d(latent, latent, 1) if cfg["use_post_quant_conv"]
                                else None)
        self.decoder = Decoder(cfg)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)


# diffusers renames these on load (``_fix_state_dict_keys_on_load``): the attention block of
# checkpoints older than diffusers 0.14 (SD 1.5's own VAE among them) used these names.
_LEGACY = re.compile(r"^(.*\.attentions\.\d+)\.(query|key|value|proj_attn)\.(weight|bias)$")
_NEW_NAME = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}
DECODER_PREFIXES = ("decoder.", "post_quant_conv.")
ENCODER_PREFIXES = ("encoder.", "quant_conv.")


def decoder_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full AutoencoderKL state dict -> the entries of :class:`VaeDecoder` (legacy attention
    names renamed). Only the decoder is built, so only ``decoder.*`` and ``post_quant_conv.*``
    are kept (and loaded strictly); the encoder's ``encoder.*`` and ``quant_conv.*`` are
    dropped. Any other entry is a ``ValueError``: the file is not an AutoencoderKL's."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith(ENCODER_PREFIXES):
            continue
        if not key.startswith(DECODER_PREFIXES):
            raise ValueError(f"unexpected entry {key!r} in an AutoencoderKL state dict")
        m = _LEGACY.match(key)
        out[f"{m[1]}.{_NEW_NAME[m[2]]}.{m[3]}" if m else key] = value
    return out
