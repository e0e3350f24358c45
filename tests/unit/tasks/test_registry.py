"""worker.tasks.registry: the task a worker serves, found by name and imported lazily."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from engines.backends.onnxruntime import OrtRunner
from worker.config import WorkerConfig, load_config
from worker.tasks.moderation.models.open_nsfw.engine import engine_plan
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import Answer, ConsumedBatch
from worker.tasks.registry import TASKS, load_entry, make_task
from worker.wire.moderation_codec import decode_result
from worker.wire.records import SourceRecord


def test_every_task_names_a_factory_and_an_engines_build_entry() -> None:
    assert set(TASKS) == {"moderation", "generation"}
    for entry in TASKS.values():
        assert callable(load_entry(entry.factory)) and callable(load_entry(entry.engine_plans))


def test_the_task_name_is_checked_against_the_registry() -> None:
    from worker.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"unknown task 'ocr' \(known: moderation, "
                                          r"generation\)"):
        load_config(processing={"task": "ocr"})


def test_a_moderation_worker_imports_neither_generation_nor_torch_nor_unserved_models(
        tmp_path: Path) -> None:
    # An unserved model's record and settings class are imported (the config validates its
    # section and policies by them); its model, engines and scoring are not.
    code = (
        "import sys\n"
        "from worker.config import load_config\n"
        "from worker.tasks.registry import make_task\n"
        f"task = make_task(load_config(engines={{'cache_dir': {str(tmp_path)!r}}}))\n"
        "print(type(task).__name__, task.topics.jobs)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith("
        "('worker.tasks.generation', 'worker.tasks.moderation.models.text.', "
        "'worker.tasks.moderation.models.clip.')) and not m.endswith('.settings')))\n"
        "task.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    assert out == ["ModerationTask moderation.jobs", "[]"]


@pytest.fixture(scope="module")
def cfg() -> WorkerConfig:
    return load_config(batch={"max_delay_ms": 0})


@pytest.fixture(scope="module")
def runner(cfg: WorkerConfig) -> Iterator[OrtRunner]:
    with OrtRunner(engine_plan(cfg).spec, intra_op_threads=2) as r:
        yield r


def _record(offset: int, **doc: object) -> SourceRecord:
    value = msgpack.packb({"v": 1, **doc}, use_bin_type=True)
    return SourceRecord("moderation.jobs", 0, offset, None, value, None, None)


def _serve(task: ModerationTask, *records: SourceRecord) -> list[Answer]:
    answers = task.admit(ConsumedBatch(records, {("moderation.jobs", 0): 2}, time.monotonic()))
    while task.held():
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
        answers += task.collect(block=True)
    return answers


@pytest.mark.parametrize("ignore_deadlines", [False, True])
def test_the_open_nsfw_path_on_a_shared_runner(cfg: WorkerConfig, runner: OrtRunner,
                                              sample_paths: list[Path],
                                              ignore_deadlines: bool) -> None:
    task = make_task(cfg, ignore_deadlines=ignore_deadlines, runner=runner)
    assert isinstance(task, ModerationTask)
    task.warm_up()
    assert task.ready() and task.engine_hash == runner.engine_hash
    image = sample_paths[0].read_bytes()
    answers = _serve(task, _record(0, id="late", image=image, deadline_ms=1),
                     _record(1, id="text", text="no image here"))
    by_id = {a.job_id or str(a.ref.offset): a for a in answers}
    assert by_id["1"].rejection is not None
    assert by_id["1"].rejection.reason == "nothing_to_score"
    late = by_id["late"]
    assert late.epoch == 2 and late.status == ("ok" if ignore_deadlines else "expired")
    assert decode_result(late.value or b"")["model_id"] == "open_nsfw"
    assert dict(late.headers or [])["ktw.engine"] == runner.engine_hash.encode()
    task.close()
    assert runner.active, "a shared runner stays active after close"
