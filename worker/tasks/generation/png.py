"""uint8 pixels -> PNG bytes. zlib is deterministic, so equal pixels give equal bytes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def encode_png(pixels: np.ndarray, compress_level: int = 6) -> bytes:
    """``pixels``: uint8 [H, W, 3]. No metadata chunks: bytes depend on the pixels alone."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [H, W, 3], got {pixels.dtype} {pixels.shape}")
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()
