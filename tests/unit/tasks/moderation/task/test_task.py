"""worker.tasks.moderation.task.ModerationTask with several models: parts batched per engine,
results that wait for every part, driven as the loop drives it (admit, schedule, collect)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator, Mapping
from typing import Any, Literal

import msgpack
import pytest

from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.tasks.batched import make_batcher
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import Finished, ModelContext, ModerationModel
from worker.tasks.moderation.models.text.model import TextModel
from worker.tasks.moderation.parts import JobState, Part
from worker.tasks.moderation.served_policies import effective_policies
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import Answer, ConsumedBatch, Task, TaskTopics
from worker.wire.moderation_codec import decode_result
from worker.wire.moderation_jobs import ModerationJob
from worker.wire.records import SourceRecord

VIOLENT = "He stabbed his neighbour repeatedly with a kitchen knife."
CALM = "Our bakery has fresh croissants every morning."
TOPICS = TaskTopics("moderation.jobs", "moderation.results", "moderation.dlq")


@pytest.fixture(scope="module")
def photo() -> bytes:
    import importlib.resources

    return importlib.resources.files("worker").joinpath("samples", "coffee.png").read_bytes()


def _task(cfg: WorkerConfig, models: Mapping[str, ModerationModel]) -> ModerationTask:
    task = ModerationTask(cfg, effective_policies(cfg), models, own_models=False)
    task.serve(TOPICS, {kind: make_batcher(cfg.batch, profiles)
                        for kind, profiles in task.profiles().items()},
               max_message_bytes=cfg.limits.max_message_bytes)
    return task


@pytest.fixture
def task(mm_cfg: WorkerConfig, models: dict[str, ModerationModel]) -> Iterator[ModerationTask]:
    t = _task(mm_cfg, models)
    yield t
    t.close()


def _record(offset: int, partition: int = 0, **doc: Any) -> SourceRecord:
    value = msgpack.packb({"v": 1, **doc}, use_bin_type=True)
    return SourceRecord("moderation.jobs", partition, offset, None, value, None, None)


def _admit(task: Task, *records: SourceRecord) -> list[Answer]:
    return task.admit(ConsumedBatch(records, {("moderation.jobs", 0): 5}, time.monotonic()))


def _drain(task: Task, *records: SourceRecord) -> dict[str, Answer]:
    answers = _admit(task, *records)
    deadline = time.monotonic() + 120
    while task.held() and time.monotonic() < deadline:
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=4, force=True)
        answers += task.collect(block=True)
    assert task.held() == 0 and task.in_flight() == 0, "jobs left unanswered"
    assert len(answers) == len(records), "every job answered exactly once"
    return {a.job_id or str(a.ref.offset): a for a in answers}


def _doc(a: Answer) -> dict[str, Any]:
    assert a.value is not None and a.rejection is None
    return decode_result(a.value)


def test_image_and_text_job_gets_scores_from_every_path(task: ModerationTask, photo: bytes
                                                        ) -> None:
    doc = _doc(_drain(task, _record(0, id="both", image=photo, text=CALM, policy="ads"))["both"])
    assert doc["status"] == "ok" and doc["verdict"] == "allow" and doc["rule"] == "allow"
    assert doc["models"] == ["open_nsfw", "text", "clip"]
    assert set(doc["scores"]) == {"open_nsfw.sfw", "open_nsfw.nsfw", "text.violence",
                                  "text.scam", "clip.violence", "clip.scam", "clip.neutral",
                                  "clip.consistency"}
    assert doc["scores"]["open_nsfw.nsfw"] < 0.2 and doc["scores"]["text.violence"] < 0.5
    assert doc["model_id"] == "open_nsfw+minilm_l6_v2+clip"
    assert doc["engine_hash"].count("+") == 2 and doc["engine_hash"].startswith("onnxruntime-")
    assert set(doc["timings_ms"]) == {"queue", "infer", "total"}


def test_text_only_and_image_only_jobs_run_what_they_can(task: ModerationTask, photo: bytes
                                                         ) -> None:
    out = _drain(task, _record(1, id="text", text=VIOLENT, policy="ads"),
                 _record(2, id="image", image=photo, policy="ads"),
                 _record(3, id="legacy", image=photo))
    text, image, legacy = (_doc(out[k]) for k in ("text", "image", "legacy"))
    assert text["models"] == ["text"] and text["model_id"] == "minilm_l6_v2"
    assert (text["verdict"], text["rule"]) == ("block", "block:text.violence")
    assert set(text["scores"]) == {"text.violence", "text.scam"}
    assert image["models"] == ["open_nsfw", "clip"] and image["rule"] == "allow"
    assert "clip.consistency" not in image["scores"]
    # With image-and-text policies configured, a model.policies one answers in their form.
    assert legacy["models"] == ["open_nsfw"] and legacy["rule"] == "allow"
    assert set(legacy["scores"]) == {"open_nsfw.sfw", "open_nsfw.nsfw"}


def test_expired_job_is_answered_once_with_no_rule_or_models(task: ModerationTask,
                                                             photo: bytes) -> None:
    a = _drain(task, _record(0, id="late", image=photo, text=CALM, policy="ads",
                             deadline_ms=1))["late"]
    doc = _doc(a)
    assert a.expired and doc["status"] == "expired" and "rule" not in doc and "models" not in doc


def test_long_text_is_chunked_and_its_worst_sentence_decides(task: ModerationTask) -> None:
    text = " ".join([CALM] * 30 + [VIOLENT] + [CALM] * 30)
    doc = _doc(_drain(task, _record(0, id="long", text=text, policy="captions"))["long"])
    assert doc["rule"] == "block:text.violence"


@pytest.mark.parametrize(("job", "reason"), [
    ({"text": CALM, "policy": "nope"}, "unknown_policy"),
    ({"text": CALM, "policy": "default"}, "nothing_to_score"),
    ({"image": b"\xff\xd8", "text": "   ", "policy": "captions"}, "nothing_to_score"),
    ({"image": b"\xff\xd8", "policy": "captions"}, "nothing_to_score"),
])
def test_jobs_that_cannot_be_scored_go_to_the_dlq_at_intake(
        task: ModerationTask, job: dict[str, Any], reason: str) -> None:
    (a,) = _admit(task, _record(0, id="x", **job))
    assert a.rejection is not None and a.rejection.reason == reason and task.held() == 0


def test_too_many_chunks_is_refused(mm_cfg: WorkerConfig, models: dict[str, ModerationModel]
                                   ) -> None:
    text = models["text"]
    assert isinstance(text, TextModel)
    task = _task(mm_cfg, {**models, "text": TextModel(text.engine, text.banks, max_chunks=2)})
    try:
        (a,) = _admit(task, _record(0, id="x", text="One. Two. Three.", policy="captions"))
        assert a.rejection is not None and a.rejection.reason == "text_too_long"
        assert "3 chunks" in str(a.rejection)
    finally:
        task.close()


def test_corrupt_image_dead_letters_the_whole_job_once(task: ModerationTask) -> None:
    a = _drain(task, _record(0, id="bad", image=b"\xff\xd8\xff not a jpeg", text=CALM,
                             policy="ads"))["bad"]
    assert a.rejection is not None and a.rejection.reason == "bad_image" and a.value is None


def test_policies_need_each_of_their_models(mm_cfg: WorkerConfig,
                                            models: dict[str, ModerationModel]) -> None:
    with pytest.raises(ValueError, match="open_nsfw"):
        _task(mm_cfg, {k: m for k, m in models.items() if k != "open_nsfw"})


def test_remove_drops_the_named_partitions_jobs(task: ModerationTask, photo: bytes) -> None:
    _admit(task, _record(0, 0, id="kept", image=photo, text=CALM, policy="ads"),
           _record(1, 1, id="gone", image=photo, text=CALM, policy="ads"))
    assert task.held() == 2
    task.remove({("moderation.jobs", 1)})
    assert task.held() == 1
    answers: list[Answer] = []
    while task.held():
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=4, force=True)
        answers += task.collect(block=True)
    assert [a.job_id for a in answers] == ["kept"]


def test_the_loop_sees_one_task(task: ModerationTask, photo: bytes) -> None:
    served: Task = task
    assert served.topics.jobs == "moderation.jobs" and served.ready()
    assert served.model_id == "clip_image+clip_text+open_nsfw+text"
    assert served.engine_hash.count("+") == 2
    batches: list[tuple[int, str]] = []
    served.on_batch_done = lambda _ms, n, profile, _cap: batches.append((n, profile))
    out = _drain(served, _record(0, id="a", text=VIOLENT, policy="captions"),
                 _record(1, value=None), _record(2, id="n", text=CALM, policy="nope"),
                 _record(3, id="b", image=photo, policy="ads"))
    assert out["1"].rejection is not None and out["1"].rejection.reason == "schema"
    assert out["2"].rejection is not None and out["2"].rejection.reason == "unknown_policy"
    a, b = out["a"], out["b"]
    assert a.epoch == 5 and a.key == b"a" and a.status == "ok"
    assert ("ktw.model", b"minilm_l6_v2") in (a.headers or [])
    assert ("ktw.model", b"open_nsfw+clip") in (b.headers or [])
    assert len(batches) == 3, "every part kind's batch is reported: text, open_nsfw, clip image"


def test_v1_and_v2_jobs_are_each_answered_in_their_version(
        task: ModerationTask, photo: bytes, contract: Any) -> None:
    out = _drain(task, _record(0, id="v1", text=VIOLENT, policy="captions"),
                 _record(1, id="v2", text=VIOLENT, policy="captions", v=2),
                 _record(2, id="late", image=photo, policy="ads", deadline_ms=1, v=2))
    (v1, h1), (v2, h2), (late, h3) = ((_doc(out[k]), dict(out[k].headers or []))
                                      for k in ("v1", "v2", "late"))
    assert h1["ktw.schema"] == b"moderation-result/v1"
    assert h2["ktw.schema"] == h3["ktw.schema"] == b"moderation-result/v2"
    assert contract.errors("moderation-result", v1) == []
    assert contract.errors("moderation-result.v2", v2) == []
    assert contract.errors("moderation-result.v2", late) == []
    # Image-and-text results already had v2's shape in v1: only v differs.
    assert {k: v for k, v in v2.items() if k not in ("v", "id", "source", "timings_ms")} == {
        k: v for k, v in v1.items() if k not in ("v", "id", "source", "timings_ms")}
    assert (late["status"], late["rule"], late["models"], late["scores"]) == (
        "expired", "none", [], {})


class _HeldImages(ModerationModel):
    """open_nsfw's stand-in whose batches finish only when the test says so."""

    name = "open_nsfw"

    def __init__(self, profiles: tuple[Profile, ...]) -> None:
        self._profiles, self.batches = profiles, []
        self.go, self.nsfw = threading.Event(), 0.0

    @classmethod
    def create(cls, ctx: ModelContext) -> ModerationModel:
        raise AssertionError("the tests build this model themselves")

    def feeds(self, job: ModerationJob) -> bool:
        return bool(job.image)

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {"open_nsfw": self._profiles}

    def parts(self, state: JobState) -> list[Part]:
        return [Part(state, self.name, "open_nsfw", (224, 224, 3), key="open_nsfw")]

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        self.batches.append(len(batch.items))
        assert self.go.wait(60)
        return [(p, {"sfw": 1 - self.nsfw, "nsfw": self.nsfw}) for p in batch.items]

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        return dict(values["open_nsfw"])

    def identity(self) -> tuple[str, str]:
        return "open_nsfw", "held"


def test_text_and_image_batches_form_and_finish_independently(
        mm_cfg: WorkerConfig, models: dict[str, ModerationModel], photo: bytes) -> None:
    held = _HeldImages(models["open_nsfw"].profiles()["open_nsfw"])
    task = _task(mm_cfg, {**models, "open_nsfw": held})
    try:
        _admit(task, *(_record(i, id=f"j{i}", image=photo, text=CALM, policy="ads")
                       for i in range(3)), _record(9, id="t", text=VIOLENT, policy="captions"))
        task.schedule(time.monotonic(), int(time.time() * 1e3), free=4, force=True)
        # one batch each: open_nsfw (3 images), text (4 one-sentence texts in bucket 16),
        # CLIP images (3), CLIP captions (3)
        assert task.in_flight() == 4
        done: list[Answer] = []
        for _ in range(500):  # the text-only job needs no image: it finishes on its own
            done += task.collect(block=False)
            if done:
                break
            time.sleep(0.02)
        assert [a.job_id for a in done] == ["t"] and task.held() == 3
        assert held.batches == [3]
        held.nsfw = 0.95
        held.go.set()
        answers = task.collect(block=True)
        assert sorted(a.job_id for a in answers) == ["j0", "j1", "j2"]
        assert {_doc(a)["rule"] for a in answers} == {"block:open_nsfw.nsfw"}
    finally:
        held.go.set()
        task.close()


@pytest.mark.parametrize(("yields", "gpu_priority", "left_free", "preferred"),
                         [(False, True, 0, True), (True, True, 0, False),
                          (False, False, 0, False), (False, True, 16, True),
                          (False, "auto", 0, True), (False, "auto", 16, False),
                          (True, "auto", 0, False)])
def test_beside_a_yielding_task_its_models_ask_for_the_gpu_first(
        mm_cfg: WorkerConfig, models: dict[str, ModerationModel],
        monkeypatch: pytest.MonkeyPatch, yields: bool, gpu_priority: bool | Literal["auto"],
        left_free: int, preferred: bool) -> None:
    """"auto" (the default): the priority only where the yielding task left no SMs free;
    with SMs free it would send moderation's blocks onto generation's SMs first."""
    from worker.tasks.gpu_share import GpuShare

    asked: list[str] = []
    for name, model in models.items():
        monkeypatch.setattr(model, "prefer_gpu", lambda name=name: asked.append(name))
    t = _task(mm_cfg, models)
    share = GpuShare(max_wait_s=0.005, free_sms=16, priority=gpu_priority)
    share.left_free = left_free
    try:
        t.share_gpu(share, yields=yields)
        assert sorted(asked) == (sorted(models) if preferred else [])
        assert t.gpu_share is not None
    finally:
        t.close()


@pytest.mark.parametrize(("disjoint", "left_free", "kept"),
                         [(True, 16, True), (True, 0, False), (False, 16, False)])
def test_with_disjoint_sms_its_models_keep_to_the_sms_generation_left_free(
        mm_cfg: WorkerConfig, models: dict[str, ModerationModel],
        monkeypatch: pytest.MonkeyPatch, disjoint: bool, left_free: int, kept: bool) -> None:
    """Only SMs the yielding task did leave free (its engines could): with none, a model kept
    to them would run on SMs generation also uses, or on a partition nobody else needs."""
    from worker.tasks.gpu_share import GpuShare

    asked: list[tuple[str, int]] = []
    for name, model in models.items():
        monkeypatch.setattr(model, "use_free_sms",
                            lambda sms, name=name: asked.append((name, sms)) or True)
    share = GpuShare(max_wait_s=0.0, free_sms=16, disjoint=disjoint)
    share.left_free = left_free
    t = _task(mm_cfg, models)
    try:
        t.share_gpu(share, yields=False)
        assert sorted(asked) == ([(n, 16) for n in sorted(models)] if kept else [])
    finally:
        t.close()


def test_a_yielding_task_never_keeps_to_the_free_sms(
        mm_cfg: WorkerConfig, models: dict[str, ModerationModel],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.tasks.gpu_share import GpuShare

    asked: list[str] = []
    for name, model in models.items():
        monkeypatch.setattr(model, "use_free_sms", lambda sms, name=name: asked.append(name))
    share = GpuShare(max_wait_s=0.0, free_sms=16, disjoint=True)
    share.left_free = 16
    t = _task(mm_cfg, models)
    try:
        t.share_gpu(share, yields=True)
        assert asked == []
    finally:
        t.close()
