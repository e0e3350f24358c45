"""The small layers the UNet and the VAE decoder share, named like diffusers' modules.

Attention is diffusers' ``Attention`` with its default processor (``AttnProcessor2_0``): one
``scaled_dot_product_attention`` call, no mask (SD 1.5 never passes one). Dropout layers are
left out (inference only, and they hold no parameters); where diffusers keeps one inside a
``ModuleList`` an ``nn.Identity`` holds its index, so the parameter names stay the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {"silu": nn.SiLU, "swish": nn.SiLU, "mish": nn.Mish, "gelu": nn.GELU,
                "relu": nn.ReLU}


def activation(name: str) -> nn.Module:
    """diffusers' ``get_activation``: the name as a config spells it."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"act_fn={name!r} is not supported (supported: {sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]()


class Attention(nn.Module):
    """Multi-head attention over tokens [N, L, C] (self, or cross with ``context``); given
    ``norm_groups``, the VAE's spatial form instead: [N, C, H, W] in, group norm first, the
    input added back (diffusers' ``residual_connection``)."""

    def __init__(self, query_dim: int, heads: int, dim_head: int, *,
                 context_dim: int | None = None, bias: bool = False,
                 norm_groups: int | None = None, norm_eps: float = 1e-6) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.group_norm = (nn.GroupNorm(norm_groups, query_dim, eps=norm_eps)
                           if norm_groups is not None else None)
        self.to_q = nn.Linear(query_dim, inner, bias=bias)
        self.to_k = nn.Linear(context_dim or query_dim, inner, bias=bias)
        self.to_v = nn.Linear(context_dim or query_dim, inner, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim), nn.Identity()])

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        if self.group_norm is None:
            return self._attend(x, x if context is None else context)
        n, c, h, w = x.shape
        tokens = self.group_norm(x.view(n, c, h * w)).transpose(1, 2)
        y = self._attend(tokens, tokens).transpose(1, 2).reshape(n, c, h, w)
        return y + x

    def _attend(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.view(n, -1, self.heads, t.shape[-1] // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.to_out[0](y.transpose(1, 2).reshape(n, -1, q.shape[1] * q.shape[3]))


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(gate)


class FeedForward(nn.Module):
    """diffusers' ``FeedForward`` with ``activation_fn="geglu"``: ``net.0.proj``, ``net.2``."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Identity(),
                                  nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.net:
            x = layer(x)
        return x


def timestep_embedding(timesteps: torch.Tensor, dim: int, flip_sin_to_cos: bool,
                       freq_shift: float, max_period: int = 10000) -> torch.Tensor:
    """diffusers' ``get_timestep_embedding`` (its ``Timesteps`` module holds no parameters):
    float32 [N, dim] sinusoids of the timesteps [N]."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                    device=timesteps.device)
    freqs = torch.exp(exponent / (half - freq_shift))
    emb = timesteps[:, None].float() * freqs[None, :]
    sin, cos = torch.sin(emb), torch.cos(emb)
    emb = torch.cat([cos, sin] if flip_sin_to_cos else [sin, cos], dim=-1)
    return F.pad(emb, (0, 1, 0, 0)) if dim % 2 else emb


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int, act_fn: str) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.act = activation(act_fn)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))
