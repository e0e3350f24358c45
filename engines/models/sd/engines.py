"""The three SD engines together: runners, profiles, tokenizer, identities.

``make_sd_engines`` is the one place that turns (weights, resolutions, backend) into runners, so
a worker, a test and the benchmark all get the same engines and the same cache entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engines.assembly import EngineParams, EnginePlan
from engines.backends.base import Runner
from engines.cache import BuildRecipe, EngineCache
from engines.models.sd import COMPONENTS
from engines.models.sd.arch import SdDims
from engines.models.sd.build import sd_plan
from engines.models.sd.specs import (
    TEXT_SIZES,
    UNET_SIZES,
    VAE_SIZES,
    Resolution,
    SdProfiles,
    sd_profiles,
)
from engines.models.sd.tokenizer import Tokenizer
from engines.models.sd.weights import SdWeights


@dataclass(frozen=True)
class SdEngineOptions:
    backend: str = "torch"  # "torch" | "aoti" | "onnxruntime"
    precision: str = "fp16"
    device: str = "cuda:0"  # torch only; "cpu" runs the torch reference in fp32
    cuda_graphs: bool = True
    compile: bool = False
    autotune: bool = True  # aoti: max-autotune
    slots: int = 2
    intra_op_threads: int | None = None
    text_sizes: tuple[int, ...] = TEXT_SIZES
    unet_sizes: tuple[int, ...] = UNET_SIZES
    vae_sizes: tuple[int, ...] = VAE_SIZES

    def params(self, component: str, cache: EngineCache | None) -> EngineParams:
        """One component's engine parameters (torch.compile: the UNet only)."""
        return EngineParams(
            backend=self.backend, precision=self.precision, device=self.device,
            cache_dir=cache.root if cache is not None else None, use_cache=cache is not None,
            slots=self.slots, intra_op_threads=self.intra_op_threads,
            cuda_graphs=self.cuda_graphs, compile=self.compile and component == "unet",
            autotune=self.autotune)


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

    def leave_sms_free(self, sms: int) -> list[str]:
        """Before activation: every runner's kernels off ``sms`` of the device's SMs (for
        another task's kernels); the components whose backend cannot."""
        return [c for c, r in self.runners.items() if not r.leave_sms_free(sms)]


def sd_plans(weights: SdWeights, resolutions: tuple[Resolution, ...],
             options: SdEngineOptions, cache: EngineCache | None = None
             ) -> tuple[SdProfiles, dict[str, EnginePlan]]:
    """The profiles and each component's engine plan (what ``trt-worker engines build`` builds
    ahead of a worker's start, and what the worker's runners load)."""
    o = options
    profiles = sd_profiles(weights.dims(), resolutions, text_sizes=o.text_sizes,
                           unet_sizes=o.unet_sizes, vae_sizes=o.vae_sizes)
    return profiles, {c: sd_plan(weights, c, o.params(c, cache), profiles.of(c))
                      for c in COMPONENTS}


def make_sd_engines(weights: SdWeights, resolutions: tuple[Resolution, ...],
                    options: SdEngineOptions, cache: EngineCache | None = None,
                    on_build: Callable[[BuildRecipe], None] | None = None) -> SdEngines:
    """Runners for text encoder, UNet and VAE decoder (not yet active: nothing loads here)."""
    profiles, plans = sd_plans(weights, resolutions, options, cache)
    engines = SdEngines(weights, weights.dims(), profiles, weights.tokenizer())
    for c, plan in plans.items():
        engines.runners[c] = plan.runner(on_build)
    return engines
