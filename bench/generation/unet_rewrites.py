"""Rewrites of the UNet module tried before export (issue 16: fp8 for the UNet's linear layers
if it holds the reference tolerance), for ``bench/generation/unet_variants.py``. Not engine code: a
rewrite that wins on the H200 moves into the SD modules with tests.

- ``qkv``: each self-attention's three projections as one GEMM (one read of the normed tokens
  instead of three; the weights concatenated, the output split as views).
- ``fp8``: the transformer blocks' token-wise linear layers (self-attention's projections, the
  cross-attention's query and output, both feed-forward layers) in float8 e4m3 through
  ``torch._scaled_mm``: weights quantised once per output channel, activations per token at
  run time (the scale is the row's largest magnitude over 448, so no calibration data is
  needed). The cross-attention's key and value see 77 text tokens, too few to gain from it.
  Outputs come back in bfloat16 (what row-wise scaling supports on every torch the engine
  runs on) and are cast to the network's dtype; the bias is added after. ``use_fast_accum``
  stays at its default (off), as measured (bench/NOTES.md).
- ``fp8_qkv``: both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

E4M3_MAX = 448.0


class Fp8Linear(nn.Module):
    """``nn.Linear`` over float8 e4m3 operands, scaled per token and per output channel."""

    weight8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(self, linear: Any) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # [N, 1]
        # Row-major [N, K]: its transpose is the column-major [K, N] that _scaled_mm takes.
        self.register_buffer("weight8", (w / scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.t().contiguous())  # [1, N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                   requires_grad=False)
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        x8 = (rows.float() / scale).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(x8, self.weight8.t(), scale_a=scale, scale_b=self.weight_scale,
                             out_dtype=torch.bfloat16).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class FusedSelfAttention(nn.Module):
    """An ``Attention`` used as self-attention, its query, key and value in one projection."""

    def __init__(self, attn: Any) -> None:
        super().__init__()
        q, k, v = attn.to_q, attn.to_k, attn.to_v
        self.heads = attn.heads
        self.qkv: nn.Module = nn.Linear(q.in_features, 3 * q.out_features,
                                        bias=q.bias is not None).to(q.weight)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            if q.bias is not None:
                self.qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
        self.to_out = attn.to_out

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(n, -1, self.heads, t.shape[-1] // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.to_out[0](y.transpose(1, 2).reshape(n, -1, q.shape[1] * q.shape[3]))


def _blocks(net: nn.Module) -> list[Any]:  # BasicTransformerBlock (attributes untyped)
    from engines.models.sd.modules.transformer import BasicTransformerBlock

    return [m for m in net.modules() if isinstance(m, BasicTransformerBlock)]


def fuse_qkv(net: nn.Module) -> nn.Module:
    for block in _blocks(net):
        block.attn1 = FusedSelfAttention(block.attn1)
    return net


def fp8_linears(net: nn.Module) -> nn.Module:
    for block in _blocks(net):
        attn1 = block.attn1
        if isinstance(attn1, FusedSelfAttention):
            attn1.qkv = Fp8Linear(attn1.qkv)
        else:
            for name in ("to_q", "to_k", "to_v"):
                setattr(attn1, name, Fp8Linear(getattr(attn1, name)))
        attn1.to_out[0] = Fp8Linear(attn1.to_out[0])
        block.attn2.to_q = Fp8Linear(block.attn2.to_q)
        block.attn2.to_out[0] = Fp8Linear(block.attn2.to_out[0])
        block.ff.net[0].proj = Fp8Linear(block.ff.net[0].proj)
        block.ff.net[2] = Fp8Linear(block.ff.net[2])
    return net


REWRITES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "qkv": fuse_qkv,
    "fp8": fp8_linears,
    "fp8_qkv": lambda net: fp8_linears(fuse_qkv(net)),
}


def rewrite(net: Any, name: str | None) -> Any:
    """``net`` rewritten in place by ``REWRITES[name]`` (unchanged for None)."""
    return net if name is None else REWRITES[name](net)
