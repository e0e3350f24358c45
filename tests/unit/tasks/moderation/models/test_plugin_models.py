"""Models by registry: a fake model registered here runs through the moderation task end to
end (admit -> schedule -> collect -> a result on the wire) with no other code touched."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator, Mapping
from typing import Any, ClassVar

import msgpack
import numpy as np
import pytest

from engines.profiles import Profile, RangeProfile
from worker.config import WorkerConfig, load_config
from worker.config.policies import LabelSettings, PolicySettings
from worker.exceptions import ConfigError, TextTooLong
from worker.tasks.batcher import Batch
from worker.tasks.moderation import models as registry
from worker.tasks.moderation.models.base import Finished, ModelContext, ModerationModel
from worker.tasks.moderation.models.package import ModelPackage
from worker.tasks.moderation.parts import JobState, Part, job_text
from worker.tasks.moderation.served_policies import check_runtime
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import Answer, ConsumedBatch, Task
from worker.wire.moderation_codec import decode_result
from worker.wire.moderation_jobs import ModerationJob
from worker.wire.records import SourceRecord

WORDS = RangeProfile("w", (1,), (1,), (1,), min_batch=1, opt_batch=4, max_batch=8)


class FakeModel(ModerationModel):
    """Scores label ``spam`` 1.0 if some word of the text is "spam": one part per word."""

    name = "fake"
    closed: ClassVar[list[str]] = []
    missing: ClassVar[str | None] = None  # a runtime problem to report, for one test

    def __init__(self, policies: Mapping[str, PolicySettings]) -> None:
        self.policies = dict(policies)

    @classmethod
    def runtime_problems(cls, cfg: WorkerConfig, users: str) -> list[str]:
        return [f"policies {users} run fake: {cls.missing}"] if cls.missing else []

    @classmethod
    def create(cls, ctx: ModelContext) -> FakeModel:
        return cls(ctx.policies)

    def feeds(self, job: ModerationJob) -> bool:
        return job_text(job) is not None

    def check(self, job: ModerationJob) -> None:
        if len((job.text or "").split()) > 5:
            raise TextTooLong("over 5 words")

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {"fake_words": (WORDS,)}

    def parts(self, state: JobState) -> list[Part]:
        words = (state.pending.job.text or "").split()
        return [Part(state, self.name, "fake_words", (1,), key=i, payload=w)
                for i, w in enumerate(words)]

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        words = {p.payload for p in batch.items}
        if "bug" in words:  # a model bug some input triggers
            raise TypeError("function takes at most 3 arguments (4 given)")
        if "poison" in words:  # a CUDA error no later call survives
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return [(p, np.float32(p.payload == "spam")) for p in batch.items]

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        assert policy in self.policies
        return {"spam": float(max(values.values()))}

    def identity(self) -> tuple[str, str]:
        return "fake-1", "fake-hash"

    def close(self) -> None:
        self.closed.append(self.name)


FAKE = ModelPackage(name="fake", model=f"{__name__}:FakeModel", describes=True)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(FakeModel, "closed", [])
    registry.register(FAKE)
    try:
        yield
    finally:
        registry.unregister("fake")


# Validated as any policy: once registered, the config knows the model's name.
def _policies() -> dict[str, PolicySettings]:
    return {"promo": PolicySettings(
        models=["fake"], labels={"spam": LabelSettings(descriptions=["spam"], review=0.5,
                                                       block=0.9)})}


def _served(cfg: WorkerConfig, policies: Mapping[str, PolicySettings]) -> ModerationTask:
    from worker.tasks.batched import make_batcher
    from worker.tasks.protocol import TaskTopics

    task = ModerationTask(cfg, policies, registry.make_models(cfg, policies))
    task.serve(TaskTopics("moderation.jobs", "r", "d"),
               {k: make_batcher(cfg.batch, p) for k, p in task.profiles().items()},
               max_message_bytes=cfg.limits.max_message_bytes)
    return task


def _record(offset: int, **doc: Any) -> SourceRecord:
    value = msgpack.packb({"v": 1, "policy": "promo", **doc}, use_bin_type=True)
    return SourceRecord("moderation.jobs", 0, offset, None, value, None, None)


def test_a_registered_model_runs_through_the_task_end_to_end(fake: None) -> None:
    cfg = load_config()
    check_runtime(cfg, _policies())
    task: Task = _served(cfg, _policies())
    assert isinstance(task, ModerationTask) and list(task.models) == ["fake"]
    assert isinstance(task.models["fake"], FakeModel)
    assert task.model_id == "fake_words" and task.engine_hash == "fake-hash"
    records = [_record(0, id="s", text="great deal spam here"),
               _record(1, id="h", text="hello there"),
               _record(2, id="i", image=b"\xff\xd8"),  # fake scores text only
               _record(3, id="long", text="one two three four five six")]
    rejected = task.admit(ConsumedBatch(records, {}, time.monotonic()))
    assert [(a.job_id or a.ref.offset, a.rejection and a.rejection.reason)
            for a in rejected] == [(2, "nothing_to_score"), (3, "text_too_long")]
    answers: list[Answer] = []
    while task.held():
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
        answers += task.collect(block=True)
    by_id = {a.job_id: a for a in answers}
    assert set(by_id) == {"s", "h"}
    spam, ham = (decode_result(by_id[k].value or b"") for k in ("s", "h"))
    assert spam["verdict"] == "block" and spam["rule"] == "block:fake.spam"
    assert spam["scores"] == {"fake.spam": 1.0} and spam["models"] == ["fake"]
    assert (spam["model_id"], spam["engine_hash"]) == ("fake-1", "fake-hash")
    assert ("ktw.model", b"fake-1") in (by_id["s"].headers or [])
    assert ham["verdict"] == "allow" and ham["scores"] == {"fake.spam": 0.0}
    task.close()
    assert FakeModel.closed == ["fake"]


def _answers(task: Task, records: list[SourceRecord]) -> list[Answer]:
    answers = task.admit(ConsumedBatch(records, {}, time.monotonic()))
    while task.held():
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
        answers += task.collect(block=True)
    return answers


def test_a_one_part_job_is_decided_on_its_batch_thread(fake: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # One worker process's rate is its loop thread's: a job of one part (an image under an
    # open_nsfw-only policy, the video-frame case) is decided where its part finished; a job
    # of several parts by the loop, once its last part is in. Both give the same result.
    decided_on: dict[int, str] = {}
    real = FakeModel.scores

    def scores(self: FakeModel, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        decided_on[len(values)] = threading.current_thread().name
        return real(self, policy, values)

    monkeypatch.setattr(FakeModel, "scores", scores)
    task = _served(load_config(), _policies())
    answers = _answers(task, [_record(0, id="one", text="spam"),
                              _record(1, id="four", text="buy spam right now")])
    assert decided_on[1].startswith("batch") and decided_on[4] == threading.main_thread().name
    results = {a.job_id: decode_result(a.value or b"") for a in answers}
    assert results["one"]["verdict"] == results["four"]["verdict"] == "block"
    assert results["one"]["rule"] == results["four"]["rule"] == "block:fake.spam"
    task.close()


def test_a_one_part_job_whose_partition_left_while_it_computed_is_not_answered(
        fake: None, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, go = threading.Event(), threading.Event()
    real = FakeModel.run

    def run(self: FakeModel, kind: str, batch: Batch[Part]) -> list[Finished]:
        entered.set()
        assert go.wait(10)
        return real(self, kind, batch)

    monkeypatch.setattr(FakeModel, "run", run)
    task = _served(load_config(), _policies())
    assert task.admit(ConsumedBatch([_record(0, id="a", text="spam")], {}, time.monotonic())) == []
    task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
    assert entered.wait(10)
    task.remove({("moderation.jobs", 0)})  # its result, made on the batch thread, is dropped
    go.set()
    assert task.collect(block=True) == [] and task.held() == 0
    task.close()


def test_a_model_bug_on_one_job_dead_letters_that_job_only(fake: None) -> None:
    # Before, the exception left the task (collect re-raised it): the worker stopped without
    # committing and met the same record at every restart.
    cfg = load_config(batch={"max_batch_size": 8})
    task = _served(cfg, _policies())
    answers = _answers(task, [_record(0, id="a", text="spam"), _record(1, id="b", text="a bug"),
                              _record(2, id="c", text="hello there")])
    by_offset = {a.ref.offset: a for a in answers}
    assert sorted(by_offset) == [0, 1, 2]
    bad = by_offset[1].rejection
    assert bad is not None and bad.reason == "internal_error"
    assert "TypeError: function takes at most 3 arguments" in str(bad)
    assert by_offset[0].rejection is None and by_offset[2].rejection is None
    assert decode_result(by_offset[0].value or b"")["verdict"] == "block"
    task.close()


def test_a_poisoned_device_still_stops_the_worker(fake: None) -> None:
    # Pinning it on a job would dead-letter every later job as well.
    cfg = load_config()
    task = _served(cfg, _policies())
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _answers(task, [_record(0, id="a", text="poison")])
    task.close()


def test_a_models_runtime_problem_stops_start_up(fake: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeModel, "missing", "no fake hardware")
    with pytest.raises(ConfigError, match="policies 'promo' run fake: no fake hardware"):
        check_runtime(load_config(), _policies())


def test_an_unregistered_model_is_named() -> None:
    with pytest.raises(KeyError, match="'nope'"):
        registry.model_class("nope")
    with pytest.raises(ConfigError, match="unknown model 'fake'"):
        load_config(moderation={"policies": {"promo": {
            "models": ["fake"], "labels": {"spam": {"descriptions": ["spam"]}}}}})


def test_a_registered_model_is_known_to_the_config(fake: None) -> None:
    cfg = load_config(moderation={"policies": {"promo": {
        "models": ["fake"], "labels": {"spam": {"descriptions": ["spam"],
                                                "models": {"fake": {"block": 0.7}}}}}}})
    assert cfg.moderation.policies["promo"].scorers("spam") == ["fake"]
    with pytest.raises(ValueError, match="already registered"):
        registry.register(FAKE)


def test_the_shipped_models_are_registered_lazily() -> None:
    assert list(registry.MODELS) == ["open_nsfw", "text", "clip"]
    for name in registry.MODELS:
        cls = registry.model_class(name)
        assert issubclass(cls, ModerationModel) and cls.name == name
