"""diffusers' ``ResnetBlock2D`` (pre-norm, ``time_embedding_norm="default"``), ``Downsample2D``
and ``Upsample2D`` (both with their 3x3 convolution), as SD 1.5's UNet and VAE use them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.models.sd.modules.layers import activation


class ResnetBlock2D(nn.Module):
    """Two norm-act-conv steps, the timestep embedding (if any) added between them, and a 1x1
    convolution on the shortcut where the channel count changes."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: int | None, *,
                 groups: int, eps: float, act_fn: str, output_scale_factor: float = 1.0) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = (nn.Linear(temb_channels, out_channels)
                              if temb_channels is not None else None)
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nonlinearity = activation(act_fn)
        self.conv_shortcut = (nn.Conv2d(in_channels, out_channels, 1)
                              if in_channels != out_channels else None)
        self.output_scale_factor = output_scale_factor

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(self.nonlinearity(self.norm1(x)))
        if self.time_emb_proj is not None and temb is not None:
            h = h + self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        h = self.conv2(self.nonlinearity(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        out = x + h
        # Skipped at 1 (SD 1.5 everywhere): dividing by 1.0 is exact, the op is not needed.
        return out / self.output_scale_factor if self.output_scale_factor != 1 else out


class Downsample2D(nn.Module):
    def __init__(self, channels: int, padding: int) -> None:
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding == 0:  # diffusers pads right and bottom only, then convolves unpadded
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample2D(nn.Module):
    """Nearest-neighbour x2 (or to ``size``, the skip connection's side when a latent side is
    not a multiple of the UNet's total downsampling), then a 3x3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, size: torch.Size | None = None) -> torch.Tensor:
        if x.shape[0] >= 64 or x.numel() * 2 > 2**31:
            x = x.contiguous()  # diffusers' workarounds for large upsample_nearest2d inputs
        if size is None:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        else:
            x = F.interpolate(x, size=size, mode="nearest")
        return self.conv(x)
