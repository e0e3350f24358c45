"""diffusers' ``Transformer2DModel`` for continuous inputs and its ``BasicTransformerBlock``
(layer norms, self- then cross-attention, GEGLU feed-forward), as SD 1.5's UNet uses them.

``linear_projection`` is the config's ``use_linear_projection``: ``proj_in``/``proj_out`` are
1x1 convolutions without it (SD 1.5), linear layers with it (SD 2.x); the weights have
different shapes, so the choice must follow the checkpoint's config.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.models.sd.modules.layers import Attention, FeedForward


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, dim_head, context_dim=context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class Transformer2D(nn.Module):
    """[N, C, H, W] -> the same shape: group norm, project in, the blocks over the H*W tokens,
    project out, plus the input."""

    def __init__(self, channels: int, heads: int, context_dim: int, *, layers: int,
                 groups: int, linear_projection: bool) -> None:
        super().__init__()
        self.linear_projection = linear_projection
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        dim_head = channels // heads
        inner = heads * dim_head
        self.proj_in: nn.Module = (nn.Linear(channels, inner) if linear_projection
                                   else nn.Conv2d(channels, inner, 1))
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(inner, heads, dim_head, context_dim) for _ in range(layers))
        self.proj_out: nn.Module = (nn.Linear(inner, channels) if linear_projection
                                    else nn.Conv2d(inner, channels, 1))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        y = self.norm(x)
        if not self.linear_projection:
            y = self.proj_in(y)
        y = y.permute(0, 2, 3, 1).reshape(n, h * w, y.shape[1])
        if self.linear_projection:
            y = self.proj_in(y)
        for block in self.transformer_blocks:
            y = block(y, context)
        if self.linear_projection:
            y = self.proj_out(y)
        y = y.reshape(n, h, w, y.shape[-1]).permute(0, 3, 1, 2).contiguous()
        if not self.linear_projection:
            y = self.proj_out(y)
        return y + x
