"""Prompt -> token ids [N, 77] int64: CLIP's BPE tokenizer from a local folder, or a hash one.

The hash tokenizer exists for random-weight engines (tests, demo, benchmarks): with random
weights any deterministic mapping is as good as CLIP's vocabulary, and it needs no vocabulary
file. It keeps CLIP's framing (start token, words, end token, padded with the end token) so the
text encoder sees the same sequence structure.
"""

from __future__ import annotations

import json
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
    """CLIP's BPE tokenizer read from ``folder`` (vocab.json + merges.txt), offline.

    Built on ``tokenizers`` so that serving never imports transformers (seconds of warm start).
    The pipeline is the one transformers' ``CLIPTokenizer`` builds from the same two files in
    the transformers this project runs (5.x, where CLIPTokenizer *is* tokenizers-backed and the
    slow Python tokenizer and its ftfy/BasicTokenizer normalisation are gone; ftfy is not
    installed either). tests/unit/engines/models/sd/test_clip_tokenizer.py checks the ids
    against it on the real CLIP vocabulary. transformers 4.x's slow tokenizer (no ftfy) differs
    on exotic input only; that test's docstring lists how. A tokenizer.json in the folder is
    ignored: vocab.json + merges.txt are always there and define the same model.
    """

    BOS, EOS = "<|startoftext|>", "<|endoftext|>"
    # Words are letter runs, single digits, punctuation runs and English contractions; the
    # special tokens survive as one word (CLIP's own pattern).
    _SPLIT = (r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d"
              r"|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+")

    def __init__(self, folder: Path, max_length: int = 77) -> None:
        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        if not vocab.is_file() or not merges.is_file():
            raise ModelNotFound(f"{folder} has no CLIP tokenizer (vocab.json + merges.txt)")
        try:
            from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers, processors
            from tokenizers import Tokenizer as HfTokenizer
            from tokenizers.models import BPE
        except ImportError as exc:
            raise ModelNotFound("reading a CLIP tokenizer needs `tokenizers`; "
                                "pip install 'kafka-trt-worker[gen]'") from exc
        try:
            # Unknown pieces cannot occur with a byte-level vocabulary; CLIP names EOS anyway.
            model = BPE.from_file(str(vocab), str(merges), unk_token=self.EOS,
                                  continuing_subword_prefix="", end_of_word_suffix="</w>",
                                  fuse_unk=False)
        except Exception as exc:  # the Rust reader raises plain Exception on bad files
            raise ModelNotFound(f"{folder}: unreadable CLIP vocab.json/merges.txt") from exc
        tok = HfTokenizer(model)
        # Special tokens are matched in the raw text (normalized=False), before lowercasing.
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t in (self.BOS, self.EOS)])
        tok.normalizer = normalizers.Sequence([
            normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(self._SPLIT), behavior="removed", invert=True),
            # Its GPT-2 regex (use_regex, on as in transformers) splits only mixed pieces, such
            # as an uppercase "<|ENDOFTEXT|>" that the added-token match above missed.
            pre_tokenizers.ByteLevel(add_prefix_space=False)])
        bos, eos = tok.token_to_id(self.BOS), tok.token_to_id(self.EOS)
        pad_token = _pad_token(folder) or self.EOS
        pad = tok.token_to_id(pad_token)
        if bos is None or eos is None or pad is None:
            raise ModelNotFound(f"{folder}/vocab.json lacks {self.BOS}, {self.EOS} "
                                f"or the pad token {pad_token!r}")
        tok.post_processor = processors.TemplateProcessing(
            single=f"{self.BOS} $A {self.EOS}", special_tokens=[(self.BOS, bos), (self.EOS, eos)])
        # Truncation leaves room for the two special tokens: BOS, <= 75 tokens, EOS.
        tok.enable_truncation(max_length)
        tok.enable_padding(length=max_length, pad_id=pad, pad_token=pad_token)
        self._tok, self.max_length = tok, max_length

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.max_length), dtype=np.int64)
        return np.array([e.ids for e in self._tok.encode_batch(texts)], dtype=np.int64)


def _pad_token(folder: Path) -> str | None:
    """The pad token the folder configures: SD 1.5 pads with EOS, SD 2.x with "!"."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            pad = json.loads(path.read_text(encoding="utf-8")).get("pad_token")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelNotFound(f"{path} is not a JSON object") from exc
        if isinstance(pad, dict):  # a serialised AddedToken
            pad = pad.get("content")
        if isinstance(pad, str):
            return pad
    return None
