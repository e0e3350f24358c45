"""The real all-MiniLM-L6-v2 weights: semantics that a moderation policy relies on.

The fixed sentences (tests/unit/text/sentences.py) are plainly violent, plainly scams, or
plainly neutral; the label descriptions are those of deploy/config.example.toml's "captions"
policy. Ranking (not absolute values) is what is asserted, plus the calibrated scores landing
on the right side of 0.5 for the clear cases, since the calibration constants are documented
defaults, not fitted probabilities.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.tokens import TextTokenizer
from tests.unit.tasks.moderation.text.sentences import NEUTRAL, POLICY, SCAM, VIOLENT
from worker.tasks.moderation.models.text.scoring import LabelBank, label_bank


def _embed(net: Any, tok: TextTokenizer, texts: list[str]) -> np.ndarray:
    import torch

    feeds = tok.pad([tok.first_chunk(t) for t in texts], 128)
    with torch.no_grad():
        out = net(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    return np.asarray(out.numpy())


@pytest.fixture(scope="module")
def bank(minilm_net: Any, tokenizer: TextTokenizer) -> LabelBank:
    return label_bank(POLICY, lambda texts: _embed(minilm_net, tokenizer, texts))


def _scores(bank: LabelBank, net: Any, tok: TextTokenizer, texts: list[str]
            ) -> list[dict[str, float]]:
    return [bank.scores(row[None]) for row in _embed(net, tok, texts)]


@pytest.mark.parametrize(("label", "positives"), [("violence", VIOLENT), ("scam", SCAM)])
def test_matching_sentences_rank_above_every_neutral_one(
        bank: LabelBank, minilm_net: Any, tokenizer: TextTokenizer, label: str,
        positives: list[str]) -> None:
    pos = [s[label] for s in _scores(bank, minilm_net, tokenizer, positives)]
    neg = [s[label] for s in _scores(bank, minilm_net, tokenizer, NEUTRAL)]
    assert min(pos) > max(neg), (pos, neg)
    assert np.median(pos) > 0.5 > max(neg)


def test_each_kind_scores_higher_on_its_own_label(bank: LabelBank, minilm_net: Any,
                                                  tokenizer: TextTokenizer) -> None:
    for s in _scores(bank, minilm_net, tokenizer, VIOLENT):
        assert s["violence"] > s["scam"]
    for s in _scores(bank, minilm_net, tokenizer, SCAM):
        assert s["scam"] > s["violence"]


def test_cosine_similarities_are_sensible(minilm_net: Any, tokenizer: TextTokenizer) -> None:
    a, para, other = _embed(minilm_net, tokenizer, [
        "A man is playing a guitar on stage.", "Someone performs a song on the guitar.",
        "The stock market fell sharply on Monday."])
    assert np.allclose(np.linalg.norm([a, para, other], axis=1), 1.0, atol=1e-5)
    assert float(a @ para) > 0.5 > 0.2 > float(a @ other)


def test_matches_sentence_transformers(minilm_net: Any, tokenizer: TextTokenizer,
                                       minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    """The reference implementation of all-MiniLM-L6-v2, where installed (offline)."""
    st = pytest.importorskip("sentence_transformers",
                             reason="sentence-transformers is the reference, not a dependency")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(
        VIOLENT + NEUTRAL, normalize_embeddings=True)
    ours = _embed(minilm_net, tokenizer, VIOLENT + NEUTRAL)
    assert np.abs(ours - ref).max() < 1e-5
    assert os.environ["HF_HUB_OFFLINE"] == "1"
