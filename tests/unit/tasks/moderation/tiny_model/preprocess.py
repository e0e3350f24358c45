"""The tiny classifier's CPU preprocessing: RGB, resized to size x size, CHW floats in [0, 1]."""

from __future__ import annotations

import numpy as np
from PIL import Image


def preprocess_tiny(img: Image.Image, size: int) -> np.ndarray:
    small = img.convert("RGB").resize((size, size), resample=Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(small, dtype=np.float32).transpose(2, 0, 1) / 255.0)
