"""A fourth model, added from this folder alone: its package (settings, preprocessing, engine,
model), registered through the registry API, is known to the config, runs a job end to end
through the moderation task (no broker), and `trt-worker engines build` builds its engine."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from engines.cache import EngineCache
from tests.unit.tasks.moderation.tiny_model import PACKAGE
from tests.unit.tasks.moderation.tiny_model.engine import tiny_onnx
from tests.unit.tasks.moderation.tiny_model.preprocess import preprocess_tiny
from worker.config import WorkerConfig, load_config
from worker.exceptions import ConfigError
from worker.tasks.moderation import models
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import Answer, ConsumedBatch
from worker.tasks.registry import make_task
from worker.tools import engines_cli
from worker.wire.moderation_codec import decode_result
from worker.wire.records import SourceRecord

POLICY = {"models": ["tiny"], "labels": {"bright": {"review": 0.3, "block": 0.6}}}


@pytest.fixture
def tiny() -> Iterator[None]:
    models.register(PACKAGE)
    try:
        yield
    finally:
        models.unregister(PACKAGE.name)


@pytest.fixture
def cfg(tiny: None, tmp_path: Path) -> WorkerConfig:
    return load_config(engines={"cache_dir": str(tmp_path / "engines")},
                       batch={"max_delay_ms": 0, "max_batch_size": 4},
                       model={"decode_threads": 1, "intra_op_threads": 1},
                       moderation={"tiny": {"size": 8, "seed": 3}, "policies": {"shade": POLICY}})


def _png(rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (20, 12), rgb).save(out, "PNG")
    return out.getvalue()


def _record(offset: int, **doc: object) -> SourceRecord:
    value = msgpack.packb({"v": 2, "policy": "shade", **doc}, use_bin_type=True)
    return SourceRecord("moderation.jobs", 0, offset, None, value, None, None)


def _serve(task: ModerationTask, records: list[SourceRecord]) -> list[Answer]:
    answers = task.admit(ConsumedBatch(records, {}, time.monotonic()))
    while task.held():
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
        answers += task.collect(block=True)
    return answers


def _expected(image: bytes, seed: int) -> dict[str, float]:
    """The same graph run directly by onnxruntime on the same preprocessing."""
    import onnxruntime as ort

    session = ort.InferenceSession(tiny_onnx(seed), providers=["CPUExecutionProvider"])
    x = preprocess_tiny(Image.open(io.BytesIO(image)), 8)[None]
    (row,) = session.run(["probs"], {"pixels": x})[0]
    return {"tiny.bright": float(row[0]), "tiny.dark": float(row[1])}


def test_the_config_knows_the_model_only_once_registered(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model 'tiny'"):
        load_config(moderation={"policies": {"shade": POLICY}})
    with pytest.raises(ConfigError, match=r"unknown keys \['tiny'\]"):
        load_config(moderation={"tiny": {"size": 8}})
    models.register(PACKAGE)
    try:
        cfg = load_config(moderation={"tiny": {"size": 16}, "policies": {"shade": {
            "models": ["tiny"]}}})
        assert cfg.moderation.tiny.size == 16
        # its fixed label gets the package's default thresholds, its info label is reserved
        bright = cfg.moderation.policies["shade"].labels["bright"]
        assert (bright.review, bright.block) == (0.5, 0.9)
        with pytest.raises(ConfigError, match="'dark' is reserved"):
            load_config(moderation={"policies": {"shade": {"models": ["tiny"], "labels": {
                "dark": {}}}}})
        with pytest.raises(ConfigError, match="tiny scores only 'bright'"):
            load_config(moderation={"policies": {"shade": {"models": ["tiny", "text"],
                                                           "labels": {"x": {
                "descriptions": ["y"], "models": {"tiny": {"block": 0.5}}}}}}})
    finally:
        models.unregister(PACKAGE.name)


def test_a_job_runs_end_to_end_through_the_task(cfg: WorkerConfig) -> None:
    task = make_task(cfg)
    assert isinstance(task, ModerationTask) and set(task.models) == {"open_nsfw", "tiny"}
    task.warm_up()
    white, red = _png((250, 250, 250)), _png((200, 10, 10))
    answers = _serve(task, [_record(0, id="white", image=white), _record(1, id="red", image=red),
                            _record(2, id="broken", image=b"\x89PNG\r\n\x1a\nnot a png"),
                            _record(3, id="words", text="no image")])
    task.close()
    by_id = {a.job_id or str(a.ref.offset): a for a in answers}  # refused at intake: no id
    assert set(by_id) == {"white", "red", "broken", "3"}
    broken, words = by_id["broken"].rejection, by_id["3"].rejection
    assert broken is not None and broken.reason == "bad_image"
    assert words is not None and words.reason == "nothing_to_score"
    engine_hash = task.models["tiny"].identity()[1]
    for job_id, image in (("white", white), ("red", red)):
        result = decode_result(by_id[job_id].value or b"")
        assert result["models"] == ["tiny"] and result["model_id"] == "tiny-s3"
        assert result["engine_hash"] == engine_hash
        expected = _expected(image, seed=3)
        assert result["scores"].keys() == expected.keys()
        assert np.allclose([result["scores"][k] for k in expected], list(expected.values()),
                           atol=1e-5)
        bright = expected["tiny.bright"]
        verdict = "block" if bright >= 0.6 else "review" if bright >= 0.3 else "allow"
        assert result["verdict"] == verdict
        assert result["rule"] == ("allow" if verdict == "allow" else f"{verdict}:tiny.bright")


def test_engines_build_builds_it_through_its_package(cfg: WorkerConfig, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f"""
[engines]
cache_dir = "{cfg.engines.cache_dir}"

[moderation.tiny]
size = 8
seed = 3

[moderation.policies.shade]
models = ["tiny"]
""")
    out = CliRunner().invoke(engines_cli.engines_app, ["build", "--config", str(config),
                                                        "--engine", "tiny"])
    assert out.exit_code == 0, out.output
    built = [e.sidecar["model_id"] for e in EngineCache(cfg.engines.cache_dir).entries()]
    assert built == ["tiny-s3"]
    # Without --engine: every engine of every served model (open_nsfw for model.policies too).
    everything = CliRunner().invoke(engines_cli.engines_app, ["build", "--config", str(config)])
    assert everything.exit_code == 0, everything.output
    built = [e.sidecar["model_id"] for e in EngineCache(cfg.engines.cache_dir).entries()]
    assert sorted(built) == ["open_nsfw", "tiny-s3"]
