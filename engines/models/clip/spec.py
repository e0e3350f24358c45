"""The two CLIP engines' specs: ``clip_image`` and ``clip_text``, ONNX exported on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.cache import EngineCache
from engines.models.clip.build import GRAPH_VERSION, build_towers, check_folder, read_config
from engines.onnx_export import ExportSpec, OnnxFromTorch
from engines.spec import EngineSpec, TensorSpec
from engines.weights import WeightsFromPath

IMAGE_ID, TEXT_ID = "clip_image", "clip_text"


def _image_export(folder: Path, size: int) -> ExportSpec:
    def example() -> tuple[Any, ...]:
        import torch

        return (torch.randn(2, 3, size, size),)

    return ExportSpec(build=lambda: build_towers(folder)[0], example=example,
                      input_names=("pixel_values",), output_names=("embedding",),
                      dynamic_axes={"pixel_values": {0: "batch"}, "embedding": {0: "batch"}},
                      graph_version=f"{GRAPH_VERSION}-image")


def _text_export(folder: Path) -> ExportSpec:
    def example() -> tuple[Any, ...]:
        import torch

        ids = torch.tensor([[1, 5, 6, 2], [1, 2, 0, 0]], dtype=torch.int64)
        return ids, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.int64)

    axes = {0: "batch", 1: "tokens"}
    return ExportSpec(build=lambda: build_towers(folder)[1], example=example,
                      input_names=("input_ids", "attention_mask"), output_names=("embedding",),
                      dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                    "embedding": {0: "batch"}},
                      graph_version=f"{GRAPH_VERSION}-text")


def clip_specs(cache: EngineCache, folder: Path) -> tuple[EngineSpec, EngineSpec]:
    """(image spec, text spec) for the CLIP checkpoint in ``folder``."""
    check_folder(folder)
    cfg = read_config(folder)
    size, dim = cfg.vision.image_size, cfg.projection_dim
    weights = WeightsFromPath(folder / "model.safetensors")  # shared: hashed once
    image = EngineSpec(
        model_id=IMAGE_ID, onnx=OnnxFromTorch(IMAGE_ID, weights, _image_export(folder, size),
                                              cache),
        inputs=(TensorSpec("pixel_values", (-1, 3, size, size)),),
        outputs=(TensorSpec("embedding", (-1, dim)),))
    text = EngineSpec(
        model_id=TEXT_ID, onnx=OnnxFromTorch(TEXT_ID, weights, _text_export(folder), cache),
        inputs=(TensorSpec("input_ids", (-1, -1), "int64"),
                TensorSpec("attention_mask", (-1, -1), "int64")),
        outputs=(TensorSpec("embedding", (-1, dim)),))
    return image, text
