"""Cache recipes, builders and lazy loaders for the SD engines (fits engines.cache).

The recipe's ``onnx_sha256`` slot carries the weights' identity: every artifact here is derived
from the weights (the ORT artifact from an ONNX export of them, the torch artifact is them in the
engine precision), and exporting a 3.4 GB UNet just to compute a key would defeat the cache.
Profiles are not part of these keys: both artifacts serve every shape (ONNX axes are dynamic;
CUDA graphs are captured at load time), so adding a resolution reuses the cached artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engines.cache import BuildRecipe, EngineCache, EngineFromCache
from engines.device import DeviceFingerprint, cpu_fingerprint, cuda_fingerprint
from engines.models.sd.export import OPSET
from engines.models.sd.runner import DTYPES, NetLoader
from engines.models.sd.specs import sd_spec
from engines.models.sd.weights import SdWeights

ARTIFACTS = {"onnxruntime": "model.ort.onnx", "torch": "weights.pt"}


def backend_version(backend: str) -> str:
    if backend == "onnxruntime":
        from engines.backends.onnxruntime import ort_version

        return ort_version()
    import torch

    return str(torch.__version__)


def fingerprint(device: str) -> DeviceFingerprint:
    if device.startswith("cuda"):
        return cuda_fingerprint(int(device.partition(":")[2] or 0))
    return cpu_fingerprint()


def sd_recipe(weights: SdWeights, component: str, backend: str, device: str,
              precision: str) -> BuildRecipe:
    flags: dict[str, Any] = {"weights": "random" if weights.random else "local"}
    if backend == "onnxruntime":
        flags["opset"] = OPSET
    return BuildRecipe(
        model_id=f"{weights.name}.{component}", onnx_sha256=weights.identity(component),
        backend=backend, backend_version=backend_version(backend), device=fingerprint(device),
        precision=precision, profiles=(), flags=flags, artifact_name=ARTIFACTS[backend])


def sd_builder(weights: SdWeights, component: str, backend: str, device: str,
               precision: str) -> Callable[[Path], None]:
    if backend == "onnxruntime":
        from engines.backends.onnxruntime import build_ort_artifact

        spec = sd_spec(weights, component, precision)
        return lambda out: build_ort_artifact(spec, out)

    def build_torch(out: Path) -> None:
        import torch

        # Random weights initialise fastest on the GPU itself; local ones load on the CPU.
        where = device if weights.random else "cpu"
        net = weights.load(component, where).to(getattr(torch, DTYPES[precision]))
        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, out)

    return build_torch


def sd_cache_loader(cache: EngineCache, weights: SdWeights, component: str, backend: str,
                    device: str, precision: str,
                    on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
    recipe = sd_recipe(weights, component, backend, device, precision)
    return EngineFromCache(cache, recipe, sd_builder(weights, component, backend, device,
                                                     precision), on_build)


def torch_net_loader(weights: SdWeights, component: str, precision: str,
                     cached: EngineFromCache | None) -> NetLoader:
    """For :class:`~engines.models.sd.runner.NetRunner`: the network from the cached artifact
    (an architecture skeleton plus the saved state dict), or straight from the weights."""

    def load(device: str) -> tuple[Any, str]:
        import torch

        from engines.models.sd.nets import skeleton

        if cached is None:
            return (weights.load(component, device),
                    f"torch-{torch.__version__}-{precision}-{weights.identity(component)[:12]}")
        entry = cached()
        # Every parameter is overwritten (strict load), so none is initialised first; the
        # state dict is memory-mapped and copied once into the parameters. Measured on the
        # H200 (bench/sd_load_profile.py): 0.5 s (one run) instead of 1.35 s (median of two)
        # for the three SD 1.5 engines.
        net = skeleton(component, weights.config(component), device, initialised=False)
        state = torch.load(entry.artifact, map_location="cpu", weights_only=True, mmap=True)
        net.load_state_dict(state, strict=True)
        return net, f"torch-{entry.key[:12]}"

    return load
