"""engines.backends.onnxruntime.OrtRunner with the real bundled open_nsfw weights (CPU)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines.backends.onnxruntime import OrtRunner
from engines.exceptions import (
    InferenceFailed,
    ModelChecksumMismatch,
    ModelNotFound,
    RunnerStateError,
)
from engines.loaders import OnnxFromPath
from engines.models.open_nsfw import LABELS, SHA256, bundled_onnx_path, open_nsfw_spec
from worker.config import Thresholds
from worker.tasks.moderation.images.cpu import decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw
from worker.tasks.moderation.scoring.verdict import verdict_for
from worker.wire.moderation_jobs import Verdict

INPUT, OUTPUT = "input:0", "outputs"


@pytest.fixture(scope="module")
def runner() -> Iterator[OrtRunner]:
    with OrtRunner(open_nsfw_spec(), intra_op_threads=2) as r:
        yield r


@pytest.fixture(scope="module")
def sample_batch(sample_paths: list[Path]) -> np.ndarray:
    return np.stack([preprocess_open_nsfw(decode_image(p.read_bytes())) for p in sample_paths])


@pytest.fixture(scope="module")
def runner_scores(runner: OrtRunner, sample_batch: np.ndarray) -> np.ndarray:
    return runner.infer({INPUT: sample_batch}).result(timeout=60)[OUTPUT]


# --- the bundled model --------------------------------------------------------------------------


def test_bundled_onnx_matches_the_pinned_checksum() -> None:
    path = bundled_onnx_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256


def test_spec_describes_the_model_io() -> None:
    session = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    spec = open_nsfw_spec()
    assert [i.name for i in session.get_inputs()] == [t.name for t in spec.inputs] == [INPUT]
    assert [o.name for o in session.get_outputs()] == [t.name for t in spec.outputs] == [OUTPUT]
    assert session.get_inputs()[0].shape[1:] == list(spec.inputs[0].shape[1:]) == [224, 224, 3]
    assert spec.labels == LABELS == ("sfw", "nsfw")


# --- lifecycle ----------------------------------------------------------------------------------


def test_infer_before_activate_raises_runner_state_error() -> None:
    r = OrtRunner(open_nsfw_spec())
    with pytest.raises(RunnerStateError, match="before activate"):
        r.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)})


def test_constructing_a_runner_touches_no_file(tmp_path: Path) -> None:
    r = OrtRunner(open_nsfw_spec(tmp_path / "missing.onnx"))
    assert not r.active
    assert r.engine_hash == ""
    with pytest.raises(ModelNotFound):
        r.activate()
    assert not r.active


def test_activate_infer_deactivate() -> None:
    r = OrtRunner(open_nsfw_spec(), intra_op_threads=1)
    r.activate()
    try:
        assert r.active
        out = r.infer({INPUT: np.zeros((2, 224, 224, 3), np.float32)}).result(timeout=60)
        assert out[OUTPUT].shape == (2, 2)
    finally:
        r.deactivate()
    assert not r.active
    with pytest.raises(RunnerStateError):
        r.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)})
    r.deactivate()  # a second deactivate is harmless
    assert not r.active


def test_context_manager_activates_and_deactivates() -> None:
    with OrtRunner(open_nsfw_spec(), intra_op_threads=1) as r:
        assert r.active
        assert r.engine_hash
    assert not r.active
    with pytest.raises(RunnerStateError):
        r.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)})


def test_context_manager_deactivates_on_error() -> None:
    r = OrtRunner(open_nsfw_spec(), intra_op_threads=1)
    with pytest.raises(KeyError), r:
        raise KeyError("boom")
    assert not r.active


def test_runner_can_be_reactivated() -> None:
    r = OrtRunner(open_nsfw_spec(), intra_op_threads=1)
    with r:
        first = r.engine_hash
    with r:
        assert r.engine_hash == first
        assert r.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)}).result()[OUTPUT].shape \
            == (1, 2)


def test_infer_returns_a_handle_that_completes(runner: OrtRunner) -> None:
    handle = runner.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)})
    out = handle.result(timeout=60)
    assert handle.done()
    assert set(out) == {OUTPUT}
    assert out[OUTPUT].shape == (1, 2) and out[OUTPUT].dtype == np.float32


def test_infer_runs_on_a_callers_executor(runner: OrtRunner) -> None:
    with ThreadPoolExecutor(1, thread_name_prefix="caller-stream") as stream:
        out = runner.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)}, stream).result()
    assert out[OUTPUT].shape == (1, 2)


# --- identity and checksums ---------------------------------------------------------------------


def test_engine_hash_names_backend_version_and_onnx_sha256(runner: OrtRunner) -> None:
    digest = hashlib.sha256(bundled_onnx_path().read_bytes()).hexdigest()
    assert digest[:12] in runner.engine_hash
    assert runner.engine_hash == f"onnxruntime-{ort.__version__}-{digest[:12]}"


def test_checksum_mismatch_is_refused_at_activate() -> None:
    spec = dataclasses.replace(
        open_nsfw_spec(), onnx=OnnxFromPath(bundled_onnx_path(), expected_sha256="0" * 64)
    )
    r = OrtRunner(spec)
    with pytest.raises(ModelChecksumMismatch, match="0000000000"):
        r.activate()
    assert not r.active


def test_a_swapped_onnx_file_is_refused(tmp_path: Path) -> None:
    swapped = tmp_path / "open-nsfw.onnx"
    swapped.write_bytes(bundled_onnx_path().read_bytes() + b"\x00")
    with pytest.raises(ModelChecksumMismatch, match="expected " + SHA256):
        OrtRunner(open_nsfw_spec(swapped)).activate()


def test_an_unpinned_loader_accepts_any_file_and_reports_its_hash(tmp_path: Path) -> None:
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(bundled_onnx_path().read_bytes())
    model = OnnxFromPath(copy)()
    assert model.sha256 == SHA256 and model.source == str(copy)


def test_garbage_onnx_surfaces_as_inference_failed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    spec = dataclasses.replace(open_nsfw_spec(), onnx=OnnxFromPath(bad))
    with pytest.raises(InferenceFailed, match="could not load"):
        OrtRunner(spec).activate()


# --- numbers ------------------------------------------------------------------------------------


def test_runner_scores_equal_a_direct_onnxruntime_session(
    runner_scores: np.ndarray, sample_batch: np.ndarray
) -> None:
    session = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    (direct,) = session.run([OUTPUT], {INPUT: sample_batch})
    assert runner_scores.shape == direct.shape == (len(sample_batch), 2)
    np.testing.assert_allclose(runner_scores, direct, rtol=1e-5, atol=1e-6)


def test_scores_are_probabilities(runner_scores: np.ndarray) -> None:
    assert np.all(runner_scores >= 0) and np.all(runner_scores <= 1)
    np.testing.assert_allclose(runner_scores.sum(axis=1), 1.0, atol=1e-5)


def test_every_sample_image_is_safe_under_default_thresholds(
    runner_scores: np.ndarray, sample_paths: list[Path]
) -> None:
    for path, (_sfw, nsfw) in zip(sample_paths, runner_scores, strict=True):
        assert nsfw < 0.2, f"{path.name}: nsfw {nsfw}"
        assert verdict_for(float(nsfw), Thresholds()) is Verdict.ALLOW


def test_batch_rows_do_not_depend_on_their_neighbours(
    runner: OrtRunner, runner_scores: np.ndarray, sample_batch: np.ndarray
) -> None:
    reversed_scores = runner.infer({INPUT: sample_batch[::-1].copy()}).result()[OUTPUT]
    np.testing.assert_allclose(reversed_scores[::-1], runner_scores, rtol=1e-4, atol=1e-6)
    single = runner.infer({INPUT: sample_batch[2:3]}).result()[OUTPUT]
    np.testing.assert_allclose(single[0], runner_scores[2], rtol=1e-4, atol=1e-6)


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "feeds",
    [
        {INPUT: np.zeros((1, 100, 100, 3), np.float32)},
        {INPUT: np.zeros((1, 3, 224, 224), np.float32)},
        {INPUT: np.zeros((224, 224, 3), np.float32)},
        {INPUT: np.zeros((1, 224, 224, 3), np.float64)},
        {"wrong:0": np.zeros((1, 224, 224, 3), np.float32)},
    ],
    ids=["small-image", "nchw", "no-batch-dim", "float64", "wrong-input-name"],
)
def test_bad_feeds_surface_as_inference_failed_from_the_handle(
    runner: OrtRunner, feeds: dict[str, np.ndarray]
) -> None:
    handle = runner.infer(feeds)  # infer only enqueues; the error arrives with the result
    with pytest.raises(InferenceFailed, match="onnxruntime run failed"):
        handle.result(timeout=60)
    assert handle.done()
    assert InferenceFailed.recoverable is True


def test_runner_keeps_working_after_a_failed_batch(runner: OrtRunner) -> None:
    with pytest.raises(InferenceFailed):
        runner.infer({INPUT: np.zeros((1, 7, 7, 3), np.float32)}).result()
    out = runner.infer({INPUT: np.zeros((1, 224, 224, 3), np.float32)}).result()
    assert out[OUTPUT].shape == (1, 2)
