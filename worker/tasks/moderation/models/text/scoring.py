"""Text -> per-label scores: calibrated similarity to each label's descriptions, max over chunks.

Calibration. MiniLM cosine similarities are not probabilities: a plainly matching sentence
scores ~0.35-0.7 against a good description, unrelated text ~-0.1-0.2 (measured on the real
weights; see tests/unit/text/test_text_real_weights.py). Each label maps its best cosine through
a logistic, ``score = 1 / (1 + exp(-(cos - center) / width))``: ``center`` is the cosine that
scores 0.5, and every ``width`` of cosine is one logit (defaults 0.35 and 0.05: cos 0.20 ->
0.05, 0.35 -> 0.5, 0.50 -> 0.95). These are documented constants to tune per label against a
policy's own examples, not a probability fitted to labelled data.

Chunks. A long text is scored per chunk (see engines.tokens) and a label's score is its maximum
over chunks: one violent paragraph inside a long harmless text still counts in full.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines.backends.base import Runner
from engines.tokens import Chunk, TextTokenizer
from worker.config.policies import PolicySettings


def calibrate(cos: np.ndarray, center: np.ndarray, width: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-(cos - center) / width)), dtype=np.float64)


@dataclass(frozen=True)
class LabelBank:
    """A policy's described labels: every description's unit embedding, grouped by label."""

    labels: tuple[str, ...]
    vectors: np.ndarray  # [descriptions, dim], label by label
    starts: np.ndarray  # index of each label's first description in ``vectors``
    center: np.ndarray  # [labels]
    width: np.ndarray  # [labels]

    def cosines(self, emb: np.ndarray) -> np.ndarray:
        """[rows, labels]: each row's best cosine over each label's descriptions."""
        sims = emb.astype(np.float64) @ self.vectors.T.astype(np.float64)
        return np.asarray(np.maximum.reduceat(sims, self.starts, axis=1))

    def scores(self, chunk_embeddings: np.ndarray) -> dict[str, float]:
        """One text's scores from its chunks' embeddings: calibrated, max over chunks."""
        best = self.cosines(chunk_embeddings).max(axis=0)
        return dict(zip(self.labels, map(float, calibrate(best, self.center, self.width)),
                        strict=True))


def label_bank(policy: PolicySettings, embed: Callable[[list[str]], np.ndarray]
               ) -> LabelBank:
    described = [(name, lb) for name, lb in policy.labels.items() if lb.descriptions]
    texts = [d for _, lb in described for d in lb.descriptions]
    counts = [len(lb.descriptions) for _, lb in described]
    return LabelBank(
        labels=tuple(name for name, _ in described), vectors=embed(texts),
        starts=np.cumsum([0, *counts[:-1]]),
        center=np.array([lb.center for _, lb in described]),
        width=np.array([lb.width for _, lb in described]))


def embed_chunks(runner: Runner, tokenizer: TextTokenizer, chunks: Sequence[Chunk],
                 max_batch: int, output: str = "embedding") -> np.ndarray:
    """Embeddings of ``chunks`` in order, run bucket by bucket in batches of ``max_batch``."""
    out: list[np.ndarray | None] = [None] * len(chunks)
    for bucket in sorted({c.bucket for c in chunks}):
        rows = [i for i, c in enumerate(chunks) if c.bucket == bucket]
        for s in range(0, len(rows), max_batch):
            part = rows[s:s + max_batch]
            feeds = tokenizer.pad([chunks[i] for i in part], bucket)
            emb = runner.infer(feeds).result()[output]
            for i, row in zip(part, emb, strict=True):
                out[i] = row
    return np.stack([r for r in out if r is not None]) if chunks else np.zeros((0, 0))


def embed_texts(runner: Runner, tokenizer: TextTokenizer, texts: Sequence[str],
                max_batch: int) -> np.ndarray:
    """One embedding per text, truncated to one window (label descriptions, CLIP prompts)."""
    return embed_chunks(runner, tokenizer, [tokenizer.first_chunk(t) for t in texts], max_batch)
