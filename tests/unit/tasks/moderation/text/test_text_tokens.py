"""engines.tokens: chunks with overlap, token-length buckets, padding (real MiniLM tokenizer)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from engines.tokens import Chunk, TextTokenizer

CLS, SEP = 101, 102


def test_special_tokens_come_from_the_tokenizer_template(tokenizer: TextTokenizer) -> None:
    assert tokenizer.prefix == (CLS,) and tokenizer.suffix == (SEP,)
    assert tokenizer.window == 128 - 2


def test_short_text_is_one_chunk_in_the_smallest_bucket(tokenizer: TextTokenizer) -> None:
    [chunk] = tokenizer.chunks("The weather is nice today.")
    assert chunk.ids[0] == CLS and chunk.ids[-1] == SEP
    assert chunk.bucket == 16 and len(chunk.ids) <= 16


def test_empty_text_is_one_chunk_of_special_tokens(tokenizer: TextTokenizer) -> None:
    assert tokenizer.chunks("") == [Chunk((CLS, SEP), 16)]


@pytest.mark.parametrize(("n_words", "buckets"), [(10, {16}), (25, {32}), (50, {64}),
                                                   (100, {128})])
def test_bucket_is_the_smallest_that_holds_the_chunk(tokenizer: TextTokenizer, n_words: int,
                                                     buckets: set[int]) -> None:
    chunks = tokenizer.chunks(" ".join(["apple"] * n_words))  # one token per word
    assert {c.bucket for c in chunks} == buckets


def test_long_text_windows_cover_every_token_with_the_overlap(tokenizer: TextTokenizer
                                                              ) -> None:
    text = " ".join(f"w{i}" for i in range(400))
    content = tokenizer.content_ids(text)
    chunks = tokenizer.chunks(text)
    assert len(chunks) > 3
    inner = [list(c.ids[1:-1]) for c in chunks]
    assert all(len(c.ids) <= 128 for c in chunks)
    step = tokenizer.window - tokenizer.overlap
    for k, ids in enumerate(inner):
        assert ids == content[k * step: k * step + tokenizer.window]
    for a, b in itertools.pairwise(inner):  # consecutive windows share `overlap`
        assert a[-tokenizer.overlap:] == b[: tokenizer.overlap]
    assert inner[-1][-1] == content[-1]  # the end of the text is covered


def test_each_sentence_is_its_own_chunk(tokenizer: TextTokenizer) -> None:
    text = 'He left. Did she stay?\n"Yes!" she said... ok'
    got = [tokenizer._tok.decode(list(c.ids[1:-1])) for c in tokenizer.chunks(text)]
    assert got == ["he left.", "did she stay?", '" yes! "', "she said...", "ok"]


def test_a_long_sentence_inside_a_text_is_windowed(tokenizer: TextTokenizer) -> None:
    long_sentence = " ".join(["apple"] * 300)
    chunks = tokenizer.chunks(f"Short one. {long_sentence}. Last one.")
    assert [len(c.ids) - 2 for c in chunks] == [3, 126, 126, 113, 3]
    # 301 tokens (300 apples, the period): windows of 126 starting every 94 (overlap 32)


def test_first_chunk_truncates_to_one_window(tokenizer: TextTokenizer) -> None:
    chunk = tokenizer.first_chunk(" ".join(["apple"] * 500))
    assert len(chunk.ids) == 128 and chunk.bucket == 128 and chunk.ids[-1] == SEP


def test_pad_builds_ids_and_mask(tokenizer: TextTokenizer) -> None:
    chunks = [Chunk((CLS, 7, SEP), 16), Chunk((CLS, SEP), 16)]
    feeds = tokenizer.pad(chunks, 16)
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].shape == (2, 16)
    assert feeds["attention_mask"].sum(axis=1).tolist() == [3, 2]
    assert feeds["input_ids"][0, :4].tolist() == [CLS, 7, SEP, 0]
    with pytest.raises(ValueError, match="does not fit"):
        tokenizer.pad([Chunk(tuple(range(20)), 32)], 16)


def test_bucket_and_overlap_bounds(tokenizer: TextTokenizer, minilm_dir: Path) -> None:
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        tokenizer.bucket(129)
    with pytest.raises(ValueError, match="overlap"):
        TextTokenizer(minilm_dir / "tokenizer.json", buckets=(16, 32), overlap=30)
    with pytest.raises(ValueError, match="increasing"):
        TextTokenizer(minilm_dir / "tokenizer.json", buckets=(32, 16))
