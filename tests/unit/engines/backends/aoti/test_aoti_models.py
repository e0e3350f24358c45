"""Every model's native network compiles as AOTInductor packages and answers like the torch
engine: MiniLM (the real weights), CLIP's two towers and the three SD nets (tiny random
configs), on the CPU in fp32. open_nsfw on CUDA: the conformance test and bench/aoti_bench.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.assembly import EngineParams, EnginePlan
from engines.cache import EngineCache
from engines.profiles import StaticProfile
from engines.spec import EngineSpec
from tests.unit.tasks.moderation.clip.conftest import tiny_clip
from tests.unit.tasks.moderation.text.conftest import (
    minilm_dir,
    minilm_net,
    text_cache,
    text_spec,
    tokenizer,
)

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytestmark = pytest.mark.slow  # a compile per model: about two minutes in all on two cores

__all__ = ["minilm_dir", "minilm_net", "text_cache", "text_spec", "tiny_clip", "tokenizer"]


def _aoti_and_torch(spec: EngineSpec, profiles: tuple[Any, ...], feeds: dict[str, np.ndarray],
                    cache: Path) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    from engines.backends.torch.runner import TorchRunner

    plan = EnginePlan(spec, profiles, EngineParams(backend="aoti", precision="fp32",
                                                   device="cpu", cache_dir=cache))
    name = spec.outputs[0].name
    with plan.runner() as runner:
        got = runner.infer(feeds).result()[name]
        serving = dict(runner.serving)  # type: ignore[attr-defined]
    with TorchRunner(spec, profiles=profiles, precision="fp32", device="cpu") as eager:
        want = eager.infer(feeds).result()[name]
    return got, want, serving


def test_minilm(text_spec: EngineSpec, tokenizer: Any, tmp_path: Path) -> None:
    feeds = tokenizer.pad([tokenizer.first_chunk(t) for t in ("a cat on a mat", "gore")], 32)
    got, want, serving = _aoti_and_torch(text_spec, (StaticProfile("tok32", (32,), (2,)),),
                                         feeds, tmp_path)
    assert set(serving) == {"b2_32"}
    assert np.abs(want).max() > 0.01 and np.abs(got - want).max() < 1e-4


def test_clip_towers(tiny_clip: Path, tmp_path: Path) -> None:
    from engines.models.clip.engine import clip_plans

    params = EngineParams(backend="aoti", precision="fp32", device="cpu", cache_dir=tmp_path)
    plans = clip_plans(params, tiny_clip, token_buckets=[16], batch_sizes=[2])
    rng = np.random.default_rng(0)
    size = plans.config.vision.image_size
    image_feeds = {plans.image.spec.inputs[0].name:
                   rng.standard_normal((2, 3, size, size)).astype(np.float32)}
    ids = rng.integers(1, 90, (2, 16)).astype(np.int64)
    text_feeds = {t.name: ids if i == 0 else np.ones_like(ids)
                  for i, t in enumerate(plans.text.spec.inputs)}
    for plan, feeds in ((plans.image, image_feeds), (plans.text, text_feeds)):
        got, want, _ = _aoti_and_torch(plan.spec, plan.profiles, feeds, tmp_path)
        assert np.abs(want).max() > 0.01 and np.abs(got - want).max() < 1e-4


def test_sd_nets(tmp_path: Path) -> None:
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from tests.unit.tasks.generation.gen_support import MISSING, SIZES, TINY, RandomSdWeights

    if MISSING:
        pytest.skip(f"needs the gen extra ({', '.join(MISSING)} missing)")
    res = Resolution(*SIZES[1])  # non-square latents
    engines = {}
    for backend in ("aoti", "torch"):
        opts = SdEngineOptions(backend=backend, precision="fp32", device="cpu",
                               intra_op_threads=1, unet_sizes=(2,), text_sizes=(2,),
                               vae_sizes=(1,))
        engines[backend] = make_sd_engines(RandomSdWeights(TINY, 0), (res,), opts,
                                           EngineCache(tmp_path))
        engines[backend].activate()
    rng = np.random.default_rng(1)
    dims, (c, h, w) = engines["torch"].dims, (4, res.height // 8, res.width // 8)
    feeds = {
        "text_encoder": {"input_ids": np.ones((2, 77), np.int64)},
        "unet": {"sample": rng.standard_normal((2, c, h, w)).astype(np.float32),
                 "timestep": np.array([999, 21], np.float32),
                 "encoder_hidden_states": rng.standard_normal((2, 77, 32)).astype(np.float32)},
        "vae": {"latents": (rng.standard_normal((1, c, h, w)) * 4).astype(np.float32)},
    }
    try:
        for component, feed in feeds.items():
            outs = [engines[b].runners[component].infer(feed).result() for b in ("aoti", "torch")]
            got, want = (next(iter(o.values())).astype(np.float64) for o in outs)
            assert got.shape == want.shape and np.std(want) > 0, component
            if component == "vae":  # uint8 pixels: a rounding boundary may flip a level
                assert np.abs(got - want).max() <= 1 and np.mean(got != want) < 0.01
            else:
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=component)
    finally:
        for e in engines.values():
            e.deactivate()
    assert dims is not None
