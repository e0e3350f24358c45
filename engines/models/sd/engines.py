"""The three SD engines together: runners, profiles, tokenizer, identities.

``make_sd_engines`` is the one place that turns (weights, resolutions, backend) into runners, so
a worker, a test and the benchmark all get the same engines and the same cache entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engines.backends.base import Runner
from engines.cache import BuildRecipe, EngineCache
from engines.models.sd import COMPONENTS
from engines.models.sd.arch import SdDims
from engines.models.sd.build import sd_cache_loader, torch_net_loader
from engines.models.sd.specs import (
    TEXT_SIZES,
    UNET_SIZES,
    VAE_SIZES,
    Resolution,
    SdProfiles,
    sd_profiles,
    sd_spec,
)
from engines.models.sd.tokenizer import Tokenizer
from engines.models.sd.weights import SdWeights


@dataclass(frozen=True)
class SdEngineOptions:
    backend: str = "torch"  # "torch" | "onnxruntime"
    precision: str = "fp16"
    device: str = "cuda:0"  # torch only; "cpu" runs the torch reference in fp32
    cuda_graphs: bool = True
    compile: bool = False
    slots: int = 2
    intra_op_threads: int | None = None
    text_sizes: tuple[int, ...] = TEXT_SIZES
    unet_sizes: tuple[int, ...] = UNET_SIZES
    vae_sizes: tuple[int, ...] = VAE_SIZES


@dataclass
class SdEngines:
    weights: SdWeights
    dims: SdDims
    profiles: SdProfiles
    tokenizer: Tokenizer
    runners: dict[str, Runner] = field(default_factory=dict)

    @property
    def model_id(self) -> str:
        return self.weights.name

    @property
    def random_weights(self) -> bool:
        return self.weights.random

    def engine_hashes(self) -> dict[str, str]:
        # A result may be written before any engine loaded (a job expired in the queue).
        return {c: r.engine_hash or "not-loaded" for c, r in self.runners.items()}

    def activate(self) -> None:
        for r in self.runners.values():
            r.activate()

    def deactivate(self) -> None:
        for r in self.runners.values():
            r.deactivate()


def make_sd_engines(weights: SdWeights, resolutions: tuple[Resolution, ...],
                    options: SdEngineOptions, cache: EngineCache | None = None,
                    on_build: Callable[[BuildRecipe], None] | None = None) -> SdEngines:
    """Runners for text encoder, UNet and VAE decoder (not yet active: nothing loads here)."""
    o = options
    dims = weights.dims()
    profiles = sd_profiles(dims, resolutions, text_sizes=o.text_sizes, unet_sizes=o.unet_sizes,
                           vae_sizes=o.vae_sizes)
    engines = SdEngines(weights, dims, profiles, weights.tokenizer())
    device = o.device if o.backend == "torch" else "cpu"
    for c in COMPONENTS:
        spec = sd_spec(weights, c, o.precision)
        cached = (sd_cache_loader(cache, weights, c, o.backend, device, o.precision, on_build)
                  if cache is not None else None)
        if o.backend == "onnxruntime":
            from engines.backends.onnxruntime import OrtRunner

            engines.runners[c] = OrtRunner(spec, intra_op_threads=o.intra_op_threads,
                                           engine=cached)
            continue
        from engines.models.sd.runner import NetRunner

        compile_cache = (cached.cache.entry_dir(cached.recipe).parent /
                         f"inductor-{cached.recipe.key}.bin"
                         if cached is not None and o.compile else None)
        engines.runners[c] = NetRunner(
            spec, net=torch_net_loader(weights, c, o.precision, cached),
            profiles=profiles.of(c), precision=o.precision, device=device,
            cuda_graphs=o.cuda_graphs, compile=o.compile and c == "unet",
            compile_cache=compile_cache, slots=o.slots)
    return engines
