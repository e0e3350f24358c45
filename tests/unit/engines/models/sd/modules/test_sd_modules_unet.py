"""The in-house UNet against diffusers' UNet2DConditionModel (TINY, float32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("diffusers", reason="the references need the dev extra")
pytest.importorskip("transformers", reason="the references need the dev extra")

import torch

from engines.models.sd.arch import TINY
from engines.models.sd.modules import UNet2DCondition
from tests.unit.engines.models.sd.modules.sd_references import (
    assert_close,
    inhouse,
    reference,
    shapes,
)


def _compare(ref: Any, config: dict[str, Any], batch: int, h: int, w: int,
             timestep: torch.Tensor | None = None) -> float:
    net = inhouse("unet", config)
    net.load_state_dict(ref.state_dict(), strict=True)
    g = torch.Generator().manual_seed(batch * 1000 + h * 10 + w)
    sample = torch.randn(batch, 4, h, w, generator=g)
    context = torch.randn(batch, 77, config["cross_attention_dim"], generator=g)
    t = torch.tensor([999.0, 21.0][:batch]) if timestep is None else timestep
    with torch.no_grad():
        want = ref(sample, t, encoder_hidden_states=context, return_dict=False)[0]
        got = net(sample, t, context)
    return assert_close(got, want, f"unet {batch}x{h}x{w}")


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("h", "w"), [(8, 8), (16, 24)])
def test_matches_diffusers(tiny_refs: dict[str, Any], batch: int, h: int, w: int) -> None:
    _compare(tiny_refs["unet"], dict(TINY.unet), batch, h, w)


def test_odd_latent_sides_upsample_to_the_skip_size(tiny_refs: dict[str, Any]) -> None:
    """A side not a multiple of the total downsampling: the upsampler targets the skip
    connection's size (diffusers' forward_upsample_size)."""
    _compare(tiny_refs["unet"], dict(TINY.unet), 2, 9, 11)


def test_a_scalar_timestep_is_broadcast(tiny_refs: dict[str, Any]) -> None:
    _compare(tiny_refs["unet"], dict(TINY.unet), 2, 8, 8, timestep=torch.tensor(500.0))


@pytest.mark.parametrize("change", [
    {"use_linear_projection": True},  # SD 2.x: linear proj_in / proj_out
    {"attention_head_dim": [2, 4], "layers_per_block": [1, 2]},  # per-block lists
    {"transformer_layers_per_block": 2, "center_input_sample": True, "freq_shift": 1,
     "flip_sin_to_cos": False, "downsample_padding": 0, "mid_block_scale_factor": 2.0},
], ids=["linear-projection", "per-block-lists", "other-options"])
def test_supported_options_match_diffusers(change: dict[str, Any]) -> None:
    config = {**TINY.unet, **change}
    torch.manual_seed(1)
    _compare(reference("unet", config), config, 2, 8, 8)


@pytest.mark.parametrize(("change", "key"), [
    ({"down_block_types": ("AttnDownBlock2D", "DownBlock2D")}, "down_block_types"),
    ({"up_block_types": ("UpBlock2D",)}, "up_block_types"),
    ({"mid_block_type": "UNetMidBlock2DSimpleCrossAttn"}, "mid_block_type"),
    ({"num_attention_heads": 8}, "num_attention_heads"),
    ({"addition_embed_type": "text_time"}, "addition_embed_type"),
    ({"class_embed_type": "timestep"}, "class_embed_type"),
    ({"resnet_time_scale_shift": "scale_shift"}, "resnet_time_scale_shift"),
    ({"only_cross_attention": [True, False]}, "only_cross_attention"),
    ({"cross_attention_dim": [32, 32]}, "cross_attention_dim"),
    ({"attention_head_dim": [8, 8, 8]}, "attention_head_dim"),
    ({"act_fn": "tanh"}, "act_fn"),
    ({"brand_new_option": 1}, "'brand_new_option'"),
])
def test_unsupported_config_names_the_key(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        UNet2DCondition({**TINY.unet, **change})


def test_a_saved_config_with_every_default_is_accepted(tiny_refs: dict[str, Any]) -> None:
    """diffusers' save_pretrained writes every constructor argument; all must be known."""
    config = dict(tiny_refs["unet"].config)
    net = UNet2DCondition(config)
    assert shapes(net.state_dict()) == shapes(tiny_refs["unet"].state_dict())
