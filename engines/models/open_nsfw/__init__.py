"""Yahoo open_nsfw: the spec (:mod:`.spec`), the native torch network (:mod:`.net`, imports
torch) and what the torch backend builds from it (:mod:`.build`)."""

from __future__ import annotations

from engines.models.open_nsfw.spec import (
    ITEM_SHAPE,
    LABELS,
    SHA256,
    bundled_onnx_path,
    open_nsfw_spec,
)

__all__ = ["ITEM_SHAPE", "LABELS", "SHA256", "bundled_onnx_path", "open_nsfw_spec"]
