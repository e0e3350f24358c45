"""Tokenisation for the text engines: chunks with overlap, padded to token-length buckets.

A text becomes one or more *chunks*: windows of at most ``max_tokens`` tokens (special tokens
included) that overlap by ``overlap`` content tokens, so a phrase cut by one window boundary is
whole in the next. Each chunk is padded to the smallest bucket (16/32/64/128 by default) that
holds it; a bucket is an engine profile, so short texts never pay for 128-token compute.
Special tokens come from the tokenizer's own post-processor (BERT ``[CLS] .. [SEP]``, CLIP
``<|startoftext|> .. <|endoftext|>``), found once by encoding a probe.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.exceptions import BackendUnavailable, ModelNotFound


@dataclass(frozen=True, slots=True)
class Chunk:
    ids: tuple[int, ...]  # with special tokens, unpadded
    bucket: int  # padded length: the engine profile this chunk runs in


class TextTokenizer:
    def __init__(self, path: Path, *, buckets: tuple[int, ...], overlap: int = 0,
                 pad_id: int = 0) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise BackendUnavailable("the `tokenizers` package does not import; "
                                     "pip install 'kafka-trt-worker[text]'") from exc
        if not path.is_file():
            raise ModelNotFound(f"tokenizer file not found: {path}")
        if not buckets or list(buckets) != sorted(set(buckets)):
            raise ValueError("token buckets must be strictly increasing")
        self._tok = Tokenizer.from_file(str(path))
        # tokenizer.json files often carry fixed padding/truncation; chunking is done here.
        self._tok.no_padding()
        self._tok.no_truncation()
        self.buckets, self.pad_id = buckets, pad_id
        self.prefix, self.suffix = self._specials()
        self.window = buckets[-1] - len(self.prefix) - len(self.suffix)
        if not 0 <= overlap < self.window:
            raise ValueError(f"overlap must be in [0, {self.window}) tokens")
        self.overlap = overlap

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def _specials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        probe = "hello"
        content = self._tok.encode(probe, add_special_tokens=False).ids
        full = self._tok.encode(probe).ids
        for i in range(len(full) - len(content) + 1):
            if full[i:i + len(content)] == content:
                return tuple(full[:i]), tuple(full[i + len(content):])
        raise ValueError("cannot locate the content tokens inside the tokenizer's template")

    def content_ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def bucket(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        if i == len(self.buckets):
            raise ValueError(f"{n} tokens exceed the largest bucket {self.buckets[-1]}")
        return self.buckets[i]

    def _chunk(self, ids: list[int]) -> Chunk:
        full = (*self.prefix, *ids, *self.suffix)
        return Chunk(full, self.bucket(len(full)))

    def chunks(self, text: str) -> list[Chunk]:
        """Overlapping windows covering the whole text (one chunk for an empty text)."""
        ids = self.content_ids(text)
        step = self.window - self.overlap
        starts = range(0, max(len(ids) - self.overlap, 1), step)
        return [self._chunk(ids[s:s + self.window]) for s in starts]

    def first_chunk(self, text: str) -> Chunk:
        """The text truncated to one window (CLIP captions: one context of 77 tokens)."""
        return self._chunk(self.content_ids(text)[: self.window])

    def pad(self, chunks: list[Chunk], length: int) -> dict[str, np.ndarray]:
        """``input_ids`` and ``attention_mask`` (int64 [len(chunks), length])."""
        ids = np.full((len(chunks), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(chunks), length), dtype=np.int64)
        for row, c in enumerate(chunks):
            if len(c.ids) > length:
                raise ValueError(f"a chunk of {len(c.ids)} tokens does not fit length {length}")
            ids[row, : len(c.ids)] = c.ids
            mask[row, : len(c.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}
