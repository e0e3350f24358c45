"""worker.tasks.moderation.models.open_nsfw.engine: onnxruntime int8 calibrates on
engines.calibration_dir, else on the bundled sample photos (with a warning): a backend whose
registry record lists the precision in ``smoke_calibrated_precisions``."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import worker
from engines.backends.registry import BACKENDS
from worker.bundled import samples_dir as bundled_samples
from worker.config import load_config
from worker.tasks.moderation.engine_params import tower_params
from worker.tasks.moderation.models.open_nsfw.engine import engine_plan


def test_fp32_plan_is_unchanged(tmp_path: Path) -> None:
    plan = engine_plan(load_config(engines={"cache_dir": str(tmp_path)}))
    assert (plan.precision, plan.params.calibration_dir) == ("fp32", None)
    assert plan.recipe().flags == {}


def test_int8_without_a_calibration_dir_uses_the_bundled_samples(tmp_path: Path) -> None:
    assert bundled_samples() == Path(worker.__file__).parent / "samples"
    with capture_logs() as logs:
        plan = engine_plan(load_config(model={"precision": "int8"},
                                       engines={"cache_dir": str(tmp_path)}))
    assert plan.params.calibration_dir == bundled_samples()
    assert [e["event"] for e in logs] == ["int8_calibration_on_bundled_samples"]
    assert "engines.calibration_dir" in logs[0]["hint"]
    assert plan.preprocess is not None


def test_a_configured_calibration_dir_is_kept_and_keys_the_artifact(tmp_path: Path) -> None:
    own = tmp_path / "frames"
    own.mkdir()
    shutil.copy(bundled_samples() / "coffee.png", own / "coffee.png")
    cfg = load_config(model={"precision": "int8"},
                      engines={"cache_dir": str(tmp_path), "calibration_dir": str(own)})
    with capture_logs() as logs:
        plan = engine_plan(cfg)
    assert plan.params.calibration_dir == own and logs == []
    bundled = engine_plan(load_config(model={"precision": "int8"},
                                      engines={"cache_dir": str(tmp_path)}))
    assert plan.recipe().key != bundled.recipe().key


def test_other_backends_and_text_towers_are_untouched(tmp_path: Path) -> None:
    cfg = load_config(model={"backend": "tensorrt", "precision": "int8"},
                      engines={"cache_dir": str(tmp_path)})
    assert engine_plan(cfg).params.calibration_dir is None  # TensorRT asks for it itself
    ort_int8 = load_config(model={"precision": "int8"})
    assert tower_params(ort_int8, None, None).precision == "fp32"


def test_the_backend_record_decides_not_the_name(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend registered later whose record says its int8 may calibrate on the samples
    gets them; tensorrt's record with that fact set would too."""
    for name, base in (("npu", "tensorrt"), ("tensorrt", "tensorrt")):
        monkeypatch.setitem(BACKENDS, name, dataclasses.replace(
            BACKENDS[base], name=name, smoke_calibrated_precisions=("int8",)))
        with capture_logs() as logs:
            plan = engine_plan(load_config(model={"backend": name, "precision": "int8"},
                                           engines={"cache_dir": str(tmp_path)}))
        assert plan.params.calibration_dir == bundled_samples(), name
        assert [e["event"] for e in logs] == ["int8_calibration_on_bundled_samples"]
