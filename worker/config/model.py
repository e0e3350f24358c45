"""The ``[model]`` section: the open_nsfw engine, its profiles, precision and policies."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from engines.cpus import available_cpus
from worker.config.base import Section
from worker.config.names import BackendName

if TYPE_CHECKING:
    from engines.backends.registry import Backend


class Thresholds(Section):
    """nsfw >= block -> block; nsfw >= review -> review; else allow (Yahoo: <0.2 safe, >0.8)."""

    review: float = Field(0.2, ge=0, le=1)
    block: float = Field(0.8, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.review > self.block:
            raise ValueError("review threshold must not exceed block threshold")
        return self


def _default_policies() -> dict[str, Thresholds]:
    return {"default": Thresholds()}


class ProfileSettings(Section):
    """An engine profile: ``static`` (batch_sizes) or ``range`` (min/opt/max batch)."""

    name: str = Field(min_length=1)
    kind: Literal["static", "range"]
    batch_sizes: list[int] | None = None
    min_batch: int | None = Field(None, ge=1)
    opt_batch: int | None = Field(None, ge=1)
    max_batch: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _complete(self) -> ProfileSettings:
        if self.kind == "static":
            if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
                raise ValueError(f"static profile {self.name!r} needs batch_sizes >= 1")
            if self.batch_sizes != sorted(set(self.batch_sizes)):
                raise ValueError(f"profile {self.name!r}: batch_sizes must increase strictly")
        else:
            lo, opt, hi = self.min_batch, self.opt_batch, self.max_batch
            if lo is None or opt is None or hi is None or not lo <= opt <= hi:
                raise ValueError(f"range profile {self.name!r} needs min <= opt <= max batch")
        return self


def _backend(name: str) -> Backend:
    """The registry record of a backend (its name already validated by BackendName)."""
    from engines.backends.registry import backend

    return backend(name)


class ModelSettings(Section):
    # A backend of engines.backends.registry; its record says which precisions it runs (its
    # default first), its default profiles, whether it takes static profiles only (aoti: one
    # package per batch size, minutes each, once; see `trt-worker engines build`) and whether
    # it runs the model's torch network (what preprocess = gpu feeds).
    backend: BackendName = "onnxruntime"
    precision: Literal["fp32", "fp16", "int8", "fp8"] | None = None
    profiles: list[ProfileSettings] | None = None
    device: int = Field(0, ge=0)
    open_nsfw_onnx: Path | None = None
    intra_op_threads: int | None = Field(None, ge=1)
    # The CPUs this process may use: affinity capped by a container's CPU quota.
    decode_threads: int = Field(default_factory=available_cpus, ge=1)
    jpeg_roundtrip: bool = True
    # Where images are decoded and resized: "cpu" (Pillow on a thread pool) or "gpu" (nvJPEG
    # and torch kernels; torch and aoti backends only).
    preprocess: Literal["cpu", "gpu"] = "cpu"
    # preprocess = gpu: who decodes JPEGs. "torchvision": nvJPEG's batched decoder (one call
    # per batch, one lock per process); "nvimgcodec": nvImageCodec (the nvidia-nvimgcodec-cu13
    # and nvidia-nvjpeg wheels) with the hardware JPEG engines first, one decoder per thread;
    # "dali": DALI's image decoder (the nvidia-dali-cuda130 wheel with nvImageCodec), batches
    # split between the hardware engines and CUDA, one pipeline per batch in flight.
    gpu_jpeg_decoder: Literal["torchvision", "nvimgcodec", "dali"] = "torchvision"
    # GPU backends: overlap H2D / compute / D2H on three streams (false: one stream, serial).
    pipeline_overlap: bool = True
    policies: dict[str, Thresholds] = Field(default_factory=_default_policies)

    @model_validator(mode="after")
    def _precision_supported(self) -> ModelSettings:
        precision, supported = self.effective_precision, _backend(self.backend).precisions
        if precision not in supported:
            raise ValueError(f"backend {self.backend} does not support precision {precision} "
                             f"(supported: {sorted(supported)})")
        names = [p.name for p in self.effective_profiles]
        if len(set(names)) != len(names):
            raise ValueError("profile names must be unique")
        if _backend(self.backend).static_only and any(
                p.kind != "static" for p in self.effective_profiles):
            raise ValueError(f"backend {self.backend} compiles static profiles only (one "
                             "package per batch size); give its profiles batch_sizes")
        return self

    @model_validator(mode="after")
    def _preprocess_supported(self) -> ModelSettings:
        if self.preprocess == "gpu" and _backend(self.backend).from_onnx:
            from engines.backends.registry import BACKENDS

            native = [name for name, b in BACKENDS.items() if not b.from_onnx]
            raise ValueError(f"preprocess = gpu needs backend = {' or '.join(native)}")
        if self.gpu_jpeg_decoder != "torchvision" and self.preprocess != "gpu":
            raise ValueError(f"gpu_jpeg_decoder = {self.gpu_jpeg_decoder} needs "
                             "preprocess = gpu")
        if self.preprocess == "gpu" and self.jpeg_roundtrip:
            raise ValueError("preprocess = gpu cannot re-encode JPEG like the reference does; "
                             "set jpeg_roundtrip = false with it")
        return self

    @property
    def effective_precision(self) -> str:
        return self.precision or _backend(self.backend).precisions[0]

    @property
    def effective_profiles(self) -> list[ProfileSettings]:
        if self.profiles:
            return self.profiles
        return [ProfileSettings.model_validate(p) for p in _backend(self.backend).default_profiles]

    @field_validator("policies", mode="before")
    @classmethod
    def _keep_default(cls, value: Any) -> Any:
        # A job that names no policy uses 'default'; keep the built-in one unless overridden.
        if isinstance(value, dict):
            from worker.wire.moderation_codec import POLICY_NAME

            bad = [name for name in value if not POLICY_NAME.fullmatch(str(name))]
            if bad:
                raise ValueError(f"policy names {bad} can never be named by a job "
                                 f"(pattern {POLICY_NAME.pattern})")
            if "default" not in value:
                return {"default": Thresholds(), **value}
        return value
