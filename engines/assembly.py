"""Engine assembly: a model's spec and profiles plus plain parameters -> cache recipe, lazy
loader and runner, through the backend registry.

Everything that starts an engine goes through :class:`EnginePlan` (a worker, ``trt-worker
engines build``, the tests and the benchmarks), so an artifact a build writes is exactly the one
a runner with the same parameters loads. The parameters are plain values
(:class:`EngineParams`); mapping a configuration file onto them is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engines.backends.base import Runner
from engines.backends.registry import Backend, backend
from engines.cache import BuildRecipe, CacheEntry, EngineCache, EngineFromCache
from engines.profiles import Profile, RangeProfile, StaticProfile
from engines.spec import EngineSpec


@dataclass(frozen=True, slots=True)
class EngineParams:
    """How one engine is built and run."""

    backend: str = "onnxruntime"  # a name in engines.backends.registry.BACKENDS
    precision: str = "fp32"  # fp32 | fp16 | int8 | fp8 (what the backend supports)
    device: str = "cuda:0"  # "cpu" | "cuda:N" (GPU backends; onnxruntime is always the CPU)
    cache_dir: Path | None = None  # None: engines.cache.default_cache_dir()
    use_cache: bool = True  # False: build nothing; run from the model (where the backend can)
    slots: int = 2  # in-flight slots per batch size (GPU runners)
    intra_op_threads: int | None = None  # onnxruntime
    cuda_graphs: bool = True  # torch
    compile: bool = False  # torch.compile (torch)
    autotune: bool = True  # max-autotune when compiling packages for CUDA (aoti)
    workspace_mb: int = 4096  # TensorRT builder workspace
    timing_cache: Path | None = None  # TensorRT timing cache (default: inside the cache dir)
    calibration_dir: Path | None = None  # INT8 calibration images (TensorRT)


@dataclass(frozen=True)
class EnginePlan:
    """One engine of one model: what to build (and from which identity) and how to run it.

    ``identity`` is the digest the cache keys the artifact on (default: the ONNX's SHA-256);
    ``flags`` add model facts to the key, ``onnx_flags`` facts that matter only to backends
    building from the ONNX (e.g. the export's opset). ``key_profiles=False`` leaves the
    profiles out of the key, for artifacts that serve every shape. ``preprocess`` turns an
    image file's bytes into one input row (INT8 calibration samples).
    """

    spec: EngineSpec
    profiles: tuple[Profile, ...]
    params: EngineParams
    identity: Callable[[], str] | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)
    onnx_flags: Mapping[str, Any] = field(default_factory=dict)
    key_profiles: bool = True
    preprocess: Callable[[bytes], np.ndarray] | None = None

    @property
    def backend(self) -> str:
        return self.params.backend

    @property
    def precision(self) -> str:
        return self.params.precision

    @property
    def registry_entry(self) -> Backend:
        return backend(self.params.backend)

    @property
    def cache(self) -> EngineCache:
        return EngineCache(self.params.cache_dir)

    def recipe(self) -> BuildRecipe:
        b = self.registry_entry
        flags = {**self.flags, **(self.onnx_flags if b.from_onnx else {}),
                 **b.key_flags(self.params)}
        identity = self.identity() if self.identity is not None else self.spec.onnx().sha256
        return BuildRecipe(
            model_id=self.spec.model_id, onnx_sha256=identity, backend=b.name,
            backend_version=b.version(), device=b.fingerprint(self.params.device),
            precision=self.params.precision,
            # Backends that compile per profile (TensorRT, AOTInductor: needs_artifact) always
            # key on them, whatever the model says about its artifact.
            profiles=(tuple(p.to_dict() for p in self.profiles)
                      if self.key_profiles or b.needs_artifact else ()),
            flags=flags, artifact_name=b.artifact_name)

    def loader(self, on_build: Callable[[BuildRecipe], None] | None = None) -> EngineFromCache:
        """The cached artifact, built (once, under a lock) when missing."""
        recipe = self.recipe()
        return EngineFromCache(self.cache, recipe,
                               lambda out: self.registry_entry.build(self, recipe, out), on_build)

    def runner(self, on_build: Callable[[BuildRecipe], None] | None = None) -> Runner:
        """The runner, not active: the artifact is looked up (or built) in ``activate``. With
        the cache off it runs from the model, except where the backend or the precision
        exists only as an artifact."""
        b = self.registry_entry
        use = self.params.use_cache or b.runs_from_artifact(self.params.precision)
        return b.runner(self, DeferredLoader(self, on_build) if use else None)


class DeferredLoader:
    """:meth:`EnginePlan.loader`, made when first needed: constructing a runner neither reads
    the model (the recipe holds its digest) nor imports the backend's library."""

    def __init__(self, plan: EnginePlan, on_build: Callable[[BuildRecipe], None] | None
                 ) -> None:
        self.plan, self.on_build = plan, on_build
        self._loader: EngineFromCache | None = None

    def resolve(self) -> EngineFromCache:
        if self._loader is None:
            self._loader = self.plan.loader(self.on_build)
        return self._loader

    def __call__(self) -> CacheEntry:
        return self.resolve()()


def bucket_profiles(prefix: str, items: list[tuple[int, ...]], batch_sizes: list[int],
                    backend_name: str) -> tuple[Profile, ...]:
    """One profile per item shape (a token-length bucket, an image size): static batch sizes
    where the backend runs static profiles best (a graph each), else a range without padding."""
    if backend(backend_name).static_profiles:
        return tuple(StaticProfile(f"{prefix}{i[0]}", i, tuple(batch_sizes)) for i in items)
    hi = batch_sizes[-1]
    return tuple(RangeProfile(f"{prefix}{i[0]}", i, i, i, 1, min(8, hi), hi) for i in items)
