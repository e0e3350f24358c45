"""The TensorRT backend's pure parts (run everywhere; the builder itself needs tensorrt)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from engines.backends.tensorrt.shapes import optimization_profiles, profile_index_for
from engines.calibration import CalibrationBatches, samples_from_folder
from engines.profiles import RangeProfile, StaticProfile

ITEM = (224, 224, 3)


def test_static_profile_gives_one_fixed_shape_profile_per_batch_size() -> None:
    shapes = optimization_profiles((StaticProfile("gpu", ITEM, (1, 8, 32)),), ITEM)
    assert [(s.name, s.min, s.opt, s.max) for s in shapes] == [
        ("gpu/b1", (1, *ITEM), (1, *ITEM), (1, *ITEM)),
        ("gpu/b8", (8, *ITEM), (8, *ITEM), (8, *ITEM)),
        ("gpu/b32", (32, *ITEM), (32, *ITEM), (32, *ITEM)),
    ]


def test_range_profile_gives_min_opt_max() -> None:
    (s,) = optimization_profiles((RangeProfile("r", (16,), (64,), (128,), 1, 8, 32),), (128,))
    assert (s.min, s.opt, s.max) == ((1, 16), (8, 64), (32, 128))


def test_profile_index_selects_the_box_containing_the_batch() -> None:
    shapes = optimization_profiles((StaticProfile("gpu", ITEM, (1, 8)),
                                    RangeProfile("r", ITEM, ITEM, ITEM, 9, 16, 64)), ITEM)
    assert profile_index_for(shapes, (8, *ITEM)) == 1
    assert profile_index_for(shapes, (20, *ITEM)) == 2
    with pytest.raises(ValueError):
        profile_index_for(shapes, (5, *ITEM))


def test_calibration_batches_are_full_and_float32() -> None:
    samples = (np.full(ITEM, i, dtype=np.float64) for i in range(19))
    batches = list(CalibrationBatches(samples, 8, ITEM))
    assert [b.shape for b in batches] == [(8, *ITEM), (8, *ITEM)]  # the last 3 are dropped
    assert all(b.dtype == np.float32 and b.flags.c_contiguous for b in batches)
    assert batches[1][0, 0, 0, 0] == 8


def test_calibration_stops_at_max_batches_and_checks_shapes() -> None:
    samples = [np.zeros(ITEM, np.float32)] * 40
    assert len(list(CalibrationBatches(samples, 4, ITEM, max_batches=3))) == 3
    with pytest.raises(ValueError, match="shape"):
        list(CalibrationBatches([np.zeros((3, 3), np.float32)], 1, ITEM))


def test_calibration_samples_come_from_real_images() -> None:
    from worker.bundled import samples_dir
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    got = list(samples_from_folder(samples_dir(),
                                   lambda b: preprocess_open_nsfw(decode_image(b))))
    assert len(got) == 8 and all(g.shape == ITEM for g in got)
    assert len({float(g.mean()) for g in got}) == 8  # distinct real images, not filler


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None,
                    reason="tensorrt does not import here (its builder is not installable "
                           "from the public package index)")
def test_builder_writes_a_plan(tmp_path: Path) -> None:
    from engines.backends.tensorrt.builder import TrtBuildOptions, build_trt_plan
    from engines.models.open_nsfw import open_nsfw_spec

    out = tmp_path / "engine.plan"
    build_trt_plan(open_nsfw_spec(), (StaticProfile("gpu", ITEM, (1, 8)),),
                   TrtBuildOptions("fp16", timing_cache=tmp_path / "t.cache"), out)
    assert out.stat().st_size > 1_000_000 and (tmp_path / "t.cache").is_file()


def test_the_builder_refuses_tensorrt_majors_it_cannot_drive_and_the_pin_agrees() -> None:
    import tomllib

    from engines.backends.tensorrt.builder import SUPPORTED_MAJOR, check_supported
    from engines.exceptions import BackendUnavailable

    check_supported("10.13.3.9")
    for version in ("11.0.0.1", "9.3.0", "unknown"):
        with pytest.raises(BackendUnavailable, match=r"this builder drives TensorRT 10\.x"):
            check_supported(version)
    root = Path(__file__).resolve().parents[5]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["tensorrt"] == [f"tensorrt>={SUPPORTED_MAJOR}.0,<{SUPPORTED_MAJOR + 1}"]
