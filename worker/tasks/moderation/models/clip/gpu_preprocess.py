"""CLIP's preprocessing of generated images where they live (a CUDA device): the geometry and
statistics of :func:`worker.tasks.moderation.models.clip.preprocess.preprocess_clip` on torch.

Shortest side to S (bicubic with antialiasing, Pillow's BICUBIC semantics), centre crop S,
rescale 1/255, CLIP mean/std, CHW. Pillow resizes an 8-bit image in two passes, horizontal then
vertical, each rounded and clamped to uint8; bicubic overshoots on sharp edges, so one 2-D pass
clamped once differs from it by up to 16 levels on noise, the two passes here by at most one.
torch is imported lazily; everything runs on whatever device the pixels live on, so the same
code is tested on the CPU against Pillow.
"""

from __future__ import annotations

from typing import Any

from engines.models.clip import MEAN, STD
from worker.tasks.moderation.models.clip.preprocess import resized_side


def preprocess_generated(pixels: Any, size: int) -> Any:
    """uint8 RGB [N, H, W, 3] (one size, the VAE's layout) -> CLIP's float32 input
    [N, 3, size, size], computed on the device ``pixels`` live on."""
    import torch
    import torch.nn.functional as F

    x = pixels.permute(0, 3, 1, 2).float()
    h, w = int(x.shape[2]), int(x.shape[3])
    new_w, new_h = resized_side(w, h, size)
    # A pass that keeps its side is skipped, as Pillow skips it.
    for size_hw in ((h, new_w), (new_h, new_w)):
        if tuple(x.shape[2:]) != size_hw:
            x = F.interpolate(x, size=size_hw, mode="bicubic", antialias=True,
                              align_corners=False).round_().clamp_(0, 255)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    x = x[:, :, top:top + size, left:left + size]
    mean = torch.tensor(MEAN, dtype=torch.float32, device=x.device)[:, None, None]
    std = torch.tensor(STD, dtype=torch.float32, device=x.device)[:, None, None]
    return ((x / 255.0 - mean) / std).contiguous()
