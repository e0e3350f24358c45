"""CLIP's image preprocessing: shortest side to S (bicubic), centre crop S, CLIP mean/std, CHW.

Matches the CLIPImageProcessor defaults of the released checkpoints (resize shortest edge,
centre crop, rescale 1/255, normalise) so zero-shot scores are those the weights were trained
for. Decoding (and its bomb guards) is :func:`worker.tasks.moderation.images.cpu.decode_image`.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from engines.models.clip import MEAN, STD

_MEAN = np.array(MEAN, dtype=np.float32)[:, None, None]
_STD = np.array(STD, dtype=np.float32)[:, None, None]


def preprocess_clip(img: Image.Image, size: int) -> np.ndarray:
    """float32 [3, size, size] for one RGB image."""
    w, h = img.size
    scale = size / min(w, h)
    resized = img.resize((max(size, round(w * scale)), max(size, round(h * scale))),
                         resample=Image.Resampling.BICUBIC)
    left = (resized.width - size) // 2
    top = (resized.height - size) // 2
    cropped = resized.crop((left, top, left + size, top + size))
    chw = np.asarray(cropped, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return np.ascontiguousarray((chw - _MEAN) / _STD)
