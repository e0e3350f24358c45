"""worker.config.model: the backend is a name of engines.backends.registry, and what the config
knows of each backend (precisions, default profiles, static-only, runs the torch network) is
that backend's record, not a table of the config's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from engines.backends.registry import BACKENDS, GPU_BUCKETS
from worker.config import load_config
from worker.exceptions import ConfigError


@pytest.fixture
def registered_tpu() -> Iterator[None]:
    """A backend the config has never heard of, registered for one test."""
    BACKENDS["tpu"] = dataclasses.replace(BACKENDS["torch"], name="tpu", precisions=("bf16x",),
                                          default_profiles=GPU_BUCKETS, static_only=True,
                                          from_onnx=True)
    try:
        yield
    finally:
        del BACKENDS["tpu"]


def test_an_unknown_backend_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown backend 'tvm' \(known: onnxruntime, torch, "
                                          r"tensorrt, aoti\)"):
        load_config(model={"backend": "tvm"})


def test_every_registered_backend_is_accepted_with_its_default_precision_and_profiles() -> None:
    for name, record in BACKENDS.items():
        model = load_config(model={"backend": name}).model
        assert model.effective_precision == record.precisions[0]
        assert [p.model_dump(exclude_none=True) for p in model.effective_profiles] == [
            {**p, **({"batch_sizes": list(p["batch_sizes"])} if "batch_sizes" in p else {})}
            for p in record.default_profiles]


def test_the_defaults_stay_what_they_were() -> None:
    def defaults(backend: str) -> tuple[str, list[dict[str, object]]]:
        model = load_config(model={"backend": backend}).model
        return model.effective_precision, [p.model_dump(exclude_none=True)
                                           for p in model.effective_profiles]

    gpu = [{"name": "gpu", "kind": "static", "batch_sizes": [1, 8, 32, 128]}]
    assert defaults("onnxruntime") == ("fp32", [{"name": "cpu", "kind": "range", "min_batch": 1,
                                                 "opt_batch": 8, "max_batch": 64}])
    assert defaults("torch") == defaults("tensorrt") == defaults("aoti") == ("fp16", gpu)


def test_a_backend_registered_later_is_known_with_its_own_facts(registered_tpu: None) -> None:
    model = load_config(model={"backend": "tpu"}).model
    assert (model.effective_precision, [p.name for p in model.effective_profiles]) == (
        "bf16x", ["gpu"])
    with pytest.raises(ConfigError, match=r"backend tpu does not support precision fp32 "
                                          r"\(supported: \['bf16x'\]\)"):
        load_config(model={"backend": "tpu", "precision": "fp32"})
    ranged = [{"name": "r", "kind": "range", "min_batch": 1, "opt_batch": 2, "max_batch": 4}]
    with pytest.raises(ConfigError, match="backend tpu compiles static profiles only"):
        load_config(model={"backend": "tpu", "profiles": ranged})
    with pytest.raises(ConfigError, match="preprocess = gpu needs backend = torch or aoti"):
        load_config(model={"backend": "tpu", "preprocess": "gpu", "jpeg_roundtrip": False})


def test_static_only_and_the_torch_network_come_from_the_records() -> None:
    ranged = [{"name": "r", "kind": "range", "min_batch": 1, "opt_batch": 2, "max_batch": 4}]
    for name, record in BACKENDS.items():
        if record.static_only:
            with pytest.raises(ConfigError, match=f"backend {name} compiles static profiles"):
                load_config(model={"backend": name, "profiles": ranged})
        else:
            assert load_config(model={"backend": name, "profiles": ranged}).model.profiles
        gpu = {"backend": name, "preprocess": "gpu", "jpeg_roundtrip": False}
        if record.from_onnx:
            with pytest.raises(ConfigError, match="preprocess = gpu needs backend"):
                load_config(model=gpu)
        else:
            assert load_config(model=gpu).model.preprocess == "gpu"
    assert [n for n, b in BACKENDS.items() if b.static_only] == ["aoti"]
