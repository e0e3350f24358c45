"""Yahoo open_nsfw: the spec (:mod:`.spec`) and the native torch network (:mod:`.net`)."""

from __future__ import annotations

from engines.models.open_nsfw.spec import LABELS, SHA256, bundled_onnx_path, open_nsfw_spec

__all__ = ["LABELS", "SHA256", "bundled_onnx_path", "open_nsfw_spec"]
