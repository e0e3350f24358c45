"""onnxruntime int8: the real open_nsfw quantized on the bundled sample photos, its scores
against fp32, and what its cache key covers (precision, recipe, the calibration images)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import worker
from engines.assembly import EngineParams, EnginePlan
from engines.backends.onnxruntime import INT8_RECIPE, OrtRunner
from engines.cache import BuildRecipe, CacheEntry
from engines.exceptions import BackendUnavailable, EngineError
from engines.models.open_nsfw import ITEM_SHAPE, open_nsfw_spec
from engines.profiles import RangeProfile
from worker.tasks.moderation.images.cpu import decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

SAMPLES_DIR = Path(worker.__file__).parent / "samples"  # the 8 bundled photos
RANGE = (RangeProfile("cpu", ITEM_SHAPE, ITEM_SHAPE, ITEM_SHAPE, 1, 8, 64),)
INPUT, OUTPUT = "input:0", "outputs"
# uint8 activations put the softmax's input on a grid of 1/255 of its calibrated range, about
# 0.004 per step near the output; a few steps of drift through the network stay under 0.02 (the
# samples measure 0.006). Scores on real NSFW traffic are not validated here (no labelled set).
SCORE_TOLERANCE = 0.02


def _preprocess(data: bytes) -> np.ndarray:
    return preprocess_open_nsfw(decode_image(data))


def _plan(cache: Path, calibration: Path | None = SAMPLES_DIR, **params: Any) -> EnginePlan:
    return EnginePlan(open_nsfw_spec(), RANGE,
                      EngineParams(precision="int8", cache_dir=cache, intra_op_threads=2,
                                   calibration_dir=calibration, **params),
                      preprocess=_preprocess)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int8-cache")


@pytest.fixture(scope="module")
def built(cache_dir: Path) -> Iterator[tuple[OrtRunner, CacheEntry, list[BuildRecipe]]]:
    """The int8 engine, built once for the module (about 10 s on 2 cores)."""
    pytest.importorskip("onnx", reason="int8 quantization needs onnx (not a core dependency)")
    builds: list[BuildRecipe] = []
    plan = _plan(cache_dir)
    runner = plan.runner(on_build=builds.append)
    assert isinstance(runner, OrtRunner)
    with runner:
        yield runner, plan.loader()(), builds


@pytest.fixture(scope="module")
def sample_batch(sample_paths: list[Path]) -> np.ndarray:
    return np.stack([_preprocess(p.read_bytes()) for p in sample_paths])


# --- the artifact -------------------------------------------------------------------------------


@pytest.mark.slow
def test_int8_artifact_is_quantized(built: tuple[OrtRunner, CacheEntry, list[BuildRecipe]],
                                    sample_paths: list[Path]) -> None:
    import onnx

    _runner, entry, builds = built
    assert [r.precision for r in builds] == ["int8"]
    ops = {n.op_type for n in onnx.load(str(entry.artifact)).graph.node}
    assert ops & {"QuantizeLinear", "DequantizeLinear", "QLinearConv"}, sorted(ops)
    assert "Conv" not in ops  # every convolution runs quantized
    assert entry.sidecar["precision"] == "int8"
    notes = entry.sidecar["build"]["int8"]
    assert notes["opset"] == [9, 13]  # the export is opset 9: converted for QDQ's axis
    assert notes["calibration_rows"] == 2 * len(sample_paths)  # each image and its mirror


@pytest.mark.slow
def test_int8_scores_stay_within_tolerance_of_fp32(
    built: tuple[OrtRunner, CacheEntry, list[BuildRecipe]], sample_batch: np.ndarray
) -> None:
    runner, _entry, _builds = built
    with OrtRunner(open_nsfw_spec(), intra_op_threads=2) as fp32:
        reference = fp32.infer({INPUT: sample_batch}).result(timeout=120)[OUTPUT]
    scores = runner.infer({INPUT: sample_batch}).result(timeout=120)[OUTPUT]
    assert scores.shape == reference.shape and scores.dtype == np.float32
    diff = np.abs(scores[:, 1] - reference[:, 1])
    assert diff.max() <= SCORE_TOLERANCE, diff
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-2)


@pytest.mark.slow
def test_the_same_inputs_are_a_cache_hit(
    built: tuple[OrtRunner, CacheEntry, list[BuildRecipe]], cache_dir: Path
) -> None:
    runner, entry, _builds = built
    again: list[BuildRecipe] = []
    # use_cache off: int8 has no way to run but its artifact, so it still comes from the cache.
    with _plan(cache_dir, use_cache=False).runner(on_build=again.append) as second:
        assert second.engine_hash == runner.engine_hash == f"onnxruntime-{entry.key[:12]}"
    assert again == []


# --- the cache key ------------------------------------------------------------------------------


def _copy_samples(to: Path, names: list[str]) -> Path:
    to.mkdir()
    for name in names:
        shutil.copy(SAMPLES_DIR / name, to / name)
    return to


def test_fp32_and_int8_never_share_a_key(tmp_path: Path) -> None:
    int8 = _plan(tmp_path).recipe()
    fp32 = dataclasses.replace(_plan(tmp_path), params=EngineParams(cache_dir=tmp_path,
                                                                    calibration_dir=SAMPLES_DIR))
    assert fp32.recipe().flags == {}  # fp32 keys as it always did, calibration or not
    assert int8.key != fp32.recipe().key
    assert int8.precision == "int8" and int8.flags["int8"] == INT8_RECIPE


def test_the_calibration_images_are_in_the_key(tmp_path: Path,
                                               sample_paths: list[Path]) -> None:
    names = [p.name for p in sample_paths]
    full = _plan(tmp_path).recipe()
    same = _plan(tmp_path, _copy_samples(tmp_path / "copy", names)).recipe()
    fewer = _plan(tmp_path, _copy_samples(tmp_path / "fewer", names[:-1])).recipe()
    edited = _copy_samples(tmp_path / "edited", names)
    (edited / names[0]).write_bytes((edited / names[0]).read_bytes() + b"\0")
    assert same.key == full.key  # the images, not where the folder is
    assert len({full.key, fewer.key, _plan(tmp_path, edited).recipe().key}) == 3
    assert full.flags["calibration"] != fewer.flags["calibration"]


def test_a_folder_without_images_is_refused_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match=r"\(engines\.calibration_dir\) holds no images"):
        _plan(tmp_path, tmp_path / "empty").recipe()
    with pytest.raises(EngineError, match=r"engines\.calibration_dir"):
        _plan(tmp_path, tmp_path / "missing").recipe()


def test_int8_without_calibration_images_is_refused(tmp_path: Path) -> None:
    runner = _plan(tmp_path, None).runner()
    with pytest.raises(EngineError, match=r"set engines\.calibration_dir"):
        runner.activate()
    assert not runner.active
    assert not list(tmp_path.glob("open_nsfw/*/model.ort.onnx"))  # nothing cached


def test_int8_needs_a_calibration_preprocess(tmp_path: Path) -> None:
    plan = dataclasses.replace(_plan(tmp_path), preprocess=None)
    with pytest.raises(EngineError, match="calibration preprocess"):
        plan.runner().activate()


@pytest.mark.slow
def test_an_unreadable_calibration_image_is_an_engine_error(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="int8 quantization needs onnx (not a core dependency)")
    folder = _copy_samples(tmp_path / "calibration", ["coffee.png"])
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(EngineError, match=r"calibration image in .* could not be used") as info:
        _plan(tmp_path, folder).runner().activate()
    assert info.value.__cause__ is not None  # the preprocess's own error, chained
    assert not list(tmp_path.glob("open_nsfw/*/model.ort.onnx"))


def test_int8_without_onnx_installed_is_backend_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(BackendUnavailable, match="int8 on onnxruntime needs the onnx package"):
        _plan(tmp_path).runner().activate()
