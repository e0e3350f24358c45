"""`trt-worker engines build --task generation`: the SD engines built ahead (a deploy-time
step), so that a generation worker's start finds all three cached and builds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from engines.cache import BuildRecipe, EngineCache
from tests.unit.tasks.generation.gen_support import needs_sd
from worker.config import load_config
from worker.tasks.generation.setup import make_engines
from worker.tools import engines_cli


@pytest.fixture
def tiny_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny SD nets on the CPU, one size and batch each, cached in the returned folder."""
    generation = {"random_weights": "tiny", "backend": "torch", "device": "cpu",
                  "precision": "fp32", "sizes": [{"width": 64, "height": 64}],
                  "text_batch_sizes": [2], "unet_batch_sizes": [2], "vae_batch_sizes": [1]}
    monkeypatch.setenv("KTW_GENERATION", json.dumps(generation))
    monkeypatch.setenv("KTW_ENGINES", json.dumps({"cache_dir": str(tmp_path)}))
    monkeypatch.setattr(engines_cli, "console", Console(width=300))
    return tmp_path


@needs_sd
def test_generation_engines_build_ahead_of_the_worker(tiny_generation: Path) -> None:
    tmp_path = tiny_generation

    first = CliRunner().invoke(engines_cli.engines_app, ["build", "--task", "generation"])
    assert first.exit_code == 0, first.output
    assert first.output.count("built ") == 3, first.output
    assert len(EngineCache(tmp_path).entries()) == 3
    again = CliRunner().invoke(engines_cli.engines_app, ["build", "--task", "generation"])
    assert again.exit_code == 0 and again.output.count("cached:") == 3, again.output

    # The worker's own engines: the same three entries, nothing built at activation.
    built: list[BuildRecipe] = []
    cfg = load_config(processing={"task": "generation"})
    engines = make_engines(cfg, on_build=built.append)
    engines.activate()
    try:
        assert built == [] and all(h != "not-loaded" for h in engines.engine_hashes().values())
    finally:
        engines.deactivate()


def test_backend_and_precision_go_to_the_built_task_s_section(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gen = engines_cli._cfg(None, "onnxruntime", "fp32", "generation")
    assert (gen.generation.backend, gen.generation.precision) == ("onnxruntime", "fp32")
    assert gen.model.backend == "onnxruntime" and gen.model.precision is None  # untouched
    mod = engines_cli._cfg(None, "torch", None, None)
    assert mod.model.backend == "torch" and mod.generation.backend == "torch"
    monkeypatch.setenv("KTW_PROCESSING", json.dumps({"task": "generation"}))
    from_config = engines_cli._cfg(None, "onnxruntime", "fp32", None)
    assert from_config.generation.backend == "onnxruntime"
    assert from_config.model.backend == "onnxruntime" and from_config.model.precision is None


@needs_sd
def test_net_builds_only_the_named_generation_nets(tiny_generation: Path) -> None:
    tmp_path = tiny_generation
    run = CliRunner().invoke
    out = run(engines_cli.engines_app, ["build", "--task", "generation", "--net", "unet"])
    assert out.exit_code == 0, out.output
    assert [e.sidecar["model_id"] for e in EngineCache(tmp_path).entries()] == [
        "tiny-random-s0.unet"]
    bad = run(engines_cli.engines_app, ["build", "--task", "generation", "--net", "unte"])
    bad_out = " ".join(bad.output.split())
    assert bad.exit_code != 0 and "no engine unte" in bad_out and "unet" in bad_out
    mod = run(engines_cli.engines_app, ["build", "--task", "moderation", "--net", "unet"])
    mod_out = " ".join(mod.output.split())
    assert mod.exit_code != 0 and "the moderation task has open_nsfw" in mod_out
    assert len(EngineCache(tmp_path).entries()) == 1
