"""``generation.device`` and ``generation.warm_up`` default to ``auto``, resolved against the
machine when the task is built: the CPU and first-use warm-up without a CUDA device, cuda:0 and
every shape warmed with one; a device the machine lacks is one ConfigError line naming the
setting. The CUDA probe is replaced, so these run the same on any machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from worker.config import load_config
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError
from worker.tasks.generation import device as device_mod
from worker.tasks.generation.device import placed, resolve_device


def _no_probe() -> int:
    raise AssertionError("the CUDA probe must not run for this configuration")


def test_defaults_resolve_to_the_cpu_and_first_use_warm_up_without_cuda(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the generation task needs the gen extra (torch)")
    from worker.tasks.generation.setup import make_generation_task

    monkeypatch.setattr(device_mod, "cuda_device_count", lambda: 0)
    cfg = load_config(None, generation={"random_weights": "tiny"},
                      engines={"cache_dir": str(tmp_path / "engines")})
    with capture_logs() as logs:
        task = make_generation_task(cfg)
    try:
        g = task.settings
        assert (g.device, g.warm_up, g.effective_precision) == ("cpu", "first_use", "fp32")
        assert {r.device for r in task.engines.runners.values()} == {"cpu"}  # type: ignore[attr-defined]
    finally:
        task.close()
    (line,) = [e for e in logs if e["event"] == "generation_device"]
    assert (line["device"], line["warm_up"]) == ("cpu", "first_use")
    assert "no CUDA device is visible" in line["why"]


def test_defaults_resolve_to_cuda_and_every_shape_warmed_with_a_gpu() -> None:
    g = placed(GenerationSettings(random_weights="tiny"), cuda_count=lambda: 2)
    assert (g.device, g.warm_up, g.effective_precision) == ("cuda:0", "all_shapes", "fp16")


@pytest.mark.parametrize(("fields", "gpus", "expected"), [
    ({"warm_up": "all_shapes"}, 0, ("cpu", "all_shapes")),  # an explicit choice is kept
    ({"device": "cpu"}, 1, ("cpu", "first_use")),
    ({"device": "cuda:1", "warm_up": "first_use"}, 2, ("cuda:1", "first_use")),
])
def test_explicit_settings_are_kept(fields: dict[str, Any], gpus: int,
                                    expected: tuple[str, str]) -> None:
    g = resolve_device(GenerationSettings(**fields), lambda: gpus).settings
    assert (g.device, g.warm_up) == expected


def test_an_onnx_backend_runs_on_the_cpu_without_probing() -> None:
    g = resolve_device(GenerationSettings(backend="onnxruntime"), _no_probe).settings
    assert (g.device, g.warm_up) == ("cpu", "first_use")


@pytest.mark.parametrize(("fields", "gpus", "message"), [
    ({"device": "cuda"}, 0, "generation.device = 'cuda' but no CUDA device is visible: "
                            "set generation.device = 'cpu' (or 'auto')"),
    ({"device": "cuda:1"}, 1, "generation.device = 'cuda:1' but only 1 CUDA device(s) are "
                              "visible: set generation.device = 'cuda:0' (or 'auto')"),
    ({"precision": "fp16"}, 0, "generation.precision = 'fp16' needs a CUDA device"),
])
def test_a_device_the_machine_lacks_is_one_line_naming_the_setting(
        fields: dict[str, Any], gpus: int, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_device(GenerationSettings(**fields), lambda: gpus)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_auto_device_accepts_fp16_until_it_resolves() -> None:
    # fp16 is refused on a CPU device at load, but 'auto' may be a GPU: decided at resolution.
    assert GenerationSettings(precision="fp16").device == "auto"
    with pytest.raises(ValueError, match="fp16"):
        GenerationSettings(precision="fp16", device="cpu")
