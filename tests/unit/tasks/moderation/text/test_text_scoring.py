"""worker.tasks.moderation.models.text.scoring: calibration, label banks, max over chunks,
batching by bucket."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from engines.backends.base import FutureHandle, InferHandle, Runner
from engines.tokens import Chunk, TextTokenizer
from tests.unit.tasks.moderation.text.sentences import NEUTRAL, POLICY, VIOLENT
from worker.config.policies import PolicySettings
from worker.tasks.moderation.models.text.scoring import (
    LabelBank,
    calibrate,
    embed_chunks,
    label_bank,
)


def test_calibration_constants() -> None:
    c, w = np.array([0.35]), np.array([0.05])
    got = calibrate(np.array([0.20, 0.35, 0.50, -1.0, 1.0]), c, w)
    assert got[1] == pytest.approx(0.5)
    assert got[0] == pytest.approx(1 / (1 + np.exp(3)))  # three widths below: ~0.047
    assert got[2] == pytest.approx(1 / (1 + np.exp(-3)))  # three widths above: ~0.953
    assert 0.0 < got[3] < 1e-5 and 1 - 1e-5 < got[4] < 1.0
    assert np.all(np.diff(calibrate(np.linspace(-1, 1, 50), c, w)) > 0)  # monotone


def _unit(*rows: list[float]) -> np.ndarray:
    a = np.array(rows, dtype=np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_bank_takes_the_best_description_per_label_then_the_best_chunk() -> None:
    policy = PolicySettings(models=["text"], labels={
        "a": {"descriptions": ["a1", "a2"], "center": 0.5, "width": 0.1},
        "b": {"descriptions": ["b1"]}})
    vecs = {"a1": [1, 0, 0], "a2": [0, 1, 0], "b1": [0, 0, 1]}
    bank = label_bank(policy, lambda texts: _unit(*(vecs[t] for t in texts)))
    assert bank.labels == ("a", "b") and bank.starts.tolist() == [0, 2]
    chunks = _unit([0, 1, 0], [0.6, 0, 0.8])  # chunk 0 matches a2 exactly, chunk 1 mostly b1
    cos = bank.cosines(chunks)
    assert np.allclose(cos, [[1.0, 0.0], [0.6, 0.8]])
    scores = bank.scores(chunks)
    assert scores["a"] == pytest.approx(float(calibrate(np.array(1.0), np.array(0.5),
                                                        np.array(0.1))))
    assert scores["b"] == pytest.approx(float(calibrate(np.array(0.8), np.array(0.35),
                                                        np.array(0.05))))


class _EchoRunner(Runner):
    """Returns each row's token count as its 'embedding' and records batch shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    @property
    def engine_hash(self) -> str:
        return "echo"

    def _activate(self) -> None: ...

    def _deactivate(self) -> None: ...

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        self.shapes.append(feeds["input_ids"].shape)
        fut: Future[dict[str, np.ndarray]] = Future()
        fut.set_result({"embedding": feeds["attention_mask"].sum(axis=1, keepdims=True)})
        return FutureHandle(fut)


def test_embed_chunks_batches_by_bucket_and_keeps_order(tokenizer: TextTokenizer) -> None:
    chunks = [Chunk(tuple(range(n)), tokenizer.bucket(n)) for n in (3, 40, 5, 20, 7, 100)]
    with _EchoRunner() as runner:
        out = embed_chunks(runner, tokenizer, chunks, max_batch=2)
    assert out[:, 0].tolist() == [3, 40, 5, 20, 7, 100]
    assert sorted(runner.shapes) == [(1, 16), (1, 32), (1, 64), (1, 128), (2, 16)]


@pytest.fixture(scope="module")
def ort_bank(ort_text: Any, tokenizer: TextTokenizer) -> LabelBank:
    from worker.tasks.moderation.models.text.scoring import embed_texts

    return label_bank(POLICY, lambda texts: embed_texts(ort_text, tokenizer, texts, 32))


def test_long_text_scores_its_worst_sentence(ort_text: Any, tokenizer: TextTokenizer,
                                             ort_bank: LabelBank) -> None:
    """A violent sentence amid ~450 harmless tokens counts in full: it is its own chunk."""
    filler = " ".join(NEUTRAL * 6)
    long_text = f"{filler} {VIOLENT[2]} {filler}"
    chunks = tokenizer.chunks(long_text)
    assert len(chunks) == 2 * len(NEUTRAL) * 6 + 1
    assert len(tokenizer.content_ids(long_text)) > 3 * tokenizer.window

    def scores(text: str) -> dict[str, float]:
        return ort_bank.scores(embed_chunks(ort_text, tokenizer, tokenizer.chunks(text), 32))

    alone, harmless, mixed = scores(VIOLENT[2]), scores(filler), scores(long_text)
    assert mixed["violence"] == pytest.approx(alone["violence"], abs=1e-4)
    assert mixed["violence"] > 0.5 > harmless["violence"]
    assert mixed["scam"] == pytest.approx(max(alone["scam"], harmless["scam"]), abs=1e-4)
