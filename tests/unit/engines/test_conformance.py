"""Every runner available on this machine against the float32 onnxruntime reference.

One test, parametrized over runners; unavailable ones skip with the reason. Tolerances are on
output probabilities: fp32 runners must agree to 1e-4 (1e-5 on the CPU); fp16 ones to 1e-2 at
worst and 2e-3 on average (FP16 rounds the input and accumulates over 53 convolutions; on an
H200 the largest difference seen was 4.8e-3).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines.backends.base import Runner
from engines.models.open_nsfw import bundled_onnx_path, open_nsfw_spec
from engines.profiles import Profile, RangeProfile, StaticProfile
from tests.harness.conformance_inputs import conformance_batch

ITEM = (224, 224, 3)
STATIC: tuple[Profile, ...] = (StaticProfile("gpu", ITEM, (1, 8, 32)),)
RANGE: tuple[Profile, ...] = (RangeProfile("any", ITEM, ITEM, ITEM, 1, 8, 64),)


def _torch_installed() -> str | None:
    return "torch is not installed" if importlib.util.find_spec("torch") is None else None


def _cuda() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    return None if torch.cuda.is_available() else "no CUDA device"


def _tensorrt() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return ("tensorrt does not import here (its builder is not installable from the public "
                "package index)")
    return _cuda()


def _ort_plain(_: Path) -> Runner:
    from engines.backends.onnxruntime import OrtRunner

    return OrtRunner(open_nsfw_spec())


def _ort_cached(cache: Path) -> Runner:
    from engines.backends.onnxruntime import OrtRunner, build_ort_artifact, ort_version
    from engines.cache import BuildRecipe, EngineCache, EngineFromCache
    from engines.device import cpu_fingerprint

    spec = open_nsfw_spec()
    recipe = BuildRecipe("open_nsfw", spec.onnx().sha256, "onnxruntime", ort_version(),
                         cpu_fingerprint(), "fp32", tuple(p.to_dict() for p in RANGE))
    loader = EngineFromCache(EngineCache(cache), recipe, lambda out: build_ort_artifact(spec, out))
    return OrtRunner(spec, engine=loader)


def _torch(precision: str, profiles: tuple[Profile, ...], device: int | str = 0
           ) -> Callable[[Path], Runner]:
    def make(_: Path) -> Runner:
        from engines.backends.torch.runner import TorchRunner

        return TorchRunner(open_nsfw_spec(), profiles=profiles, precision=precision,
                           device=device)

    return make


def _trt(cache: Path) -> Runner:
    from engines.backends.tensorrt.builder import TrtBuildOptions, build_trt_plan, trt_version
    from engines.backends.tensorrt.runner import TrtRunner
    from engines.cache import BuildRecipe, EngineCache, EngineFromCache
    from engines.device import cuda_fingerprint

    spec = open_nsfw_spec()
    device = cuda_fingerprint()
    recipe = BuildRecipe("open_nsfw", spec.onnx().sha256, "tensorrt", trt_version(), device,
                         "fp16", tuple(p.to_dict() for p in STATIC))
    loader = EngineFromCache(EngineCache(cache), recipe, lambda out: build_trt_plan(
        spec, STATIC, TrtBuildOptions("fp16", timing_cache=cache / "timing.cache"), out))
    return TrtRunner(spec, profiles=STATIC, engine=loader)


def _aoti(cache: Path) -> Runner:
    """Compiled for the static sizes in the test's folder (every run compiles), without
    max-autotune (minutes per size; the benchmark builds with it)."""
    from engines.assembly import EngineParams, EnginePlan

    plan = EnginePlan(open_nsfw_spec(), STATIC,
                      EngineParams(backend="aoti", precision="fp16", cache_dir=cache,
                                   autotune=False))
    return plan.runner()


RUNNERS = [
    pytest.param(_ort_plain, 1e-5, None, id="onnxruntime"),
    pytest.param(_ort_cached, 1e-5, None, id="onnxruntime-cached-artifact"),
    pytest.param(_torch("fp32", STATIC), 1e-4, _cuda(), id="torch-fp32-cudagraphs"),
    pytest.param(_torch("fp16", STATIC), 1e-2, _cuda(), id="torch-fp16-cudagraphs"),
    pytest.param(_torch("fp16", RANGE), 1e-2, _cuda(), id="torch-fp16-eager-range"),
    pytest.param(_torch("fp32", RANGE, "cpu"), 1e-5, _torch_installed(), id="torch-fp32-cpu"),
    pytest.param(_trt, 1e-2, _tensorrt(), id="tensorrt-fp16"),
    pytest.param(_aoti, 1e-2, _cuda(), id="aoti-fp16"),
]


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    x = conformance_batch()
    sess = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    return x, sess.run(["outputs"], {"input:0": x})[0]


@pytest.mark.parametrize(("make", "atol", "skip"), RUNNERS)
def test_runner_matches_float32_reference(
    make: Callable[[Path], Runner], atol: float, skip: str | None,
    reference: tuple[np.ndarray, np.ndarray], tmp_path: Path,
) -> None:
    if skip:
        pytest.skip(skip)
    x, ref = reference
    assert ref[:, 1].max() - ref[:, 1].min() > 0.05, "inputs must spread the scores"
    with make(tmp_path) as runner:
        # Batches of 8 (a static size) and one short batch of 5 (padded or ranged).
        outs = []
        for start in range(0, 32, 8):
            batch = x[start:start + 8]
            if len(batch) == 8:
                outs.append(runner.infer({"input:0": batch}).result()["outputs"])
        short = runner.infer({"input:0": _pad_static(runner, x[:5])}).result()["outputs"][:5]
    got = np.concatenate(outs)
    np.testing.assert_allclose(got, ref[: len(got)], atol=atol, rtol=0)
    assert np.abs(got - ref[: len(got)]).mean() <= atol / 5
    np.testing.assert_allclose(short, ref[:5], atol=atol, rtol=0)
    print(f"{runner.backend}: max |diff| = {np.abs(got - ref[: len(got)]).max():.2e}")


def _pad_static(runner: Runner, x: np.ndarray) -> np.ndarray:
    """Static-profile runners take offered sizes only; pad like the worker does."""
    if runner.backend == "tensorrt":  # (the aoti runner pads to its compiled sizes itself)
        return np.concatenate([x, np.repeat(x[:1], 8 - len(x), axis=0)])
    return x
