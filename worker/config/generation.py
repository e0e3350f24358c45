"""The ``[generation]`` config section (text-to-image jobs).

Weights: ``weights_dir`` names a local diffusers-format SD 1.5 folder. Without one the task
refuses to start unless ``random_weights`` names an architecture explicitly (``sd15`` or
``tiny``): random weights make noise, useful for tests, demos and benchmarks only, and every
result says so (``random_weights: true``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from worker.config.base import Section
from worker.config.names import BackendName


class SizeSettings(Section):
    width: int = Field(ge=64, le=2048, multiple_of=8)
    height: int = Field(ge=64, le=2048, multiple_of=8)


def _default_blob_dir() -> Path:
    base = os.environ.get("KTW_CACHE_DIR") or Path.home() / ".cache" / "kafka-trt-worker"
    return Path(base) / "blobs"


class BlobSettings(Section):
    """Where images go when a result would exceed ``results_max_bytes``."""

    kind: Literal["local", "s3"] = "local"
    local_dir: Path = Field(default_factory=_default_blob_dir)
    s3_bucket: str | None = None
    s3_prefix: str = "generation/"
    s3_endpoint_url: str | None = None  # any S3-compatible store (MinIO, Ceph, R2, ...)
    s3_region: str | None = None

    @model_validator(mode="after")
    def _bucket(self) -> BlobSettings:
        if self.kind == "s3" and not self.s3_bucket:
            raise ValueError("blob.kind 's3' needs blob.s3_bucket")
        return self


class GenerationTopics(Section):
    jobs: str = Field("generation.jobs", min_length=1)
    results: str = Field("generation.results", min_length=1)
    dlq: str = Field("generation.dlq", min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> GenerationTopics:
        if len({self.jobs, self.results, self.dlq}) != 3:
            raise ValueError("generation jobs, results and dlq topics must be three different "
                             "topics")
        return self


class GenerationModeration(Section):
    """What checks a job's prompt and its images (``generation.moderation``).

    Policies are moderation's (``model.policies`` and ``moderation.policies``, by name): the
    same thresholds and rules as moderation jobs, never a copy. Each model of a policy says
    what it can score of a generation job (its prompt, its pixels); see
    :mod:`worker.tasks.generation.safety`.
    """

    # The policy every generated image is scored by before it is published, or "off".
    policy: str = Field("off", min_length=1, max_length=64)
    # The policy prompts are scored by; None: ``policy``. "off": no prompt check.
    prompt_policy: str | None = Field(None, min_length=1, max_length=64)
    # Where a blocked image's PNG goes (a human look, an appeal); None: nowhere, it is dropped
    # and the result holds only its seed, scores and rule.
    quarantine: BlobSettings | None = None


def _sizes() -> list[SizeSettings]:
    return [SizeSettings(width=512, height=512), SizeSettings(width=768, height=768)]


class GenerationSettings(Section):
    weights_dir: Path | None = None
    random_weights: Literal["sd15", "tiny"] | None = None
    random_seed: int = Field(0, ge=0)
    # A backend of engines.backends.registry. aoti: AOTInductor packages per batch size (built
    # once, minutes each with max-autotune); serving them loads no network code at all, only
    # the packages.
    backend: BackendName = "torch"
    precision: Literal["fp32", "fp16"] | None = None  # None: fp16 on CUDA, else fp32
    # torch and aoti backends. "auto": cuda:0 when a CUDA device is visible, else the CPU;
    # resolved (and logged) when the task is built (worker/tasks/generation/device.py).
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    sizes: list[SizeSettings] = Field(default_factory=_sizes)
    text_batch_sizes: list[int] = Field(default_factory=lambda: [2, 4, 8, 16])
    unet_batch_sizes: list[int] = Field(default_factory=lambda: [2, 4, 8, 16])
    vae_batch_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    min_steps: int = Field(1, ge=1, le=150)
    max_steps: int = Field(50, ge=1, le=150)
    max_images_per_job: int = Field(8, ge=1, le=64)
    # A batch's image budget: the batcher weighs each job by its images and takes jobs while
    # they fit (at most batch.max_batch_size of them), so one-image jobs share a batch that
    # worst-case jobs fill two at a time. 16 images = two UNet calls of 8 guidance pairs, ~2 s
    # of SD 1.5 at 20 steps on an H200: batches stay well inside processing.max_batch_ms.
    max_images_per_batch: int = Field(16, ge=1, le=1024)
    cuda_graphs: bool = True
    # At start-up: "all_shapes" captures every static shape's CUDA graph before the first poll
    # (slow start, no stall later); "first_use" captures each shape when a batch first needs it
    # (fast start; the first batch of each shape pays its capture, about a second). "auto":
    # all_shapes on a GPU, first_use on the CPU, where running every shape takes minutes.
    warm_up: Literal["auto", "all_shapes", "first_use"] = "auto"
    compile: bool = False  # torch.compile the UNet (minutes per shape; cached beside the engine)
    # Beside another task on the GPU (processing.task = "moderation,generation"): above 0, a
    # batch's VAE decode runs after its last denoising step one launch of at most
    # vae_yield_images images at a time, each launch after the other task's batches in
    # flight ended, waiting at most this long for them. 0: every launch is enqueued at once,
    # as alone. The VAE decode of 16 512x512 images moves far more memory than a UNet step,
    # and a partition of SMs does not divide memory bandwidth: on an H200 at full load the
    # slowest moderation jobs came at the end of each generation batch, and pacing its VAE
    # took moderation's p99 from 182-237 ms to 55-171 ms (22 ms with batch.max_delay_ms at
    # its default) at the same images/s (docs/two-tasks.md).
    vae_yield_ms: float = Field(5.0, ge=0, le=1_000)
    vae_yield_images: int = Field(2, ge=1, le=64)
    png_compress_level: int = Field(6, ge=0, le=9)
    png_threads: int = Field(4, ge=1, le=64)
    # Kafka's default message.max.bytes is 1048588; keep headroom for headers and framing.
    results_max_bytes: int = Field(1_000_000, ge=4096)
    blob: BlobSettings = Field(default_factory=BlobSettings)
    moderation: GenerationModeration = Field(default_factory=GenerationModeration)
    # Score the prompt (and negative prompt) before generating: "auto" when the prompt policy
    # runs a model that scores text alone; "on" refuses to start without one.
    prompt_check: Literal["auto", "on", "off"] = "auto"
    topics: GenerationTopics = Field(default_factory=GenerationTopics)

    @model_validator(mode="after")
    def _consistent(self) -> GenerationSettings:
        from engines.backends.registry import backend as registered

        b = registered(self.backend)
        if b.from_onnx and b.needs_artifact:
            # SD runs its torch network (torch, aoti) or its exported ONNX as it is
            # (onnxruntime, small models: the fp32 UNet exceeds ONNX's 2 GiB); nothing compiles
            # that ONNX into another artifact.
            raise ValueError(f"generation.backend {self.backend}: the SD engines have no build "
                             "for a backend that compiles their ONNX")
        if self.weights_dir is not None and self.random_weights is not None:
            raise ValueError("set either generation.weights_dir or generation.random_weights")
        if self.max_images_per_job > self.max_images_per_batch:
            raise ValueError("generation.max_images_per_job must not exceed "
                             "max_images_per_batch")
        if self.min_steps > self.max_steps:
            raise ValueError("generation.min_steps must not exceed max_steps")
        names = [(s.width, s.height) for s in self.sizes]
        if not names or len(set(names)) != len(names):
            raise ValueError("generation.sizes must be non-empty and unique")
        for key in ("text_batch_sizes", "unet_batch_sizes", "vae_batch_sizes"):
            sizes = getattr(self, key)
            if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError(f"generation.{key} must increase strictly from >= 1")
        if any(b % 2 for b in self.unet_batch_sizes):
            raise ValueError("generation.unet_batch_sizes must be even (guidance pairs)")
        # device "auto" may resolve to CUDA; fp16 on a CPU it resolves to is refused then.
        maybe_cuda = self.on_cuda or (self.device == "auto"
                                      and not registered(self.backend).from_onnx)
        if self.effective_precision == "fp16" and not maybe_cuda:
            raise ValueError("fp16 needs the torch or aoti backend on a CUDA device")
        return self

    @property
    def on_cuda(self) -> bool:
        """The engines run the torch network on a CUDA device (not the ONNX on the CPU)."""
        from engines.backends.registry import backend as registered

        return not registered(self.backend).from_onnx and self.device.startswith("cuda")

    @property
    def effective_precision(self) -> str:
        return self.precision or ("fp16" if self.on_cuda else "fp32")
