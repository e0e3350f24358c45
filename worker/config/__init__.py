"""One frozen, validated configuration object per process.

Sources, highest priority first: explicit overrides (CLI flags), environment variables
(``KTW_`` prefix, ``__`` between levels, e.g. ``KTW_BATCH__MAX_BATCH_SIZE=32``), a TOML file
(``--config`` or ``KTW_CONFIG_FILE``), then defaults. ``KAFKA_BOOTSTRAP_SERVERS`` is honoured
when no other source names the brokers. Secrets are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from worker.config.batch import BatchSettings, LimitsSettings
from worker.config.engines import EngineSettings
from worker.config.generation import GenerationSettings
from worker.config.kafka import ConfigWarning, KafkaSettings, TopicsSettings, is_secret_key
from worker.config.model import ModelSettings, ProfileSettings, Thresholds
from worker.config.moderation import ModerationSettings
from worker.config.observe import MetricsSettings, TracingSettings
from worker.config.processing import CommitSettings, GcSettings, LogSettings, ProcessingSettings
from worker.exceptions import ConfigError

__all__ = [
    "BatchSettings", "CommitSettings", "ConfigWarning", "EngineSettings",
    "GcSettings",
    "GenerationSettings", "KafkaSettings", "LimitsSettings", "LogSettings", "MetricsSettings",
    "ModelSettings",
    "ModerationSettings", "ProcessingSettings", "ProfileSettings", "Thresholds",
    "TopicsSettings", "TracingSettings", "WorkerConfig", "is_secret_key", "load_config",
]

_CONFIG_FILE: ContextVar[Path | None] = ContextVar("ktw_config_file", default=None)


class WorkerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix="KTW_", env_nested_delimiter="__",
        # The input of an error is the whole config as given, secrets in the clear.
        hide_input_in_errors=True,
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
    gc: GcSettings = Field(default_factory=GcSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)

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
