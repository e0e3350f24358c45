"""Intake against the worker's configuration, the [generation] settings, and start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from worker.config import load_config
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError, JobRejected, SchemaViolation
from worker.tasks.generation.intake import (
    IntakeRules,
    TooManyImages,
    UnsupportedSize,
    UnsupportedSteps,
)
from worker.tasks.generation.setup import weights_from
from worker.wire.generation_codec import decode_generation_job

RULES = IntakeRules(frozenset({(512, 512), (768, 768)}), 10, 50, 8)


def job(**kw: Any) -> bytes:
    return msgpack.packb({"v": 1, "id": "j", "prompt": "a red car"} | kw, use_bin_type=True)


@pytest.mark.parametrize(("fields", "error", "reason"), [
    ({"width": 640, "height": 512}, UnsupportedSize, "unsupported_size"),
    ({"width": 512, "height": 768}, UnsupportedSize, "unsupported_size"),
    ({"steps": 9}, UnsupportedSteps, "unsupported_steps"),
    ({"steps": 51}, UnsupportedSteps, "unsupported_steps"),
    ({"num_images": 9}, TooManyImages, "too_many_images"),
    ({"scheduler": "lms"}, SchemaViolation, "schema"),
    ({"prompt": ""}, SchemaViolation, "schema"),
    ({"prompt": "   "}, SchemaViolation, "schema"),
])
def test_invalid_jobs_are_rejected_with_a_reason(fields: dict[str, Any],
                                                 error: type[JobRejected], reason: str) -> None:
    with pytest.raises(JobRejected) as info:
        RULES.check(decode_generation_job(job(**fields)))
    assert type(info.value) is error and info.value.reason == reason


def test_rejection_names_the_configured_sizes() -> None:
    with pytest.raises(UnsupportedSize, match="512x512, 768x768"):
        RULES.check(decode_generation_job(job(width=1024, height=1024)))


@pytest.mark.parametrize("fields", [{}, {"width": 768, "height": 768, "steps": 50,
                                         "num_images": 8}, {"steps": 10}])
def test_jobs_inside_the_configuration_pass(fields: dict[str, Any]) -> None:
    RULES.check(decode_generation_job(job(**fields)))


def test_generation_section_defaults() -> None:
    g = load_config().generation
    assert [(s.width, s.height) for s in g.sizes] == [(512, 512), (768, 768)]
    assert g.unet_batch_sizes == [2, 4, 8, 16]
    # Where the engines run is the machine's business, resolved when the task is built
    # (tests/unit/config/test_generation_device.py).
    assert (g.device, g.warm_up, g.precision) == ("auto", "auto", None)
    assert g.topics.jobs == "generation.jobs" and g.blob.kind == "local"


def test_generation_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_GENERATION__RANDOM_WEIGHTS", "tiny")
    monkeypatch.setenv("KTW_GENERATION__MAX_STEPS", "20")
    g = load_config().generation
    assert (g.random_weights, g.max_steps) == ("tiny", 20)


@pytest.mark.parametrize(("fields", "match"), [
    ({"unet_batch_sizes": [2, 3]}, "even"),
    ({"vae_batch_sizes": [4, 2]}, "increase"),
    ({"min_steps": 30, "max_steps": 20}, "min_steps"),
    ({"sizes": [{"width": 512, "height": 512}] * 2}, "unique"),
    ({"sizes": [{"width": 500, "height": 512}]}, "multiple"),
    ({"backend": "onnxruntime", "precision": "fp16"}, "fp16"),
    ({"device": "cpu", "precision": "fp16"}, "fp16"),
    ({"weights_dir": "/sd", "random_weights": "sd15"}, "either"),
    ({"device": "gpu0"}, "pattern"),
])
def test_bad_generation_settings_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GenerationSettings(**fields)


def test_bad_generation_setting_names_its_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_GENERATION__MAX_STEPS", "0")
    with pytest.raises(ConfigError, match="KTW_GENERATION__MAX_STEPS"):
        load_config()


def test_onnxruntime_backend_defaults_to_fp32() -> None:
    assert GenerationSettings(backend="onnxruntime").effective_precision == "fp32"


def test_no_weights_is_a_config_error_naming_both_options() -> None:
    with pytest.raises(ConfigError, match=r"weights_dir.*random_weights"):
        weights_from(GenerationSettings())


def test_random_weights_must_be_asked_for_and_are_named_so() -> None:
    w = weights_from(GenerationSettings(random_weights="sd15", random_seed=3))
    assert w.random and w.name == "sd15-random-s3"


def test_a_missing_weights_folder_is_refused(tmp_path: Path) -> None:
    from engines.exceptions import ModelNotFound

    with pytest.raises(ModelNotFound, match="never downloaded"):
        weights_from(GenerationSettings(weights_dir=tmp_path / "sd15"))
