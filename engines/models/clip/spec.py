"""The two CLIP engines' specs: ``clip_image`` and ``clip_text``, ONNX exported on first use;
the torch backend runs the towers themselves (both built once, from one weights file)."""

from __future__ import annotations

from pathlib import Path

from engines.cache import EngineCache
from engines.models.clip.build import (
    ClipTowers,
    check_folder,
    image_export,
    read_config,
    text_export,
)
from engines.onnx_export import OnnxFromTorch
from engines.spec import EngineSpec, NativeNet, TensorSpec
from engines.weights import WeightsFromPath

IMAGE_ID, TEXT_ID = "clip_image", "clip_text"


def clip_specs(cache: EngineCache, folder: Path) -> tuple[EngineSpec, EngineSpec]:
    """(image spec, text spec) for the CLIP checkpoint in ``folder``."""
    check_folder(folder)
    cfg = read_config(folder)
    size, dim = cfg.vision.image_size, cfg.projection_dim
    weights = WeightsFromPath(folder / "model.safetensors")  # shared: hashed once
    towers = ClipTowers(folder)
    image = EngineSpec(
        model_id=IMAGE_ID, onnx=OnnxFromTorch(IMAGE_ID, weights, image_export(folder, size),
                                              cache),
        inputs=(TensorSpec("pixel_values", (-1, 3, size, size)),),
        outputs=(TensorSpec("embedding", (-1, dim)),),
        native=NativeNet(lambda device: (towers.get(0), weights().sha256)))
    text = EngineSpec(
        model_id=TEXT_ID, onnx=OnnxFromTorch(TEXT_ID, weights, text_export(folder), cache),
        inputs=(TensorSpec("input_ids", (-1, -1), "int64"),
                TensorSpec("attention_mask", (-1, -1), "int64")),
        outputs=(TensorSpec("embedding", (-1, dim)),),
        native=NativeNet(lambda device: (towers.get(1), weights().sha256)))
    return image, text
