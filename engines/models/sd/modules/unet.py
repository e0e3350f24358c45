"""SD 1.5's UNet: diffusers' ``UNet2DConditionModel`` for the block types and options SD 1.5
uses, with its parameter names, so its ``diffusion_pytorch_model.safetensors`` loads strictly.

diffusers' naming quirk, kept: ``attention_head_dim`` (8 in SD 1.5) is the number of heads of
each block's attention, not their width (``num_attention_heads`` must stay unset, as diffusers
itself refuses it); a head's width is the block's channels divided by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn

from engines.models.sd.modules.config import ConfigKeys, per_block, positive_int
from engines.models.sd.modules.layers import TimestepEmbedding, activation, timestep_embedding
from engines.models.sd.modules.unet_blocks import (
    BlockOptions,
    DownBlock,
    MidBlockCrossAttn,
    UpBlock,
)

KEYS = ConfigKeys(
    "UNet2DConditionModel",
    used={"in_channels": 4, "out_channels": 4, "center_input_sample": False,
          "flip_sin_to_cos": True, "freq_shift": 0,
          "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                               "CrossAttnDownBlock2D", "DownBlock2D"),
          "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                             "CrossAttnUpBlock2D"),
          "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2,
          "downsample_padding": 1, "mid_block_scale_factor": 1, "act_fn": "silu",
          "norm_num_groups": 32, "norm_eps": 1e-5, "cross_attention_dim": 1280,
          "transformer_layers_per_block": 1, "attention_head_dim": 8,
          "use_linear_projection": False, "time_embedding_dim": None, "conv_in_kernel": 3,
          "conv_out_kernel": 3},
    fixed={"mid_block_type": ("UNetMidBlock2DCrossAttn",), "only_cross_attention": (False,),
           "reverse_transformer_layers_per_block": (None,), "encoder_hid_dim": (None,),
           "encoder_hid_dim_type": (None,), "num_attention_heads": (None,),
           "dual_cross_attention": (False,), "class_embed_type": (None,),
           "addition_embed_type": (None,), "addition_time_embed_dim": (None,),
           "num_class_embeds": (None,), "resnet_time_scale_shift": ("default",),
           "time_embedding_type": ("positional",), "time_embedding_act_fn": (None,),
           "timestep_post_act": (None,), "time_cond_proj_dim": (None,),
           "projection_class_embeddings_input_dim": (None,), "attention_type": ("default",),
           "class_embeddings_concat": (False,),
           # diffusers' SDPA processor ignores it (it only upcasts the legacy softmax path).
           "upcast_attention": (False, True)},
    # sample_size: a pipeline default; dropout: training only; the rest are read only by block
    # types this module does not build (ResnetDownsampleBlock2D, the SimpleCrossAttn blocks)
    # or by the addition embedding (refused above).
    ignored=frozenset({"sample_size", "dropout", "resnet_skip_time_act", "resnet_out_scale_factor",
                       "cross_attention_norm", "mid_block_only_cross_attention",
                       "addition_embed_type_num_heads"}),
)
DOWN_TYPES = {"DownBlock2D": False, "CrossAttnDownBlock2D": True}  # type -> cross-attends
UP_TYPES = {"UpBlock2D": False, "CrossAttnUpBlock2D": True}


class UNet2DCondition(nn.Module):
    """sample [N, C, h, w], timestep [N] or [], encoder_hidden_states [N, L, D] -> noise
    prediction [N, out_channels, h, w] (the tensor diffusers returns as ``.sample``)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        cfg = KEYS.read(config)
        channels = tuple(cfg["block_out_channels"])
        n = len(channels)
        for key in ("down_block_types", "up_block_types"):
            if len(cfg[key]) != n:
                raise KEYS.error(key, cfg[key], f"{n} blocks, as block_out_channels has")
        down = [_cross(t, DOWN_TYPES, "down_block_types") for t in cfg["down_block_types"]]
        up = [_cross(t, UP_TYPES, "up_block_types") for t in cfg["up_block_types"]]
        heads, layers = (per_block(KEYS, cfg, k, n) for k in ("attention_head_dim",
                                                              "layers_per_block"))
        for key in ("in_channels", "out_channels", "norm_num_groups", "cross_attention_dim",
                    "transformer_layers_per_block"):
            positive_int(KEYS, cfg, key)
        activation(cfg["act_fn"])  # refused here, not at the first block
        self.center_input_sample = bool(cfg["center_input_sample"])
        self.flip_sin_to_cos, self.freq_shift = bool(cfg["flip_sin_to_cos"]), cfg["freq_shift"]
        if cfg["time_embedding_dim"] is not None:
            positive_int(KEYS, cfg, "time_embedding_dim")
        temb = cfg["time_embedding_dim"] or channels[0] * 4

        k_in, k_out = cfg["conv_in_kernel"], cfg["conv_out_kernel"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], channels[0], k_in, padding=(k_in - 1) // 2)
        self.time_embedding = TimestepEmbedding(channels[0], temb, cfg["act_fn"])
        o = BlockOptions(temb_channels=temb, groups=cfg["norm_num_groups"], eps=cfg["norm_eps"],
                         act_fn=cfg["act_fn"], context_dim=cfg["cross_attention_dim"],
                         transformer_layers=cfg["transformer_layers_per_block"],
                         linear_projection=bool(cfg["use_linear_projection"]))
        self.down_blocks = nn.ModuleList(
            DownBlock(o, channels[max(i - 1, 0)], channels[i], layers=layers[i],
                      heads=heads[i] if down[i] else None,
                      downsample_padding=cfg["downsample_padding"] if i < n - 1 else None)
            for i in range(n))
        self.mid_block = MidBlockCrossAttn(o, channels[-1], heads[-1],
                                           cfg["mid_block_scale_factor"])
        rev_channels, rev_heads, rev_layers = channels[::-1], heads[::-1], layers[::-1]
        self.up_blocks = nn.ModuleList(
            UpBlock(o, rev_channels[min(i + 1, n - 1)], rev_channels[i],
                    rev_channels[max(i - 1, 0)], layers=rev_layers[i] + 1,
                    heads=rev_heads[i] if up[i] else None, add_upsample=i < n - 1)
            for i in range(n))
        self.conv_norm_out = nn.GroupNorm(cfg["norm_num_groups"], channels[0],
                                          eps=cfg["norm_eps"])
        self.conv_act = activation(cfg["act_fn"])
        self.conv_out = nn.Conv2d(channels[0], cfg["out_channels"], k_out,
                                  padding=(k_out - 1) // 2)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        if self.center_input_sample:
            sample = 2 * sample - 1.0
        t = timestep[None].to(sample.device) if timestep.ndim == 0 else timestep
        t_emb = timestep_embedding(t.expand(sample.shape[0]), self.conv_in.out_channels,
                                   self.flip_sin_to_cos, self.freq_shift)
        # The sinusoids are float32; the network may run in fp16.
        emb = self.time_embedding(t_emb.to(sample.dtype))
        x = self.conv_in(sample)
        skips = [x]
        for down in self.down_blocks:
            x, states = down(x, emb, encoder_hidden_states)
            skips.extend(states)
        x = self.mid_block(x, emb, encoder_hidden_states)
        # Upsample to the skip connection's size only where a side is not a multiple of the
        # total downsampling (as diffusers does; x2 is the same there and traces simpler).
        factor = 2 ** (len(self.up_blocks) - 1)
        odd = any(side % factor != 0 for side in sample.shape[-2:])
        for i, up in enumerate(self.up_blocks):
            used = len(cast(UpBlock, up).resnets)
            res, skips = skips[-used:], skips[:-used]
            size = skips[-1].shape[2:] if odd and i < len(self.up_blocks) - 1 else None
            x = up(x, res, emb, encoder_hidden_states, size)
        return self.conv_out(self.conv_act(self.conv_norm_out(x)))


def _cross(block_type: Any, types: dict[str, bool], key: str) -> bool:
    name = block_type[7:] if isinstance(block_type, str) and block_type.startswith(
        "UNetRes") else block_type  # diffusers accepts the prefix and drops it
    if name not in types:
        raise KEYS.error(key, block_type, f"each one of {sorted(types)}")
    return types[name]
