"""all-MiniLM-L6-v2: the spec and bundled files (:mod:`.spec`), the native torch encoder
(:mod:`.net`, imports torch)."""

from __future__ import annotations

from engines.models.minilm.spec import (
    DIM,
    EXTRA_HINT,
    MODEL_ID,
    PACKAGE,
    TOKENIZER_SHA256,
    WEIGHTS_SHA256,
    available,
    build_encoder,
    bundled_model_dir,
    export_spec,
    minilm_spec,
    weights_loader,
)

__all__ = ["DIM", "EXTRA_HINT", "MODEL_ID", "PACKAGE", "TOKENIZER_SHA256", "WEIGHTS_SHA256",
           "available", "build_encoder", "bundled_model_dir", "export_spec", "minilm_spec",
           "weights_loader"]
