"""Engine assembly: plain parameters -> recipe, loader and runner through the registry."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.assembly import EngineParams, EnginePlan, bucket_profiles
from engines.backends.onnxruntime import OrtRunner, ort_version
from engines.cache import BuildRecipe, EngineCache
from engines.device import cpu_fingerprint
from engines.exceptions import ModelNotFound
from engines.loaders import OnnxModel
from engines.models.open_nsfw import ITEM_SHAPE, open_nsfw_spec
from engines.profiles import RangeProfile, StaticProfile
from tests.harness.conformance_inputs import conformance_batch

RANGE = (RangeProfile("cpu", ITEM_SHAPE, ITEM_SHAPE, ITEM_SHAPE, 1, 8, 64),)
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the gpu extra)")


def _plan(tmp_path: Path, **params: Any) -> EnginePlan:
    return EnginePlan(open_nsfw_spec(), RANGE, EngineParams(cache_dir=tmp_path, **params))


def test_onnxruntime_recipe_is_the_one_the_cache_always_keyed_on(tmp_path: Path) -> None:
    spec = open_nsfw_spec()
    expected = BuildRecipe("open_nsfw", spec.onnx().sha256, "onnxruntime", ort_version(),
                           cpu_fingerprint(), "fp32", tuple(p.to_dict() for p in RANGE),
                           artifact_name="model.ort.onnx")
    assert _plan(tmp_path).recipe().key == expected.key


def test_model_flags_onnx_flags_and_profiles_in_the_key(tmp_path: Path) -> None:
    plan = dataclasses.replace(_plan(tmp_path), identity=lambda: "w" * 64, flags={"a": 1},
                               onnx_flags={"opset": 17}, key_profiles=False)
    ort = plan.recipe()
    assert (ort.onnx_sha256, ort.flags, ort.profiles) == ("w" * 64, {"a": 1, "opset": 17}, ())
    if importlib.util.find_spec("torch") is not None:  # torch builds from the network
        torch = dataclasses.replace(plan, params=EngineParams(backend="torch", device="cpu",
                                                              cache_dir=tmp_path)).recipe()
        assert (torch.flags, torch.artifact_name) == ({"a": 1}, "weights.pt")


def test_a_runner_is_made_without_reading_the_model(tmp_path: Path) -> None:
    def missing() -> OnnxModel:
        raise ModelNotFound("not read yet")

    spec = dataclasses.replace(open_nsfw_spec(), onnx=missing)
    runner = EnginePlan(spec, RANGE, EngineParams(cache_dir=tmp_path)).runner()
    assert isinstance(runner, OrtRunner) and not runner.active
    with pytest.raises(ModelNotFound, match="not read yet"):
        runner.activate()


def test_without_the_cache_the_runner_loads_the_model_itself(tmp_path: Path) -> None:
    runner = _plan(tmp_path, use_cache=False, intra_op_threads=1).runner()
    with runner:
        assert runner.engine_hash.startswith(f"onnxruntime-{ort_version()}-")
    assert EngineCache(tmp_path).entries() == []


def test_bucket_profiles_follow_the_backend() -> None:
    torch = bucket_profiles("tok", [(16,), (32,)], [1, 8], "torch")
    ort = bucket_profiles("tok", [(16,), (32,)], [1, 8], "onnxruntime")
    assert torch == (StaticProfile("tok16", (16,), (1, 8)), StaticProfile("tok32", (32,), (1, 8)))
    assert ort == (RangeProfile("tok16", (16,), (16,), (16,), 1, 8, 8),
                   RangeProfile("tok32", (32,), (32,), (32,), 1, 8, 8))


@needs_torch
def test_torch_artifact_is_built_once_then_loaded_into_the_skeleton(tmp_path: Path) -> None:
    """The torch backend through the cache, on the CPU: the open_nsfw weights saved by the
    registry's builder, loaded into the skeleton, scoring like the float32 ONNX."""
    x = conformance_batch(n_synthetic=4)[:6]
    with OrtRunner(open_nsfw_spec(), intra_op_threads=2) as ort_runner:
        ref = ort_runner.infer({"input:0": x}).result()["outputs"]
    plan = _plan(tmp_path, backend="torch", device="cpu")
    built: list[BuildRecipe] = []
    hashes = []
    for _ in range(2):
        with plan.runner(on_build=built.append) as runner:
            got = runner.infer({"input:0": x}).result()["outputs"]
            hashes.append(runner.engine_hash)
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    entries = EngineCache(tmp_path).entries()
    assert len(built) == 1 and len(entries) == 1 and entries[0].artifact.name == "weights.pt"
    assert hashes == [f"torch-{entries[0].key[:12]}"] * 2


@needs_torch
def test_backends_that_compile_per_profile_key_on_profiles_even_when_the_model_says_not(
        tmp_path: Path) -> None:
    """SD's plans leave profiles out of the key (a weights artifact serves every shape); an
    AOTInductor or TensorRT artifact is compiled for them, so it must key on them: before, an
    engine built for one set of batch sizes was found (and failed to load) for another."""
    static = (StaticProfile("p", ITEM_SHAPE, (1, 8)),)
    recipes = {b: EnginePlan(open_nsfw_spec(), static, EngineParams(
        backend=b, cache_dir=tmp_path, device="cpu"), key_profiles=False).recipe()
        for b in ("torch", "aoti")}
    assert recipes["torch"].profiles == ()
    assert recipes["aoti"].profiles == (static[0].to_dict(),)
