"""One frozen, validated configuration object per process.

Sources, highest priority first: explicit overrides (CLI flags), environment variables
(``KTW_`` prefix, ``__`` between levels, e.g. ``KTW_BATCH__MAX_BATCH_SIZE=32``), a TOML file
(``--config`` or ``KTW_CONFIG_FILE``), then defaults. ``KAFKA_BOOTSTRAP_SERVERS`` is honoured
when no other source names the brokers. Secrets are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import os
import socket
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from worker.config.generation import GenerationSettings
from worker.config.moderation import ModerationSettings
from worker.exceptions import ConfigError

_CONFIG_FILE: ContextVar[Path | None] = ContextVar("ktw_config_file", default=None)


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _default_client_id() -> str:
    return f"trt-worker-{socket.gethostname()}-{os.getpid()}"


class KafkaSettings(_Part):
    bootstrap_servers: str = ""
    group_id: str = "trt-worker"
    client_id: str = Field(default_factory=_default_client_id)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    session_timeout_ms: int = Field(45_000, ge=1_000)
    # Longest a fetch waits for data. librdkafka's default (500 ms) shows up directly in
    # produce-to-result latency when a broker holds fetches; frames want it short.
    fetch_wait_max_ms: int = Field(20, ge=1, le=10_000)
    max_poll_interval_ms: int = Field(300_000, ge=10_000)
    # Identity of this worker instance, stable across its restarts and unique among live
    # workers of the group (a StatefulSet pod name; the host name by default). Exactly-once
    # derives the producer's transactional.id from it; static_membership also uses it as
    # group.instance.id (KIP-345: a restarted instance takes its partitions back at once).
    instance_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    static_membership: bool = False
    # transactional.id = "<prefix>.<group_id>.<instance_id>" (exactly-once only).
    transactional_id_prefix: str = Field("ktw", min_length=1, max_length=100)
    # Broker-side limit for an open transaction (the broker's transaction.max.timeout.ms,
    # 15 min by default, caps it). Checked against the commit interval and max batch time.
    transaction_timeout_ms: int = Field(60_000, ge=1_000, le=900_000)
    # librdkafka settings passed through unchanged (both clients / consumer / producer only).
    extra: dict[str, str] = Field(default_factory=dict)
    consumer_extra: dict[str, str] = Field(default_factory=dict)
    producer_extra: dict[str, str] = Field(default_factory=dict)


class TopicsSettings(_Part):
    jobs: str = Field("moderation.jobs", min_length=1)
    results: str = Field("moderation.results", min_length=1)
    dlq: str = Field("moderation.dlq", min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> TopicsSettings:
        if len({self.jobs, self.results, self.dlq}) != 3:
            raise ValueError("jobs, results and dlq topics must be three different topics")
        return self


class BatchSettings(_Part):
    max_batch_size: int = Field(16, ge=1, le=4096)
    max_delay_ms: float = Field(20.0, ge=0)
    # A due batch is padded up to the next static size unless that wastes more than this.
    max_pad_fraction: float = Field(0.5, ge=0, le=1)
    max_in_flight_batches: int = Field(2, ge=1, le=64)
    # Backpressure: pause the assignment when this many jobs are held, resume below low.
    high_watermark: int = Field(512, ge=1)
    low_watermark: int = Field(128, ge=0)
    poll_timeout_ms: float = Field(50.0, gt=0)
    # librdkafka prefetches this much per consumer (its default is 64 MiB); part of the memory
    # bound together with the watermarks.
    fetch_queue_kbytes: int = Field(16_384, ge=1024)

    @model_validator(mode="after")
    def _watermarks(self) -> BatchSettings:
        if self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        if self.high_watermark < self.max_batch_size:
            raise ValueError("high_watermark must be at least max_batch_size")
        return self


class LimitsSettings(_Part):
    max_message_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    max_image_pixels: int = Field(40_000_000, ge=64)
    max_image_side: int = Field(16_384, ge=8)
    max_text_chars: int = Field(20_000, ge=0, le=100_000)


class Thresholds(_Part):
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


class ProfileSettings(_Part):
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


# Per backend: the precision and profiles used when the config names none. CPU: one range
# (no padding: every padded row costs real CPU time). GPU: static buckets (one CUDA graph or
# TensorRT profile each).
BACKEND_DEFAULTS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "onnxruntime": ("fp32", [{"name": "cpu", "kind": "range", "min_batch": 1, "opt_batch": 8,
                              "max_batch": 64}]),
    "torch": ("fp16", [{"name": "gpu", "kind": "static", "batch_sizes": [1, 8, 32, 128]}]),
    "tensorrt": ("fp16", [{"name": "gpu", "kind": "static", "batch_sizes": [1, 8, 32, 128]}]),
}
BACKEND_PRECISIONS = {"onnxruntime": {"fp32"}, "torch": {"fp32", "fp16"},
                      "tensorrt": {"fp32", "fp16", "int8", "fp8"}}


class ModelSettings(_Part):
    backend: Literal["onnxruntime", "torch", "tensorrt"] = "onnxruntime"
    precision: Literal["fp32", "fp16", "int8", "fp8"] | None = None
    profiles: list[ProfileSettings] | None = None
    device: int = Field(0, ge=0)
    open_nsfw_onnx: Path | None = None
    intra_op_threads: int | None = Field(None, ge=1)
    decode_threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    jpeg_roundtrip: bool = True
    # Where images are decoded and resized: "cpu" (Pillow on a thread pool) or "gpu" (nvJPEG
    # and torch kernels; torch backend only).
    preprocess: Literal["cpu", "gpu"] = "cpu"
    # GPU backends: overlap H2D / compute / D2H on three streams (false: one stream, serial).
    pipeline_overlap: bool = True
    policies: dict[str, Thresholds] = Field(default_factory=_default_policies)

    @model_validator(mode="after")
    def _precision_supported(self) -> ModelSettings:
        precision = self.effective_precision
        if precision not in BACKEND_PRECISIONS[self.backend]:
            raise ValueError(f"backend {self.backend} does not support precision {precision} "
                             f"(supported: {sorted(BACKEND_PRECISIONS[self.backend])})")
        names = [p.name for p in self.effective_profiles]
        if len(set(names)) != len(names):
            raise ValueError("profile names must be unique")
        return self

    @model_validator(mode="after")
    def _preprocess_supported(self) -> ModelSettings:
        if self.preprocess == "gpu" and self.backend != "torch":
            raise ValueError("preprocess = gpu needs backend = torch")
        if self.preprocess == "gpu" and self.jpeg_roundtrip:
            raise ValueError("preprocess = gpu cannot re-encode JPEG like the reference does; "
                             "set jpeg_roundtrip = false with it")
        return self

    @property
    def effective_precision(self) -> str:
        return self.precision or BACKEND_DEFAULTS[self.backend][0]

    @property
    def effective_profiles(self) -> list[ProfileSettings]:
        if self.profiles:
            return self.profiles
        return [ProfileSettings(**p) for p in BACKEND_DEFAULTS[self.backend][1]]

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


def _default_engine_cache() -> Path:
    base = os.environ.get("KTW_CACHE_DIR") or Path.home() / ".cache" / "kafka-trt-worker"
    return Path(base) / "engines"


class EngineSettings(_Part):
    cache_dir: Path = Field(default_factory=_default_engine_cache)
    # Use the engine cache (build once, load after). Off: build in memory at every start.
    use_cache: bool = True
    calibration_dir: Path | None = None  # real sample images for INT8 calibration
    timing_cache: Path | None = None  # TensorRT timing cache (default: inside cache_dir)
    workspace_mb: int = Field(4096, ge=64)
    in_flight_slots: int = Field(2, ge=1, le=16)  # per batch size, GPU runners


class CommitSettings(_Part):
    interval_ms: float = Field(1_000.0, ge=0)
    drain_timeout_s: float = Field(30.0, gt=0)
    # After SIGTERM, a worker still running this long prints every thread's stack and exits
    # non-zero (uncommitted work is redone by the next owner): a hang in shutdown, e.g. a
    # consumer close that never returns, ends with a diagnosis instead of an orchestrator's
    # SIGKILL. Keep it below the orchestrator's grace period.
    shutdown_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _shutdown_covers_drain(self) -> CommitSettings:
        if self.shutdown_timeout_s <= self.drain_timeout_s:
            raise ValueError("shutdown_timeout_s must exceed drain_timeout_s")
        return self


class ProcessingSettings(_Part):
    """Delivery guarantee. ``at-least-once``: results and offsets are separate writes, so a
    crash can repeat results. ``exactly-once``: results, DLQ records and the consumed offsets
    are written in one Kafka transaction per commit interval; read them with
    ``isolation.level=read_committed``."""

    guarantee: Literal["at-least-once", "exactly-once"] = "at-least-once"
    # What this process serves (worker.tasks.registry): moderation jobs from ``topics`` or
    # text-to-image jobs from ``generation.topics``. Give each task its own kafka.group_id.
    task: Literal["moderation", "generation"] = "moderation"
    # The longest one batch (decode + inference + results) may take. A transaction stays open
    # for about one commit interval plus one batch, so exactly-once requires
    # kafka.transaction_timeout_ms >= 2 * (commit.interval_ms + max_batch_ms); slower batches
    # are logged as errors.
    max_batch_ms: float = Field(10_000.0, gt=0)


class LogSettings(_Part):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"


class WorkerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix="KTW_", env_nested_delimiter="__",
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    engines: EngineSettings = Field(default_factory=EngineSettings)
    # Image-and-text policies, the text (MiniLM) and CLIP engines (worker/moderation_settings).
    moderation: ModerationSettings = Field(default_factory=ModerationSettings)
    commit: CommitSettings = Field(default_factory=CommitSettings)
    processing: ProcessingSettings = Field(default_factory=ProcessingSettings)
    # Text-to-image jobs: SD engines, sizes, steps, blobs (worker/config/generation.py).
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    log: LogSettings = Field(default_factory=LogSettings)

    @model_validator(mode="after")
    def _transaction_budget(self) -> WorkerConfig:
        if self.processing.guarantee == "exactly-once":
            need = 2 * (self.commit.interval_ms + self.processing.max_batch_ms)
            if self.kafka.transaction_timeout_ms < need:
                raise ValueError(
                    f"kafka.transaction_timeout_ms {self.kafka.transaction_timeout_ms} must be "
                    f"at least 2 * (commit.interval_ms + processing.max_batch_ms) = {need:.0f} "
                    "in exactly-once mode"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _CONFIG_FILE.get()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path, deep_merge=True))
        return tuple(sources)


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        env = "KTW_" + "__".join(str(p).upper() for p in e["loc"]) if loc else ""
        where = f"{loc} (env {env})" if env else "config"
        lines.append(f"  {where}: {e['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_config(path: Path | str | None = None, **overrides: Any) -> WorkerConfig:
    """Build the process's config; raise :class:`ConfigError` listing every bad value."""
    path = path or os.environ.get("KTW_CONFIG_FILE") or None
    file = Path(path) if path else None
    if file is not None and not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    token = _CONFIG_FILE.set(file)
    try:
        cfg = WorkerConfig(**overrides)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from exc
    except ValueError as exc:  # malformed TOML or env JSON
        raise ConfigError(f"invalid configuration: {exc}") from exc
    finally:
        _CONFIG_FILE.reset(token)
    fallback = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if not cfg.kafka.bootstrap_servers and fallback:
        cfg = cfg.model_copy(
            update={"kafka": cfg.kafka.model_copy(update={"bootstrap_servers": fallback})}
        )
    return cfg
