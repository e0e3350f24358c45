"""The UNet's blocks: diffusers' ``DownBlock2D`` / ``CrossAttnDownBlock2D`` (one class, the
attentions present when the block cross-attends), ``UNetMidBlock2DCrossAttn`` and
``UpBlock2D`` / ``CrossAttnUpBlock2D``, with diffusers' parameter names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engines.models.sd.modules.resnet import Downsample2D, ResnetBlock2D, Upsample2D
from engines.models.sd.modules.transformer import Transformer2D


@dataclass(frozen=True)
class BlockOptions:
    """What every block of one UNet shares (from its config)."""

    temb_channels: int
    groups: int
    eps: float
    act_fn: str
    context_dim: int
    transformer_layers: int
    linear_projection: bool

    def resnet(self, in_channels: int, out_channels: int,
               output_scale_factor: float = 1.0) -> ResnetBlock2D:
        return ResnetBlock2D(in_channels, out_channels, self.temb_channels, groups=self.groups,
                             eps=self.eps, act_fn=self.act_fn,
                             output_scale_factor=output_scale_factor)

    def transformer(self, channels: int, heads: int) -> Transformer2D:
        return Transformer2D(channels, heads, self.context_dim, layers=self.transformer_layers,
                             groups=self.groups, linear_projection=self.linear_projection)


def _attentions(o: BlockOptions, channels: int, heads: int | None,
                layers: int) -> nn.ModuleList | None:
    if heads is None:
        return None
    return nn.ModuleList(o.transformer(channels, heads) for _ in range(layers))


class DownBlock(nn.Module):
    """``heads`` None: DownBlock2D; else CrossAttnDownBlock2D with that many heads."""

    def __init__(self, o: BlockOptions, in_channels: int, out_channels: int, *, layers: int,
                 heads: int | None, downsample_padding: int | None) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(o.resnet(in_channels if i == 0 else out_channels,
                                              out_channels) for i in range(layers))
        self.attentions = _attentions(o, out_channels, heads, layers)
        self.downsamplers = (nn.ModuleList([Downsample2D(out_channels, downsample_padding)])
                             if downsample_padding is not None else None)

    def forward(self, x: torch.Tensor, temb: torch.Tensor,
                context: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        states = []
        for i, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
            states.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            states.append(x)
        return x, states


class MidBlockCrossAttn(nn.Module):
    """resnet, then (attention, resnet) once: UNetMidBlock2DCrossAttn with one layer."""

    def __init__(self, o: BlockOptions, channels: int, heads: int,
                 output_scale_factor: float) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(o.resnet(channels, channels, output_scale_factor)
                                     for _ in range(2))
        self.attentions = nn.ModuleList([o.transformer(channels, heads)])

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x, temb)
        x = self.attentions[0](x, context)
        return self.resnets[1](x, temb)


class UpBlock(nn.Module):
    """``heads`` None: UpBlock2D; else CrossAttnUpBlock2D. Each resnet takes the previous output
    concatenated with one skip connection (the last ``layers`` of the down path, reversed)."""

    def __init__(self, o: BlockOptions, in_channels: int, out_channels: int,
                 prev_output_channels: int, *, layers: int, heads: int | None,
                 add_upsample: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            o.resnet((prev_output_channels if i == 0 else out_channels)
                     + (in_channels if i == layers - 1 else out_channels), out_channels)
            for i in range(layers))
        self.attentions = _attentions(o, out_channels, heads, layers)
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels)]) if add_upsample else None

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor], temb: torch.Tensor,
                context: torch.Tensor, size: torch.Size | None) -> torch.Tensor:
        for i, resnet in enumerate(self.resnets):
            x = resnet(torch.cat([x, skips[-1 - i]], dim=1), temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, size)
        return x
