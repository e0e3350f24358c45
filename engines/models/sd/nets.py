"""The three engines as plain torch modules with tensor-only signatures.

Why wrappers: ONNX export, CUDA-graph capture and torch.compile all want ``forward`` to take and
return tensors (no config objects, no dict outputs), and each engine's boundary casts live here
once: float32 in and out on the wire, the network's own dtype (fp16 on GPUs) inside. The VAE
decoder also folds in the latent scaling and the conversion to uint8 NHWC pixels, so a batch of
images leaves the device as 1/4 of the bytes and needs no host arithmetic before PNG encoding.
The networks are the in-house modules of :mod:`engines.models.sd.modules` (same parameter names
as transformers' and diffusers' classes); this module imports torch only, and only the torch
and aoti backends and the ONNX export load it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn


class TextEncoderNet(nn.Module):
    """input_ids int64 [N, 77] -> text_embeddings float32 [N, 77, hidden]."""

    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.clip: Any = clip

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # SD 1.5 conditions on the last layer's normalised states (not the pooled output).
        return self.clip(input_ids).float()


class UNetNet(nn.Module):
    """sample [N, 4, h, w], timestep [N], encoder_hidden_states [N, 77, D] -> noise_pred."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet: Any = unet

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = self.unet.conv_in.weight.dtype
        return self.unet(sample.to(dtype), timestep, encoder_hidden_states.to(dtype)).float()


class VaeDecoderNet(nn.Module):
    """latents float32 [N, 4, h, w] (unscaled) -> image uint8 [N, 8h, 8w, 3]."""

    def __init__(self, vae: nn.Module, scaling_factor: float) -> None:
        super().__init__()
        self.post_quant_conv: Any = vae.post_quant_conv
        self.decoder: Any = vae.decoder
        self.scaling_factor = scaling_factor

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        z = (latents / self.scaling_factor).to(self.decoder.conv_in.weight.dtype)
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        x = self.decoder(z).float()
        # Random weights can overflow fp16; NaN must not reach the uint8 cast (undefined there).
        x = torch.nan_to_num(x / 2 + 0.5, nan=0.0).clamp(0, 1)
        return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


# Each raises ValueError naming the config key it does not support.
def text_encoder(config: dict[str, Any]) -> TextEncoderNet:
    from engines.models.sd.modules.text import ClipTextModel

    return TextEncoderNet(ClipTextModel(config))


def unet(config: dict[str, Any]) -> UNetNet:
    from engines.models.sd.modules.unet import UNet2DCondition

    return UNetNet(UNet2DCondition(config))


def vae_decoder(config: dict[str, Any]) -> VaeDecoderNet:
    """The decoder half only (post_quant_conv + decoder): generation never encodes."""
    from engines.models.sd.modules.vae import VaeDecoder

    vae = VaeDecoder(config)
    return VaeDecoderNet(vae, vae.scaling_factor)


BUILDERS: dict[str, Callable[[dict[str, Any]], nn.Module]] = {
    "text_encoder": text_encoder, "unet": unet, "vae": vae_decoder}


def skeleton(component: str, config: dict[str, Any], device: str = "cpu", *,
             initialised: bool = True) -> nn.Module:
    """The architecture built directly on ``device``: with freshly initialised weights (a full
    UNet initialises in well under a second on a GPU, ~10 s on a CPU), or, ``initialised=False``,
    with parameters allocated but not initialised, for a ``load_state_dict`` that overwrites
    every one of them (strict loading checks that). The modules hold no buffers."""
    with _parameter_init_skipped() if not initialised else nullcontext(), torch.device(device):
        return BUILDERS[component](config).eval()


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
                   "orthogonal_")
_skip_lock = threading.Lock()


@contextmanager
def _parameter_init_skipped() -> Iterator[None]:
    """Modules built inside get allocated but not initialised parameters: every
    ``torch.nn.init`` function is a no-op (torch's layers and the in-house modules initialise
    through them only). Process-wide, so serialised by a lock."""
    with _skip_lock:
        saved = {n: getattr(nn.init, n) for n in _INIT_FUNCTIONS if hasattr(nn.init, n)}
        try:
            for name in saved:
                setattr(nn.init, name, lambda tensor, *a, **k: tensor)
            yield
        finally:
            for name, fn in saved.items():
                setattr(nn.init, name, fn)

