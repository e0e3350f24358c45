"""Real all-MiniLM-L6-v2 fixtures (from the `text` extra's package), exported once per session.

Tests that need the real weights skip, saying why, where the package is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.cache import EngineCache
from engines.models import minilm
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer

BUCKETS = (16, 32, 64, 128)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    if not minilm.available():
        pytest.skip(f"{minilm.PACKAGE} is not installed ({minilm.EXTRA_HINT})")
    return minilm.bundled_model_dir()


@pytest.fixture(scope="session")
def tokenizer(minilm_dir: Path) -> TextTokenizer:
    return TextTokenizer(minilm_dir / "tokenizer.json", buckets=BUCKETS, overlap=32)


@pytest.fixture(scope="session")
def minilm_net(minilm_dir: Path) -> Any:
    pytest.importorskip("torch", reason="the reference encoder is the torch module")
    return minilm.build_encoder(minilm_dir)


@pytest.fixture(scope="session")
def text_cache(tmp_path_factory: pytest.TempPathFactory) -> EngineCache:
    return EngineCache(tmp_path_factory.mktemp("text-engines"))


@pytest.fixture(scope="session")
def text_spec(minilm_dir: Path, text_cache: EngineCache) -> EngineSpec:
    return minilm.minilm_spec(text_cache)


@pytest.fixture(scope="session")
def ort_text(text_spec: EngineSpec) -> Iterator[Any]:
    pytest.importorskip("torch", reason="the ONNX graph is exported from the torch module")
    from engines.backends.onnxruntime import OrtRunner

    with OrtRunner(text_spec, intra_op_threads=2) as runner:
        yield runner
