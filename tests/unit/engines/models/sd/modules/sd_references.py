"""The reference networks (transformers' CLIPTextModel, diffusers' UNet2DConditionModel and
AutoencoderKL, built exactly as engines.models.sd.nets built them before the in-house modules)
and the in-house ones, side by side, plus state-dict conversions between the two namings.

The references need the dev extra (diffusers, transformers): callers skip without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engines.models.sd.modules import ClipTextModel, UNet2DCondition, VaeDecoder
from engines.models.sd.modules.text import text_state
from engines.models.sd.modules.vae import decoder_state

COMPONENTS = ("text_encoder", "unet", "vae")


def reference(component: str, config: Mapping[str, Any]) -> Any:
    """The library module; for the VAE the whole AutoencoderKL (encoder included)."""
    if component == "text_encoder":
        from transformers import CLIPTextConfig, CLIPTextModel

        return CLIPTextModel(CLIPTextConfig.from_dict(dict(config))).eval()
    from diffusers import AutoencoderKL, UNet2DConditionModel

    cls: Any = UNet2DConditionModel if component == "unet" else AutoencoderKL
    return cls.from_config(dict(config)).eval()


def inhouse(component: str, config: Mapping[str, Any]) -> nn.Module:
    cls = {"text_encoder": ClipTextModel, "unet": UNet2DCondition, "vae": VaeDecoder}[component]
    return cls(config).eval()


def to_inhouse(component: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A reference state dict in the in-house names (the conversion weights.load applies)."""
    if component == "text_encoder":
        return text_state(state)
    return decoder_state(state) if component == "vae" else dict(state)


def shapes(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def reference_with(component: str, config: Mapping[str, Any], net: nn.Module) -> Any:
    """A reference text encoder or UNet carrying the in-house ``net``'s weights (to be saved
    with save_pretrained): transformers 5 names the text encoder's entries without
    ``text_model.``, 4.x with it."""
    ref = reference(component, config)
    names = set(ref.state_dict())
    state = {k if k in names else k.removeprefix("text_model."): v
             for k, v in net.state_dict().items()}
    ref.load_state_dict(state, strict=True)
    return ref


def write_folder(root: Path, refs: Mapping[str, Any]) -> Path:
    """A diffusers-layout SD folder: each reference saved with ``save_pretrained``, and an
    empty tokenizer/ (LocalSdWeights needs the folder; these tests never tokenize)."""
    for component, ref in refs.items():
        ref.save_pretrained(root / component)
    (root / "tokenizer").mkdir(exist_ok=True)
    return root


# float32, same operations in the same order as the references: the outputs measured
# identical (difference 0.0) on this machine's torch. The tolerance, 1e-5 relative to the
# output's scale (at least 1), leaves room for another CPU or torch version picking a
# different kernel (SDPA backend, conv algorithm, reduction order): about 100 float32 ulps at 1.
TOLERANCE = 1e-5


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    """The max abs difference, checked against TOLERANCE x max(1, max |want|)."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    diff = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    assert diff <= TOLERANCE * scale, f"{what}: max abs difference {diff} (scale {scale})"
    return diff
