"""all-MiniLM-L6-v2 (a 6-layer BERT) as a native torch module with sentence-transformers pooling.

Why not ``transformers.BertModel``: its attention-mask helpers branch on tensor values on the
host (e.g. "is the mask all ones?"), which breaks CUDA-graph capture, and the ONNX it exports
would change with every transformers release. This module is the plain BERT forward with the
same parameter names as the Hugging Face checkpoint, so ``model.safetensors`` loads as is.
Mean pooling over real tokens and L2 normalisation are part of the graph, so every backend
(onnxruntime, torch + CUDA graphs) returns the final sentence embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        # Single-sentence inputs: every token is of type 0, so add that row (no input needed).
        x = self.word_embeddings(ids) + self.position_embeddings(pos)[None]
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class _Dense(nn.Module):
    """``dense`` followed by a residual LayerNorm (BERT's attention.output and output)."""

    def __init__(self, cin: int, cout: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(cin, cout)
        self.LayerNorm = nn.LayerNorm(cout, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n, length, width = x.shape
        q, k, v = (t.view(n, length, self.heads, -1).transpose(1, 2)
                   for t in (self.query(x), self.key(x), self.value(x)))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return y.transpose(1, 2).reshape(n, length, width)


class _Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(c)
        self.output = _Dense(c.hidden_size, c.hidden_size, c.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, bias), x)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # BERT's "gelu" is the exact (erf) one


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _Dense(c.intermediate_size, c.hidden_size, c.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))


class SentenceEncoder(nn.Module):
    """Inputs: ``input_ids`` and ``attention_mask``, int64 [N, L]. Output: float32 [N, hidden],
    the mean of the real tokens' last hidden states, L2-normalised (sentence-transformers)."""

    def __init__(self, config: BertConfig | None = None) -> None:
        super().__init__()
        c = config or BertConfig()
        self.embeddings = _Embeddings(c)
        self.encoder = _Encoder(c)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        keep = attention_mask.to(x.dtype)
        # Additive mask: padded keys get the dtype's lowest value, real keys 0.
        bias = ((1.0 - keep) * torch.finfo(x.dtype).min)[:, None, None, :]
        for layer in self.encoder.layer:
            x = layer(x, bias)
        m = attention_mask.to(torch.float32)[:, :, None]
        summed = (x.float() * m).sum(dim=1)
        mean = summed / m.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, p=2.0, dim=1)
