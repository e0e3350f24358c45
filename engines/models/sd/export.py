"""ONNX export of an SD engine's network, done lazily at build time (the ORT backend's source).

The legacy TorchScript exporter (``dynamo=False``) is used: it needs no onnxscript and keeps
the batch and spatial axes dynamic, so one ONNX file serves every profile. A protobuf file cannot
exceed 2 GiB, so the full fp32 UNet (3.4 GB) cannot be exported this way; the ORT backend is the
CPU path for small models and for checking the torch runner, not for full-size SD.
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.exceptions import EngineError
from engines.loaders import OnnxModel
from engines.onnx_export import OPSET

if TYPE_CHECKING:
    from engines.models.sd.weights import SdWeights


def _example(component: str, weights: SdWeights) -> tuple[Any, ...]:
    import torch

    dims = weights.dims()
    side = 8  # the smallest latent side SD's three UNet downsamplings accept
    if component == "text_encoder":
        return (torch.zeros((2, dims.max_tokens), dtype=torch.int64),)
    latent = torch.randn(2, dims.latent_channels, side, side)
    if component == "unet":
        return (latent, torch.tensor([999.0, 1.0]), torch.randn(2, dims.max_tokens,
                                                                dims.text_hidden))
    return (latent,)


@dataclass(frozen=True)
class OnnxFromNet:
    weights: SdWeights
    component: str

    def __call__(self) -> OnnxModel:
        import torch

        from engines.models.sd.specs import io_specs

        inputs, outputs = io_specs(self.component, self.weights.dims())
        dynamic: dict[str, dict[int, str]] = {
            t.name: {i: f"{t.name}_{i}" for i, s in enumerate(t.shape) if s == -1}
            for t in (*inputs, *outputs)}
        net = self.weights.load(self.component, "cpu").float()
        try:
            with (tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(),
                  torch.no_grad()):
                out = Path(tmp) / "model.onnx"
                # Tracing warns about every Python-level shape check in the nets; expected.
                warnings.simplefilter("ignore")
                torch.onnx.export(net, _example(self.component, self.weights), out,
                                  input_names=[t.name for t in inputs],
                                  output_names=[t.name for t in outputs],
                                  dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
                data = out.read_bytes()
        except (RuntimeError, ValueError) as exc:
            raise EngineError(f"ONNX export of {self.weights.name}.{self.component} failed: "
                              f"{exc}") from exc
        return OnnxModel(data=data, sha256=hashlib.sha256(data).hexdigest(),
                         source=f"{self.weights.name}/{self.component} (exported)")
