"""The real all-MiniLM-L6-v2 fixtures of the text suite (tests/unit/text/conftest.py), shared
with the MiniLM engine tests here."""

from __future__ import annotations

from tests.unit.tasks.moderation.text.conftest import (
    minilm_dir,
    minilm_net,
    ort_text,
    text_cache,
    text_spec,
    tokenizer,
)

__all__ = ["minilm_dir", "minilm_net", "ort_text", "text_cache", "text_spec", "tokenizer"]
