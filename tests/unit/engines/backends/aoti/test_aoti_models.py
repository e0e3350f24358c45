"""Every model's native network compiles as AOTInductor packages and answers like the torch
engine: MiniLM (the real weights), CLIP's two towers and the three SD nets (tiny random
configs), on the CPU in fp32. open_nsfw on CUDA: the conformance test and bench/aoti/aoti_bench.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.assembly import EngineParams, EnginePlan
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


def _gen_config(cache: Path) -> Any:
    from worker.config import load_config

    return load_config(None, engines={"cache_dir": str(cache)}, generation={
        "random_weights": "tiny", "backend": "aoti", "device": "cpu",
        "sizes": [{"width": 128, "height": 64}], "unet_batch_sizes": [2],
        "text_batch_sizes": [2], "vae_batch_sizes": [1], "max_steps": 4})


def test_sd_nets_through_the_generation_config(tmp_path: Path) -> None:
    """The three SD nets as AOTInductor packages (the worker's generation settings, tiny
    random weights, non-square latents) answer like the torch engines; then a fresh process
    serving a generation job from those cached packages imports neither diffusers nor
    transformers."""
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from tests.unit.tasks.generation.gen_support import MISSING, TINY, RandomSdWeights
    from worker.tasks.generation.setup import make_engines

    if MISSING:
        pytest.skip(f"needs the gen extra ({', '.join(MISSING)} missing)")
    cfg = _gen_config(tmp_path)
    res = Resolution(128, 64)
    engines = {"aoti": make_engines(cfg)}
    opts = SdEngineOptions(backend="torch", precision="fp32", device="cpu", unet_sizes=(2,),
                           text_sizes=(2,), vae_sizes=(1,))
    engines["torch"] = make_sd_engines(RandomSdWeights(TINY, 0), (res,), opts, None)
    for e in engines.values():
        e.activate()
    rng = np.random.default_rng(1)
    c, h, w = 4, res.height // 8, res.width // 8
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
    _serves_without_diffusers_or_transformers(tmp_path)


SERVE = """
import json, sys
from tests.unit.engines.backends.aoti.test_aoti_models import _gen_config
from worker.tasks.generation.setup import make_generation_task
task = make_generation_task(_gen_config(__import__("pathlib").Path(sys.argv[1])))
task.warm_up()  # activates the engines and runs a job through every shape
print(json.dumps(sorted(m for m in ("diffusers", "transformers") if m in sys.modules)))
"""


def _serves_without_diffusers_or_transformers(cache: Path) -> None:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[5]
    done = subprocess.run([sys.executable, "-c", SERVE, str(cache)], capture_output=True,
                          text=True, cwd=root, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
