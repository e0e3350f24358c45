"""ONNX exported from a native torch module, once, into the engine cache.

The exported graph depends only on the weights, the module code (``graph_version``) and the
opset, so those are its cache key: an ONNX exported by one torch version serves every machine
(ONNX is portable; the device-specific step is the ORT/TensorRT build that follows, keyed on
this ONNX's digest). A cached export therefore also loads where torch is not installed; with
neither torch nor a cached export, a ``fallback`` ONNX (one a package ships) is used, else the
error names the extra to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.cache import BuildRecipe, EngineCache, EngineFromCache
from engines.device import DeviceFingerprint
from engines.exceptions import BackendUnavailable, EngineError
from engines.loaders import OnnxModel
from engines.weights import Weights

OPSET = 17  # LayerNormalization is a single op from 17 on
PORTABLE = DeviceFingerprint("any", "portable", "onnx")


@dataclass(frozen=True)
class ExportSpec:
    """How to export: the module factory, example inputs and the graph's tensor names."""

    build: Callable[[], Any]  # -> torch.nn.Module (fp32, eval, CPU)
    example: Callable[[], tuple[Any, ...]]  # -> example input tensors
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]]
    graph_version: str


def export_onnx(spec: ExportSpec, out: Path) -> None:
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable("exporting to ONNX needs torch (once; the result is cached)"
                                 ) from exc
    net = spec.build()
    with torch.no_grad():
        # The TorchScript exporter: deterministic for these plain modules, and it needs no
        # onnxscript (which the dynamo exporter does).
        torch.onnx.export(net, spec.example(), str(out), input_names=list(spec.input_names),
                          output_names=list(spec.output_names),
                          dynamic_axes={k: dict(v) for k, v in spec.dynamic_axes.items()},
                          opset_version=OPSET, dynamo=False)
    if not out.is_file():
        raise EngineError(f"torch.onnx.export wrote no file for {spec.graph_version}")


@dataclass(frozen=True)
class OnnxFromTorch:
    """Lazy loader (an ``EngineSpec.onnx``): the cached export, exported when missing."""

    model_id: str
    weights: Callable[[], Weights]
    export: ExportSpec
    cache: EngineCache
    fallback: Callable[[], OnnxModel] | None = None

    def recipe(self) -> BuildRecipe:
        return BuildRecipe(
            model_id=f"{self.model_id}.onnx", onnx_sha256=self.weights().sha256,
            backend="onnx-export", backend_version=f"opset{OPSET}-{self.export.graph_version}",
            device=PORTABLE, precision="fp32", profiles=(), artifact_name="model.onnx")

    def __call__(self) -> OnnxModel:
        recipe = self.recipe()
        entry = self.cache.lookup(recipe)
        if entry is None:
            # torch's exporter needs both torch and onnx.
            missing = [m for m in ("torch", "onnx") if importlib.util.find_spec(m) is None]
            if missing:
                if self.fallback is not None:
                    return self.fallback()
                raise BackendUnavailable(
                    f"{self.model_id}: no cached ONNX export, and {' and '.join(missing)} "
                    "(needed to make one) not installed; pip install 'kafka-trt-worker[text]'")
            entry = EngineFromCache(self.cache, recipe,
                                    lambda out: export_onnx(self.export, out))()
        data = entry.artifact.read_bytes()
        return OnnxModel(data, hashlib.sha256(data).hexdigest(), str(entry.artifact))
