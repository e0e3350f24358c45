"""The SD engines' plans: what each artifact is keyed on, for the engine cache.

The recipe's ``onnx_sha256`` slot carries the weights' identity: every artifact here is derived
from the weights (the ORT artifact from an ONNX export of them, the torch artifact is them in the
engine precision), and exporting a 3.4 GB UNet just to compute a key would defeat the cache.
Profiles are not part of these keys: both artifacts serve every shape (ONNX axes are dynamic;
CUDA graphs are captured at load time), so adding a resolution reuses the cached artifact.
"""

from __future__ import annotations

from collections.abc import Callable

from engines.assembly import EngineParams, EnginePlan
from engines.cache import BuildRecipe, EngineCache, EngineFromCache
from engines.models.sd.specs import sd_spec
from engines.models.sd.weights import SdWeights
from engines.onnx_export import OPSET
from engines.profiles import Profile


def sd_plan(weights: SdWeights, component: str, params: EngineParams,
            profiles: tuple[Profile, ...] = ()) -> EnginePlan:
    return EnginePlan(sd_spec(weights, component, params.precision), profiles, params,
                      identity=lambda: weights.identity(component),
                      flags={"weights": "random" if weights.random else "local"},
                      onnx_flags={"opset": OPSET}, key_profiles=False)


def sd_cache_loader(cache: EngineCache, weights: SdWeights, component: str, backend: str,
                    device: str, precision: str,
                    on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
    """One component's cached artifact (built when missing) for ``backend`` on ``device``."""
    params = EngineParams(backend=backend, precision=precision, device=device,
                          cache_dir=cache.root)
    return sd_plan(weights, component, params).loader(on_build)
