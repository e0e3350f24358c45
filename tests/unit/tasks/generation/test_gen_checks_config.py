"""Where generation's checks run (:func:`worker.tasks.generation.safety.checks_config`): on the
generation device when it is CUDA and ``model.backend`` is left unset; config only, no models
built, so no GPU or torch needed."""

from __future__ import annotations

from engines.backends.registry import BACKENDS
from worker.config import load_config
from worker.tasks.generation.safety import checks_config

DEVICE_BACKEND = next(b.name for b in BACKENDS.values() if b.pipelined and not b.needs_artifact)


def test_a_cpu_generation_keeps_the_workers_model_settings() -> None:
    cfg = load_config()
    assert checks_config(cfg, "cpu") is cfg


def test_a_cuda_generation_checks_on_its_device_when_the_backend_is_unset() -> None:
    cfg = load_config(model={"intra_op_threads": 2})
    got = checks_config(cfg, "cuda:1").model
    assert cfg.model.backend == "onnxruntime"  # the worker's own default is untouched
    assert (got.backend, got.preprocess, got.jpeg_roundtrip, got.device) == (
        DEVICE_BACKEND, "gpu", False, 1)
    assert got.intra_op_threads == 2 and got.policies == cfg.model.policies
    assert checks_config(cfg, "cuda").model.device == 0


def test_a_backend_the_deployment_names_is_kept() -> None:
    cfg = load_config(model={"backend": "onnxruntime"})
    assert checks_config(cfg, "cuda:0") is cfg


def test_a_setting_the_device_backend_refuses_keeps_the_cpu() -> None:
    cfg = load_config(model={"precision": "int8"})  # onnxruntime's int8: no device backend runs it
    assert checks_config(cfg, "cuda:0") is cfg
