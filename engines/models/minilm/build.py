"""all-MiniLM-L6-v2's networks from a Hugging Face folder: the sentence encoder with the
checkpoint's weights (for the ONNX export and the torch backend). torch is imported when called.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.exceptions import EngineError
from engines.onnx_export import ExportSpec
from engines.spec import NativeNet
from engines.weights import Weights, load_safetensors

if TYPE_CHECKING:
    from engines.models.minilm.net import SentenceEncoder

# Bumped whenever net.SentenceEncoder's graph changes: part of the export cache key.
MINILM_GRAPH_VERSION = "minilm-meanpool-l2-v1"
# Checkpoint entries the sentence encoder does not use: the unused pooler head, and a
# position-ids buffer old transformers versions saved.
_UNUSED = ("pooler.", "embeddings.position_ids")


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
        graph_version=MINILM_GRAPH_VERSION)




def native_minilm(folder: Path, weights: Callable[[], Weights]) -> NativeNet:
    """The encoder for the torch backend, identified by its weights' digest."""
    return NativeNet(lambda device: (build_encoder(folder), weights().sha256))
