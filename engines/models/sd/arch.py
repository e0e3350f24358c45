"""Architectures: the full SD 1.5 configuration and a tiny one of the same layer types.

The full numbers are Stable Diffusion 1.5's published ``config.json`` values (diffusers
``UNet2DConditionModel`` / ``AutoencoderKL``, transformers ``CLIPTextModel``); they describe
the architecture only, no weights. The tiny one keeps every block type (cross-attention down and
up blocks, the VAE decoder's up blocks, a causal CLIP transformer) at a size that runs in
milliseconds on a CPU, so tests exercise the same code paths as production.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_TOKENS = 77  # CLIP's context length; SD 1.5 always encodes exactly 77 tokens
VAE_SCALING = 0.18215  # SD 1.5's latent scaling factor


@dataclass(frozen=True, slots=True)
class SdDims:
    """What the engines' tensor shapes depend on, read from an architecture or a folder."""

    text_hidden: int
    vocab_size: int
    latent_channels: int
    vae_factor: int  # image side / latent side
    scaling_factor: float = VAE_SCALING
    max_tokens: int = MAX_TOKENS

    def latent_shape(self, width: int, height: int) -> tuple[int, int, int]:
        return (self.latent_channels, height // self.vae_factor, width // self.vae_factor)


@dataclass(frozen=True)
class SdArch:
    name: str
    text: dict[str, Any]
    unet: dict[str, Any]
    vae: dict[str, Any] = field(default_factory=dict)

    def dims(self) -> SdDims:
        return SdDims(
            text_hidden=int(self.text["hidden_size"]), vocab_size=int(self.text["vocab_size"]),
            latent_channels=int(self.vae["latent_channels"]),
            vae_factor=2 ** (len(self.vae["block_out_channels"]) - 1),
            scaling_factor=float(self.vae.get("scaling_factor", VAE_SCALING)),
        )


SD15 = SdArch(
    name="sd15",
    text={"vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
          "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 77,
          "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "projection_dim": 768,
          "bos_token_id": 49406, "eos_token_id": 49407, "pad_token_id": 49407},
    unet={"sample_size": 64, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
          "block_out_channels": (320, 640, 1280, 1280),
          "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                               "CrossAttnDownBlock2D", "DownBlock2D"),
          "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                             "CrossAttnUpBlock2D"),
          "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32,
          "act_fn": "silu", "center_input_sample": False, "downsample_padding": 1,
          "flip_sin_to_cos": True, "freq_shift": 0, "mid_block_scale_factor": 1,
          "norm_eps": 1e-5},
    vae={"in_channels": 3, "out_channels": 3, "latent_channels": 4,
         "block_out_channels": (128, 256, 512, 512),
         "down_block_types": ("DownEncoderBlock2D",) * 4,
         "up_block_types": ("UpDecoderBlock2D",) * 4,
         "layers_per_block": 2, "norm_num_groups": 32, "act_fn": "silu", "sample_size": 512,
         "scaling_factor": VAE_SCALING},
)

TINY = SdArch(
    name="tiny",
    text={"vocab_size": 1000, "hidden_size": 32, "intermediate_size": 37,
          "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 77,
          "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "projection_dim": 32,
          "bos_token_id": 998, "eos_token_id": 999, "pad_token_id": 999},
    unet={"sample_size": 8, "in_channels": 4, "out_channels": 4, "layers_per_block": 1,
          "block_out_channels": (32, 64),
          "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
          "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
          "cross_attention_dim": 32, "attention_head_dim": 8, "norm_num_groups": 32},
    # Four VAE blocks like SD 1.5, so latents are 1/8 of the image side here too.
    vae={"in_channels": 3, "out_channels": 3, "latent_channels": 4,
         "block_out_channels": (8, 8, 16, 16),
         "down_block_types": ("DownEncoderBlock2D",) * 4,
         "up_block_types": ("UpDecoderBlock2D",) * 4,
         "layers_per_block": 1, "norm_num_groups": 8, "sample_size": 64,
         "scaling_factor": VAE_SCALING},
)

ARCHES = {a.name: a for a in (SD15, TINY)}
