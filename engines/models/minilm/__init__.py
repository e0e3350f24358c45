"""all-MiniLM-L6-v2: the spec and bundled files (:mod:`.spec`), the native torch encoder
(:mod:`.net`, imports torch), its builds (:mod:`.build`) and the text engine (:mod:`.engine`)."""

from __future__ import annotations

from engines.models.minilm.build import build_encoder, export_spec
from engines.models.minilm.spec import (
    DIM,
    EXTRA_HINT,
    MODEL_ID,
    PACKAGE,
    TOKENIZER_SHA256,
    WEIGHTS_SHA256,
    available,
    bundled_model_dir,
    minilm_spec,
    weights_loader,
)

__all__ = ["DIM", "EXTRA_HINT", "MODEL_ID", "PACKAGE", "TOKENIZER_SHA256", "WEIGHTS_SHA256",
           "available", "build_encoder", "bundled_model_dir", "export_spec", "minilm_spec",
           "weights_loader"]
