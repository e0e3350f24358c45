"""The SD engines on the CPU: torch (fp32 eager) and ONNX Runtime agree on the tiny config;
artifacts are built once through the engine cache and reused; specs and profiles."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engines.cache import EngineCache
from engines.exceptions import BackendUnavailable, InferenceFailed
from engines.models.sd.arch import SD15, TINY
from engines.models.sd.engines import SdEngineOptions, SdEngines, make_sd_engines
from engines.models.sd.specs import Resolution, io_specs, sd_profiles, sd_spec
from engines.models.sd.weights import RandomSdWeights
from tests.unit.tasks.generation.gen_support import SIZES, needs_sd


def test_sd15_profiles_follow_the_latent_size() -> None:
    p = sd_profiles(SD15.dims(), (Resolution(512, 512), Resolution(768, 768)))
    assert p.text.item_shape == (77,)
    assert [u.item_shape for u in p.unet.values()] == [(4, 64, 64), (4, 96, 96)]
    assert all(u.batch_sizes == (2, 4, 8, 16) for u in p.unet.values())
    assert [v.item_shape for v in p.vae.values()] == [(4, 64, 64), (4, 96, 96)]
    assert p.of("unet") == tuple(p.unet.values())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"unet_sizes": (2, 3)}, "even"),
    ({}, "multiple of 64"),
])
def test_profiles_refuse_odd_unet_batches_and_unaligned_sizes(kwargs: Any, match: str) -> None:
    res = (Resolution(512, 520),) if not kwargs else (Resolution(512, 512),)
    with pytest.raises(ValueError, match=match):
        sd_profiles(SD15.dims(), res, **kwargs)


def test_sd15_io_specs() -> None:
    ins, _ = io_specs("unet", SD15.dims())
    assert [(t.name, t.shape) for t in ins] == [("sample", (-1, 4, -1, -1)), ("timestep", (-1,)),
                                                ("encoder_hidden_states", (-1, 77, 768))]
    assert io_specs("vae", SD15.dims())[1][0].dtype == "uint8"
    assert io_specs("text_encoder", SD15.dims())[0][0].dtype == "int64"


def test_random_identities_differ_by_seed_component_and_arch() -> None:
    a, b = RandomSdWeights(TINY, 0), RandomSdWeights(TINY, 1)
    assert a.identity("unet") == RandomSdWeights(TINY, 0).identity("unet")
    assert len({a.identity("unet"), b.identity("unet"), a.identity("vae"),
                RandomSdWeights(SD15, 0).identity("unet")}) == 4
    assert sd_spec(a, "unet").model_id == "tiny-random-s0.unet"


def _feeds(engines: SdEngines, component: str, res: tuple[int, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    c, h, w = engines.dims.latent_shape(*res)
    if component == "text_encoder":
        return {"input_ids": engines.tokenizer(["a red car", "", "a cat on a mat", "x"])}
    if component == "unet":
        return {"sample": rng.standard_normal((4, c, h, w)).astype(np.float32),
                "timestep": np.array([999, 500.5, 21, 1], np.float32),
                "encoder_hidden_states": rng.standard_normal((4, 77, 32)).astype(np.float32)}
    return {"latents": (rng.standard_normal((2, c, h, w)) * 4).astype(np.float32)}


@needs_sd
@pytest.mark.parametrize("res", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize(("component", "atol"), [
    ("text_encoder", 1e-4), ("unet", 1e-4), ("vae", 1)])
def test_torch_and_onnxruntime_agree(torch_engines: SdEngines, ort_engines: SdEngines,
                                     component: str, atol: float, res: tuple[int, int]) -> None:
    feeds = _feeds(torch_engines, component, res)
    name = io_specs(component, torch_engines.dims)[1][0].name
    a = torch_engines.runners[component].infer(feeds).result()[name]
    b = ort_engines.runners[component].infer(feeds).result()[name]
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.all(np.isfinite(a.astype(np.float64))) and np.std(a.astype(np.float64)) > 0
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), atol=atol, rtol=0)
    if component == "vae":  # pixels: at most one level apart, and almost all equal
        assert np.mean(a != b) < 0.01
        assert a.shape[1:] == (res[1], res[0], 3)


@needs_sd
def test_artifacts_are_built_once_and_reused(torch_engines: SdEngines, ort_engines: SdEngines,
                                             engine_cache: EngineCache) -> None:
    entries = engine_cache.entries()
    assert sorted((e.sidecar["model_id"], e.sidecar["backend"]) for e in entries) == sorted(
        (f"tiny-random-s0.{c}", b) for c in ("text_encoder", "unet", "vae")
        for b in ("torch", "onnxruntime"))
    assert all(e.sidecar["onnx_sha256"] == RandomSdWeights(TINY).identity(
        e.sidecar["model_id"].split(".")[1]) for e in entries)
    builds: list[Any] = []
    again = make_sd_engines(RandomSdWeights(TINY), tuple(Resolution(w, h) for w, h in SIZES),
                            _opts(), engine_cache, on_build=builds.append)
    again.activate()
    try:
        assert builds == []
        assert again.engine_hashes() == torch_engines.engine_hashes()
    finally:
        again.deactivate()


def _opts() -> SdEngineOptions:
    return SdEngineOptions(backend="torch", precision="fp32", device="cpu",
                           unet_sizes=(2, 4, 8), text_sizes=(2, 4, 8), vae_sizes=(1, 2, 4))


@needs_sd
def test_a_new_seed_builds_new_artifacts(engine_cache: EngineCache,
                                         torch_engines: SdEngines) -> None:
    builds: list[Any] = []
    other = make_sd_engines(RandomSdWeights(TINY, 5), (Resolution(64, 64),), _opts(),
                            engine_cache, on_build=builds.append)
    other.activate()
    try:
        assert len(builds) == 3
        assert set(other.engine_hashes().values()).isdisjoint(torch_engines.engine_hashes()
                                                               .values())
    finally:
        other.deactivate()


@needs_sd
def test_torch_runner_on_cpu_refuses_fp16() -> None:
    from engines.backends.torch.runner import TorchRunner

    spec = sd_spec(RandomSdWeights(TINY), "vae")
    runner = TorchRunner(spec, profiles=(), precision="fp16", device="cpu")
    with pytest.raises(BackendUnavailable, match="fp32"):
        runner.activate()


@needs_sd
def test_a_missing_input_is_an_inference_failure(torch_engines: SdEngines) -> None:
    with pytest.raises(InferenceFailed, match="missing input"):
        torch_engines.runners["unet"].infer({"sample": np.zeros((2, 4, 8, 8), np.float32)})


@needs_sd
def test_vae_wrapper_unscales_latents_and_maps_minus_one_one_to_bytes() -> None:
    """The wrapper's own arithmetic, with the decoder replaced by a recording stand-in."""
    import torch
    from torch import nn

    from engines.models.sd.nets import VaeDecoderNet

    seen: list[torch.Tensor] = []

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv_in = nn.Conv2d(1, 1, 1)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            seen.append(z)
            values = torch.tensor([-1.0, 1.0, 0.0, float("nan"), 3.0, -0.5])
            return values.view(1, 1, 2, 3).expand(z.shape[0], 3, 2, 3)

    class Vae(nn.Module):
        post_quant_conv = None

        def __init__(self) -> None:
            super().__init__()
            self.decoder = Decoder()

    net = VaeDecoderNet(Vae(), 0.5)
    out = net(torch.full((2, 4, 1, 1), 2.0))
    assert float(seen[0].max()) == 4.0  # latents / scaling_factor
    assert out.dtype == torch.uint8 and out.shape == (2, 2, 3, 3)  # NHWC
    assert out[0, :, :, 0].flatten().tolist() == [0, 255, 128, 0, 255, 64]
