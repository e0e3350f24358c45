"""From the config to a ready GenerationTask: weights, engines (cached), blob store, and the
moderation of prompts and images (:mod:`worker.tasks.generation.safety`).

Refuses to start without weights: a local SD folder (``generation.weights_dir``) or an explicit
``generation.random_weights`` architecture; random weights are announced in the log at start
and in every result.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from engines.assembly import EnginePlan
from engines.cache import BuildRecipe, EngineCache
from engines.models.sd.arch import ARCHES
from engines.models.sd.engines import SdEngineOptions, SdEngines, make_sd_engines, sd_plans
from engines.models.sd.specs import Resolution
from engines.models.sd.weights import LocalSdWeights, RandomSdWeights, SdWeights
from worker.config import WorkerConfig
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError
from worker.tasks.generation.blobs import make_blob_store
from worker.tasks.generation.device import placed
from worker.tasks.generation.safety import make_safety, resolve
from worker.tasks.generation.task import GenerationTask

log = structlog.get_logger("worker.tasks.generation")
# The `gen` extra's top-level modules (pyproject.toml).
GEN_EXTRA = frozenset({"torch", "onnx", "tokenizers", "safetensors"})


def weights_from(g: GenerationSettings) -> SdWeights:
    if g.weights_dir is not None:
        return LocalSdWeights(g.weights_dir)
    if g.random_weights is not None:
        log.warning("generation_random_weights", arch=g.random_weights, seed=g.random_seed,
                    note="RANDOM weights: images are noise; for tests, demos and benchmarks")
        return RandomSdWeights(ARCHES[g.random_weights], g.random_seed)
    raise ConfigError(
        "generation needs weights: set generation.weights_dir to a local Stable Diffusion 1.5 "
        "folder (diffusers layout: text_encoder/, tokenizer/, unet/, vae/; nothing is "
        "downloaded), or generation.random_weights = 'sd15' | 'tiny' for tests and benchmarks")


def engine_options(g: GenerationSettings, intra_op_threads: int | None = None,
                   autotune: bool = True) -> SdEngineOptions:
    return SdEngineOptions(
        backend=g.backend, precision=g.effective_precision, device=g.device,
        cuda_graphs=g.cuda_graphs, autotune=autotune,
        compile=g.compile, intra_op_threads=intra_op_threads,
        text_sizes=tuple(g.text_batch_sizes), unet_sizes=tuple(g.unet_batch_sizes),
        vae_sizes=tuple(g.vae_batch_sizes))


def make_engines(cfg: WorkerConfig, on_build: Callable[[BuildRecipe], None] | None = None,
                 settings: GenerationSettings | None = None) -> SdEngines:
    """The engines for ``settings`` (default: ``cfg.generation`` with its device resolved)."""
    g = settings or placed(cfg.generation)
    try:
        return make_sd_engines(weights_from(g), _resolutions(g), _options(cfg, g), _cache(cfg),
                               on_build)
    except ValueError as exc:  # a configured size the architecture cannot produce
        raise ConfigError(f"generation: {exc}") from exc
    except ModuleNotFoundError as exc:
        if exc.name not in GEN_EXTRA:  # not a missing install: a bug, with its traceback
            raise
        raise ConfigError(f"generation needs the gen extra ({exc.name} does not import): "
                          "pip install 'kafka-trt-worker[gen]'") from exc


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The text encoder's, UNet's and VAE decoder's plans as the worker would load them (for
    ``trt-worker engines build``: built ahead, a worker's start finds them cached)."""
    g = placed(cfg.generation)
    try:
        return sd_plans(weights_from(g), _resolutions(g), _options(cfg, g), _cache(cfg))[1]
    except ValueError as exc:
        raise ConfigError(f"generation: {exc}") from exc


def _resolutions(g: GenerationSettings) -> tuple[Resolution, ...]:
    return tuple(Resolution(s.width, s.height) for s in g.sizes)


def _options(cfg: WorkerConfig, g: GenerationSettings) -> SdEngineOptions:
    return engine_options(g, cfg.model.intra_op_threads, cfg.engines.autotune)


def _cache(cfg: WorkerConfig) -> EngineCache | None:
    return EngineCache(cfg.engines.cache_dir) if cfg.engines.use_cache else None


def jobs_per_batch(cfg: WorkerConfig) -> int:
    """Jobs per batch: ``batch.max_batch_size``, never more than the image budget
    (``generation.max_images_per_batch``) holds one-image jobs; the batcher weighs each job
    by its images within that budget (``GenerationPending.images``)."""
    return min(cfg.batch.max_batch_size, cfg.generation.max_images_per_batch)  # both >= 1


def make_generation_task(cfg: WorkerConfig,
                         on_build: Callable[[BuildRecipe], None] | None = None
                         ) -> GenerationTask:
    g = placed(cfg.generation)  # first: a device the machine lacks fails before any load
    resolve(cfg)  # a moderation setting that cannot work fails before any load too
    engines = make_engines(cfg, on_build, g)
    quarantine = g.moderation.quarantine
    safety = make_safety(cfg, g.device)
    return GenerationTask(g, engines, make_blob_store(cfg.generation.blob),
                          max_in_flight_batches=cfg.batch.max_in_flight_batches,
                          max_jobs_per_batch=jobs_per_batch(cfg), safety=safety,
                          quarantine=None if quarantine is None else make_blob_store(quarantine))
