"""Prompt -> token ids [N, 77] int64: CLIP's BPE tokenizer from a local folder, or a hash one.

The hash tokenizer exists for random-weight engines (tests, demo, benchmarks): with random
weights any deterministic mapping is as good as CLIP's vocabulary, and it needs no vocabulary
file. It keeps CLIP's framing (start token, words, end token, padded with the end token) so the
text encoder sees the same sequence structure.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

from engines.exceptions import ModelNotFound

_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


class Tokenizer(Protocol):
    max_length: int

    def __call__(self, texts: list[str]) -> np.ndarray: ...


class HashTokenizer:
    """Deterministic word-hash tokenizer; ids in [0, vocab_size - 3], then start/end ids."""

    def __init__(self, vocab_size: int, max_length: int = 77) -> None:
        if vocab_size < 4:
            raise ValueError("vocab_size must be at least 4")
        self.vocab_size, self.max_length = vocab_size, max_length
        self.bos, self.eos = vocab_size - 2, vocab_size - 1

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.full((len(texts), self.max_length), self.eos, dtype=np.int64)
        for row, text in zip(out, texts, strict=True):
            words = [zlib.crc32(w.encode()) % (self.vocab_size - 2)
                     for w in _WORD.findall(text.lower())]
            ids = [self.bos, *words[: self.max_length - 2], self.eos]
            row[: len(ids)] = ids
        return out


class ClipTokenizer:
    """transformers' CLIPTokenizer read from ``folder`` (vocab.json + merges.txt); offline."""

    def __init__(self, folder: Path, max_length: int = 77) -> None:
        if not (folder / "vocab.json").is_file() or not (folder / "merges.txt").is_file():
            raise ModelNotFound(f"{folder} has no CLIP tokenizer (vocab.json + merges.txt)")
        try:
            from transformers import CLIPTokenizer
        except ImportError as exc:
            raise ModelNotFound("reading a CLIP tokenizer needs `transformers`; "
                                "pip install 'kafka-trt-worker[gen]'") from exc
        self._tok = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.max_length = max_length

    def __call__(self, texts: list[str]) -> np.ndarray:
        enc = self._tok(texts, padding="max_length", max_length=self.max_length,
                        truncation=True, return_tensors="np")
        return np.asarray(enc["input_ids"], dtype=np.int64)
