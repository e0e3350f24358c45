"""What a model is to the engines: its id, where its ONNX and its native network come from, and
its tensors.

``onnx`` feeds the backends that build from a graph (onnxruntime, TensorRT); ``native`` feeds the
backends that run the model's own network (torch). Both are lazy loaders from the model's
package, so a backend gets a model's network without importing the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines.loaders import OnnxModel


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    # -1 marks a dynamic dimension (the batch dimension always is).
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class NativeNet:
    """A model's own network (a ``torch.nn.Module``), as factories the model package provides.

    ``fresh(device)`` builds it with its weights (fp32) and says which weights those are (a
    digest: part of the engine hash); ``skeleton(device)`` builds the architecture alone, for a
    cached state dict that overwrites every parameter. The flags say how the network runs best.
    """

    fresh: Callable[[str], tuple[Any, str]]
    skeleton: Callable[[str], Any] | None = None
    channels_last: bool = False  # convolutions over NHWC input: keep the weights channels-last
    # Where an artifact's weights are made: on the target device (a random initialisation is
    # fastest there) or on the CPU (weights read from files).
    build_on_target: bool = False
    # Large networks: CUDA graphs are captured at first use (or by warm_up()) into one memory
    # pool shared by all of them, so they replay in order on the runner's own stream.
    shared_graph_pool: bool = False
    # For pixel pipelines: device -> a device-side transform of uint8 RGB NHWC pixels into the
    # network's input (captured into the pipeline's graphs).
    pixel_input: Callable[[Any], Callable[[Any], Any]] | None = None


@dataclass(frozen=True, slots=True)
class EngineSpec:
    model_id: str
    onnx: Callable[[], OnnxModel]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...] = ()
    precision: str = "fp32"
    native: NativeNet | None = None
