"""CLIP's image and text towers as native torch modules, named like the Hugging Face checkpoint.

Why not ``transformers.CLIPModel``: the same reasons as for MiniLM (host-side mask branches break
CUDA-graph capture; the exported graph would move with transformers releases), and the worker
then needs transformers only in tests, as the reference these modules are checked against.
Each tower ends in its projection and an L2 normalisation, so a zero-shot logit is one matmul.
The text tower pools the end-of-text token, found from the attention mask (its last real token),
so padding after it never matters (the attention is causal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TowerConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"
    # text only
    vocab_size: int = 49408
    max_position_embeddings: int = 77
    # vision only
    image_size: int = 224
    patch_size: int = 32
    num_channels: int = 3


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "quick_gelu":  # OpenAI CLIP's activation
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu(x)
    raise ValueError(f"unsupported CLIP activation {name!r}")


class _Attention(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.heads, d = c.num_attention_heads, c.hidden_size
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        n, length, d = x.shape
        q, k, v = (t.view(n, length, self.heads, -1).transpose(1, 2)
                   for t in (self.q_proj(x), self.k_proj(x), self.v_proj(x)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.out_proj(y.transpose(1, 2).reshape(n, length, d))


class _Mlp(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.act = c.hidden_act
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(_act(self.act, self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.self_attn, self.mlp = _Attention(c), _Mlp(c)
        self.layer_norm1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layer_norm2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), causal)
        return x + self.mlp(self.layer_norm2(x))


class _Encoder(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, causal)
        return x


class _TextEmbeddings(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embedding = nn.Embedding(c.max_position_embeddings, c.hidden_size)


# The text transformer CLIP models share: the moderation CLIP tower and the SD text encoder
# (engines.models.sd.modules.text) use it with the same parameter names.
class ClipTextTransformer(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.embeddings, self.encoder = _TextEmbeddings(c), _Encoder(c)
        self.final_layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class _VisionEmbeddings(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.randn(c.hidden_size))
        self.patch_embedding = nn.Conv2d(c.num_channels, c.hidden_size, c.patch_size,
                                         c.patch_size, bias=False)
        patches = (c.image_size // c.patch_size) ** 2
        self.position_embedding = nn.Embedding(patches + 1, c.hidden_size)


class _VisionModel(nn.Module):
    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.embeddings, self.encoder = _VisionEmbeddings(c), _Encoder(c)
        self.pre_layrnorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)  # HF's spelling
        self.post_layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class ClipTextEncoder(nn.Module):
    """``input_ids``, ``attention_mask`` int64 [N, L] -> unit text embedding float32 [N, P]."""

    def __init__(self, c: TowerConfig, projection_dim: int) -> None:
        super().__init__()
        self.text_model = ClipTextTransformer(c)
        self.text_projection = nn.Linear(c.hidden_size, projection_dim, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m, emb = self.text_model, self.text_model.embeddings
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = emb.token_embedding(input_ids) + emb.position_embedding(pos)[None]
        x = m.final_layer_norm(m.encoder(x, causal=True))
        eos = (attention_mask.sum(dim=1) - 1).clamp(min=0)
        pooled = x.gather(1, eos[:, None, None].expand(-1, 1, x.shape[2]))[:, 0]
        return F.normalize(self.text_projection(pooled).float(), dim=1)


class ClipImageEncoder(nn.Module):
    """``pixel_values`` float32 [N, 3, S, S] (CLIP-normalised) -> unit embedding [N, P]."""

    def __init__(self, c: TowerConfig, projection_dim: int) -> None:
        super().__init__()
        self.vision_model = _VisionModel(c)
        self.visual_projection = nn.Linear(c.hidden_size, projection_dim, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        m, emb = self.vision_model, self.vision_model.embeddings
        w = emb.patch_embedding.weight
        x = emb.patch_embedding(pixel_values.to(w.dtype)).flatten(2).transpose(1, 2)
        cls = emb.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + emb.position_embedding.weight[None]
        x = m.encoder(m.pre_layrnorm(x), causal=False)
        pooled = m.post_layernorm(x[:, 0])
        return F.normalize(self.visual_projection(pooled).float(), dim=1)
