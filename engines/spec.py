"""What a model is to the engines: its id, where its ONNX comes from, and its tensors.

Issue 3 grows this into profiles (static buckets and min/opt/max ranges) and precisions; the
walking skeleton needs only the model's identity and its single image input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engines.loaders import OnnxModel


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    # -1 marks the dynamic batch dimension.
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    model_id: str
    onnx: Callable[[], OnnxModel]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...] = ()
    precision: str = "fp32"
