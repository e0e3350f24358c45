"""The in-house VAE decoder against diffusers' AutoencoderKL.decode (TINY, float32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("diffusers", reason="the references need the dev extra")
pytest.importorskip("transformers", reason="the references need the dev extra")

import torch

from engines.models.sd.arch import TINY
from engines.models.sd.modules import VaeDecoder
from engines.models.sd.modules.vae import decoder_state
from tests.unit.engines.models.sd.modules.sd_references import (
    assert_close,
    inhouse,
    reference,
    shapes,
)


def _compare(ref: Any, config: dict[str, Any], batch: int, h: int, w: int) -> float:
    net = inhouse("vae", config)
    net.load_state_dict(decoder_state(ref.state_dict()), strict=True)
    z = torch.randn(batch, 4, h, w, generator=torch.Generator().manual_seed(h * w + batch))
    with torch.no_grad():
        want = ref.decode(z, return_dict=False)[0]
        got = net(z)
    return assert_close(got, want, f"vae {batch}x{h}x{w}")


@pytest.mark.parametrize(("batch", "h", "w"), [(1, 8, 8), (2, 8, 8), (2, 8, 16)])
def test_matches_diffusers(tiny_refs: dict[str, Any], batch: int, h: int, w: int) -> None:
    _compare(tiny_refs["vae"], dict(TINY.vae), batch, h, w)


@pytest.mark.parametrize("change", [{"mid_block_add_attention": False},
                                    {"use_post_quant_conv": False, "act_fn": "mish"}])
def test_supported_options_match_diffusers(change: dict[str, Any]) -> None:
    config = {**TINY.vae, **change}
    torch.manual_seed(2)
    _compare(reference("vae", config), config, 1, 8, 8)


def test_decoder_state_keeps_the_decoder_half_only(tiny_refs: dict[str, Any]) -> None:
    full = tiny_refs["vae"].state_dict()
    kept = decoder_state(full)
    assert all(k.startswith(("decoder.", "post_quant_conv.")) for k in kept)
    assert {k for k in full if k not in kept} == {
        k for k in full if k.startswith(("encoder.", "quant_conv."))}
    assert shapes(kept) == shapes(VaeDecoder(TINY.vae).state_dict())
    with pytest.raises(ValueError, match=r"unexpected entry 'extra\.weight'"):
        decoder_state({**full, "extra.weight": torch.zeros(1)})


def test_legacy_attention_names_are_renamed(tiny_refs: dict[str, Any]) -> None:
    """Checkpoints older than diffusers 0.14 (SD 1.5's own VAE) name the mid-block attention's
    layers query/key/value/proj_attn; diffusers renames them on load, so does decoder_state."""
    old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    legacy = {}
    for k, v in tiny_refs["vae"].state_dict().items():
        for new, was in old.items():
            k = k.replace(f".attentions.0.{new}.", f".attentions.0.{was}.")
        legacy[k] = v
    assert any(".attentions.0.query." in k for k in legacy)
    assert decoder_state(legacy).keys() == decoder_state(tiny_refs["vae"].state_dict()).keys()


@pytest.mark.parametrize(("change", "key"), [
    ({"up_block_types": ("AttnUpDecoderBlock2D",) * 4}, "up_block_types"),
    ({"up_block_types": ("UpDecoderBlock2D",) * 3}, "block_out_channels"),
    ({"shift_factor": 0.1159}, "shift_factor"),
    ({"latents_mean": [0.0] * 4}, "latents_mean"),
    ({"norm_type": "spatial"}, "'norm_type'"),
])
def test_unsupported_config_names_the_key(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        VaeDecoder({**TINY.vae, **change})


def test_a_saved_config_with_every_default_is_accepted(tiny_refs: dict[str, Any]) -> None:
    net = VaeDecoder(dict(tiny_refs["vae"].config))
    assert net.scaling_factor == TINY.vae["scaling_factor"]
    assert shapes(net.state_dict()) == shapes(decoder_state(tiny_refs["vae"].state_dict()))
