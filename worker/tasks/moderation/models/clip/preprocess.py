"""CLIP's image preprocessing: shortest side to S (bicubic), centre crop S, CLIP mean/std, CHW.

Matches the CLIPImageProcessor defaults of the released checkpoints (resize shortest edge,
centre crop, rescale 1/255, normalise) so zero-shot scores are those the weights were trained
for. Decoding (and its bomb guards) is :func:`worker.tasks.moderation.images.cpu.decode_image`;
the same steps on torch, for generated images on a CUDA device, are
:mod:`worker.tasks.moderation.models.clip.gpu_preprocess`.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from engines.models.clip import MEAN, STD

_MEAN = np.array(MEAN, dtype=np.float32)[:, None, None]
_STD = np.array(STD, dtype=np.float32)[:, None, None]


def resized_side(w: int, h: int, size: int) -> tuple[int, int]:
    """(width, height) of a ``w`` x ``h`` image with its shortest side scaled to ``size``."""
    scale = size / min(w, h)
    return max(size, round(w * scale)), max(size, round(h * scale))


def preprocess_clip(img: Image.Image, size: int) -> np.ndarray:
    """float32 [3, size, size] for one RGB image."""
    resized = img.resize(resized_side(*img.size, size), resample=Image.Resampling.BICUBIC)
    left = (resized.width - size) // 2
    top = (resized.height - size) // 2
    cropped = resized.crop((left, top, left + size, top + size))
    chw = np.asarray(cropped, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return np.ascontiguousarray((chw - _MEAN) / _STD)


def preprocess_pixels(pixels: np.ndarray, size: int) -> np.ndarray:
    """float32 [N, 3, size, size] for uint8 RGB pixels [N, H, W, 3] (generated images on the
    host): each through :func:`preprocess_clip`, as a decoded job image is, so a generated
    image scores what a PNG of it scores as a moderation job."""
    return np.stack([preprocess_clip(Image.fromarray(np.ascontiguousarray(px)), size)
                     for px in pixels])
