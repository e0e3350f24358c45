"""worker.tasks.moderation.policy_task.PolicyModerationTask: parts batched per engine, results
that wait for every part; and the Task protocol on top (admit a consumed batch, answers)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import msgpack
import pytest

from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.exceptions import ImageRejected, UnknownPolicy
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import ModerationModel
from worker.tasks.moderation.models.open_nsfw import OpenNsfwModel
from worker.tasks.moderation.models.text import TextModel
from worker.tasks.moderation.open_nsfw import Outcome, Pending
from worker.tasks.moderation.policy_task import (
    NothingToScore,
    PolicyModerationTask,
    PolicyOutcome,
    TextTooLong,
)
from worker.tasks.moderation.served_policies import effective_policies
from worker.tasks.protocol import Answer, ConsumedBatch, Task
from worker.wire.moderation_codec import decode_result, result_to_dict
from worker.wire.moderation_jobs import ModerationJob, Status, Verdict
from worker.wire.records import SourceRecord, SourceRef

VIOLENT = "He stabbed his neighbour repeatedly with a kitchen knife."
CALM = "Our bakery has fresh croissants every morning."


@pytest.fixture(scope="module")
def photo() -> bytes:
    import importlib.resources

    return importlib.resources.files("worker").joinpath("samples", "coffee.png").read_bytes()


def _task(cfg: WorkerConfig, models: Mapping[str, ModerationModel]) -> PolicyModerationTask:
    return PolicyModerationTask(cfg, effective_policies(cfg), models, own_models=False)


@pytest.fixture
def task(mm_cfg: WorkerConfig, models: dict[str, ModerationModel]
         ) -> Iterator[PolicyModerationTask]:
    t = _task(mm_cfg, models)
    yield t
    t.close()


def _pending(job_id: str, offset: int = 0, **job: Any) -> Pending:
    record = SourceRecord("moderation.jobs", 0, offset, job_id.encode(), b"<msgpack>", None, None)
    return Pending(SourceRef("moderation.jobs", 0, offset),
                   ModerationJob(id=job_id, image=job.pop("image", None), **job),
                   time.monotonic(), record)


def _drain(task: PolicyModerationTask, *jobs: Pending) -> dict[str, PolicyOutcome]:
    for p in jobs:
        task.check(p.job)
        task.add(p)
    out: list[PolicyOutcome] = []
    deadline = time.monotonic() + 120
    while task.held() and time.monotonic() < deadline:
        out += task.step(time.monotonic(), int(time.time() * 1e3), force=True)
        out += task.finished(block=True)
    assert task.held() == 0, "jobs left unanswered"
    assert len(out) == len(jobs), "every job answered exactly once"
    return {o.pending.job.id: o for o in out}


def test_image_and_text_job_gets_scores_from_every_path(task: PolicyModerationTask, photo: bytes
                                                        ) -> None:
    o = _drain(task, _pending("both", image=photo, text=CALM, policy="ads"))["both"]
    assert o.result is not None and o.decision is not None and o.rejection is None
    r = o.result
    assert r.status is Status.OK and r.verdict is Verdict.ALLOW and o.decision.rule == "allow"
    assert o.decision.models_run == ("open_nsfw", "text", "clip")
    assert set(r.scores) == {"open_nsfw.sfw", "open_nsfw.nsfw", "text.violence", "text.scam",
                             "clip.violence", "clip.scam", "clip.neutral", "clip.consistency"}
    assert r.scores["open_nsfw.nsfw"] < 0.2 and r.scores["text.violence"] < 0.5
    assert r.model_id == "open_nsfw+minilm_l6_v2+clip"
    assert r.rule == "allow" and r.models == ("open_nsfw", "text", "clip")
    assert r.engine_hash.count("+") == 2 and r.engine_hash.startswith("onnxruntime-")
    assert set(r.timings_ms) == {"queue", "infer", "total"}


def test_text_only_and_image_only_jobs_run_what_they_can(task: PolicyModerationTask, photo: bytes
                                                         ) -> None:
    out = _drain(task, _pending("text", 1, text=VIOLENT, policy="ads"),
                 _pending("image", 2, image=photo, policy="ads"),
                 _pending("legacy", 3, image=photo))
    text, image, legacy = (out[k].decision for k in ("text", "image", "legacy"))
    assert text is not None and image is not None and legacy is not None
    assert text.models_run == ("text",)
    assert text.verdict is Verdict.BLOCK and text.rule == "block:text.violence"
    assert image.models_run == ("open_nsfw", "clip") and "clip.consistency" not in (
        image.label_scores)
    assert legacy.models_run == ("open_nsfw",) and legacy.rule == "allow"


def test_text_only_job_result_names_its_rule_and_the_text_model(task: PolicyModerationTask) -> None:
    o = _drain(task, _pending("text", text=VIOLENT, policy="ads"))["text"]
    r = o.result
    assert r is not None and o.rejection is None and r.status is Status.OK
    assert r.models == ("text",)
    assert r.rule == "block:text.violence" and r.verdict is Verdict.BLOCK
    assert r.model_id == "minilm_l6_v2"
    assert set(r.scores) == {"text.violence", "text.scam"}
    doc = result_to_dict(r)
    assert doc["rule"] == "block:text.violence" and doc["models"] == ["text"]


def test_image_only_job_result_lists_the_image_models(task: PolicyModerationTask, photo: bytes
                                                      ) -> None:
    r = _drain(task, _pending("image", image=photo, policy="ads"))["image"].result
    assert r is not None and r.status is Status.OK
    assert r.models == ("open_nsfw", "clip") and r.rule == "allow"


def test_expired_job_carries_no_rule_or_models(task: PolicyModerationTask, photo: bytes) -> None:
    late = _drain(task, _pending("late", image=photo, text=CALM, policy="ads",
                                 deadline_ms=1))["late"].result
    assert late is not None and late.status is Status.EXPIRED
    assert late.rule is None and late.models == ()


def test_rejections_are_the_shared_exception_classes() -> None:
    from worker import exceptions
    from worker.tasks.moderation import policy_task

    assert policy_task.NothingToScore is exceptions.NothingToScore
    assert policy_task.TextTooLong is exceptions.TextTooLong


def test_long_text_is_chunked_and_its_worst_sentence_decides(task: PolicyModerationTask) -> None:
    text = " ".join([CALM] * 30 + [VIOLENT] + [CALM] * 30)
    o = _drain(task, _pending("long", text=text, policy="captions"))["long"]
    assert o.decision is not None and o.decision.rule == "block:text.violence"


class _HeldImages:
    """An image scorer whose batches finish only when the test says so."""

    engine_hash = "held"

    def __init__(self) -> None:
        self.futures: list[tuple[Batch[Pending], Future[list[Outcome]]]] = []

    def warm_up(self) -> None: ...

    def ready(self) -> bool:
        return True

    def close(self) -> None: ...

    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]:
        fut: Future[list[Outcome]] = Future()
        self.futures.append((batch, fut))
        return fut

    def release(self, nsfw: float) -> None:
        from worker.wire.moderation_jobs import ModerationResult

        for batch, fut in self.futures:
            fut.set_result([Outcome(p, result=ModerationResult(
                p.job.id, Status.OK, p.job.policy, "open_nsfw", "fake",
                scores={"sfw": 1 - nsfw, "nsfw": nsfw})) for p in batch.items])


def _with_held_images(models: dict[str, ModerationModel], image_side: tuple[Any, Any]
                      ) -> tuple[dict[str, ModerationModel], _HeldImages]:
    held = _HeldImages()
    profiles: tuple[Profile, ...] = image_side[1].profiles
    return {**models, "open_nsfw": OpenNsfwModel(held, profiles)}, held


def test_result_waits_for_both_halves(mm_cfg: WorkerConfig, models: dict[str, ModerationModel],
                                      image_side: tuple[Any, Any], photo: bytes) -> None:
    with_held, held = _with_held_images(models, image_side)
    task = _task(mm_cfg, with_held)
    try:
        p = _pending("held", image=photo, text=CALM, policy="ads")
        task.check(p.job)
        task.add(p)
        task.step(time.monotonic(), int(time.time() * 1e3), force=True)
        for _ in range(50):  # the text and CLIP halves finish; the image half is held
            assert task.finished(block=False) == []
            time.sleep(0.02)
        assert task.held() == 1 and len(held.futures) == 1
        assert held.futures[0][0].items[0].job.policy == "default"  # OpenNsfwTask's copy
        held.release(nsfw=0.95)
        out = task.finished(block=True)
        assert [o.pending for o in out] == [p]
        assert out[0].decision is not None and out[0].decision.rule == "block:open_nsfw.nsfw"
    finally:
        task.close()


def test_text_and_image_batches_form_independently(mm_cfg: WorkerConfig,
                                                   models: dict[str, ModerationModel],
                                                   image_side: tuple[Any, Any], photo: bytes
                                                   ) -> None:
    with_held, held = _with_held_images(models, image_side)
    task = _task(mm_cfg, with_held)
    try:
        jobs = [_pending(f"j{i}", i, image=photo, text=CALM, policy="ads") for i in range(3)]
        jobs.append(_pending("t", 9, text=VIOLENT, policy="captions"))
        for p in jobs:
            task.add(p)
        task.step(time.monotonic(), int(time.time() * 1e3), force=True)
        # one batch each: open_nsfw (3 images), text (4 one-sentence texts in bucket 16),
        # CLIP images (3), CLIP captions (3)
        assert task.in_flight() == 4
        assert [len(b.items) for b, _ in held.futures] == [3]
        done: list[PolicyOutcome] = []
        for _ in range(500):  # the text-only job needs no image: it finishes on its own
            done += task.finished(block=False)
            if done:
                break
            time.sleep(0.02)
        assert [o.pending.job.id for o in done] == ["t"]
        assert task.held() == 3
        held.release(nsfw=0.01)
        assert sorted(o.pending.job.id for o in task.finished(block=True)) == ["j0", "j1", "j2"]
    finally:
        task.close()


@pytest.mark.parametrize(("job", "error", "reason"), [
    ({"text": CALM, "policy": "nope"}, UnknownPolicy, "unknown_policy"),
    ({"text": CALM, "policy": "default"}, NothingToScore, "nothing_to_score"),
    ({"text": "   ", "policy": "captions"}, NothingToScore, "nothing_to_score"),
    ({"policy": "ads"}, NothingToScore, "nothing_to_score"),
    ({"image": b"\xff\xd8", "policy": "captions"}, NothingToScore, "nothing_to_score"),
])
def test_jobs_that_cannot_be_scored_go_to_the_dlq(task: PolicyModerationTask, job: dict[str, Any],
                                                  error: type[Exception], reason: str) -> None:
    with pytest.raises(error) as info:
        task.check(_pending("x", **job).job)
    assert getattr(info.value, "reason", None) == reason


def test_too_many_chunks_is_refused(mm_cfg: WorkerConfig, models: dict[str, ModerationModel]
                                   ) -> None:
    text = models["text"]
    assert isinstance(text, TextModel)
    task = _task(mm_cfg, {**models, "text": TextModel(text.engine, text.banks, max_chunks=2)})
    try:
        with pytest.raises(TextTooLong, match="3 chunks"):
            task.check(_pending("x", text="One. Two. Three.", policy="captions").job)
    finally:
        task.close()


def test_corrupt_image_dead_letters_the_whole_job_once(task: PolicyModerationTask) -> None:
    o = _drain(task, _pending("bad", image=b"\xff\xd8\xff not a jpeg", text=CALM,
                              policy="ads"))["bad"]
    assert o.result is None and isinstance(o.rejection, ImageRejected)


def test_expired_job_is_answered_once_and_forgotten(task: PolicyModerationTask, photo: bytes
                                                    ) -> None:
    p = _pending("late", image=photo, text=CALM, policy="ads", deadline_ms=1)
    o = _drain(task, p)["late"]
    assert o.result is not None and o.result.status is Status.EXPIRED and o.decision is None


def test_policies_need_a_plug_in_for_each_of_their_models(
        mm_cfg: WorkerConfig, models: dict[str, ModerationModel]) -> None:
    with pytest.raises(ValueError, match="open_nsfw"):
        _task(mm_cfg, {k: m for k, m in models.items() if k != "open_nsfw"})


def test_drop_forgets_queued_jobs(task: PolicyModerationTask, photo: bytes) -> None:
    p = _pending("gone", image=photo, text=CALM, policy="ads")
    task.add(p)
    assert task.drop(lambda q: q.ref.partition == 0) == [p]
    assert task.held() == 0
    assert task.step(time.monotonic(), int(time.time() * 1e3), force=True) == []
    assert task.in_flight() == 0


def test_remove_drops_the_named_partitions_queued_jobs(task: PolicyModerationTask,
                                                       photo: bytes) -> None:
    kept, gone = (_pending(f"p{o}", o, image=photo, text=CALM, policy="ads") for o in (0, 1))
    gone.ref = SourceRef("moderation.jobs", 1, 1)
    task.add(kept)
    task.add(gone)
    task.remove({("moderation.jobs", 1)})
    assert task.held() == 1


# --- the Task protocol -------------------------------------------------------------------------


def _job(**doc: Any) -> bytes:
    return msgpack.packb({"v": 1, **doc}, use_bin_type=True)


def test_the_loop_sees_one_task_admit_schedule_collect(task: PolicyModerationTask,
                                                      photo: bytes) -> None:
    served: Task = task
    assert served.topics.jobs == "moderation.jobs" and served.ready()
    assert served.model_id == "clip_image+clip_text+open_nsfw+text"
    assert served.engine_hash.count("+") == 2
    values = [_job(id="a", text=VIOLENT, policy="captions"), b"\xc1 not msgpack",
              _job(id="n", text=CALM, policy="nope"), _job(id="b", image=photo, policy="ads")]
    records = [SourceRecord("moderation.jobs", 0, off, None, v, None, None)
               for off, v in enumerate(values)]
    rejected = served.admit(ConsumedBatch(records, {("moderation.jobs", 0): 5}, time.monotonic()))
    assert [(a.ref.offset, a.rejection.reason if a.rejection else None, a.epoch)
            for a in rejected] == [(1, "not_msgpack", 5), (2, "unknown_policy", 5)]
    assert served.held() == 2
    answers: list[Answer] = []
    deadline = time.monotonic() + 120
    while served.held() and time.monotonic() < deadline:
        answers += served.schedule(time.monotonic(), int(time.time() * 1e3), free=4, force=True)
        answers += served.collect(block=True)
    assert served.held() == 0 and served.in_flight() == 0
    by_id = {a.job_id: a for a in answers}
    a, b = by_id["a"], by_id["b"]
    assert a.epoch == 5 and a.key == b"a" and a.status == "ok" and a.rejection is None
    assert a.value is not None and b.value is not None
    doc = decode_result(a.value)
    assert doc["rule"] == "block:text.violence" and doc["models"] == ["text"]
    assert ("ktw.model", b"minilm_l6_v2") in (a.headers or [])
    assert decode_result(b.value)["models"] == ["open_nsfw", "clip"]
    assert ("ktw.model", b"open_nsfw+clip") in (b.headers or [])


# --- contract versions: the result follows the job's v ----------------------------------------


def _answer_docs(task: PolicyModerationTask, *jobs: Pending
                 ) -> dict[str, tuple[dict[str, Any], dict[str, bytes]]]:
    """Each job's result as the loop would produce it: the decoded value and the headers."""
    out = {}
    for job_id, o in _drain(task, *jobs).items():
        a = PolicyModerationTask._answer(o)
        assert a.value is not None
        out[job_id] = decode_result(a.value), dict(a.headers or [])  # type: ignore[arg-type]
    return out


def test_v1_and_v2_jobs_are_each_answered_in_their_version(
        task: PolicyModerationTask, photo: bytes, contract: Any) -> None:
    docs = _answer_docs(task, _pending("v1", 0, text=VIOLENT, policy="captions"),
                        _pending("v2", 1, text=VIOLENT, policy="captions", schema_version=2),
                        _pending("late", 2, image=photo, policy="ads", deadline_ms=1,
                                 schema_version=2))
    (v1, h1), (v2, h2), (late, h3) = docs["v1"], docs["v2"], docs["late"]
    assert h1["ktw.schema"] == b"moderation-result/v1"
    assert h2["ktw.schema"] == h3["ktw.schema"] == b"moderation-result/v2"
    assert contract.errors("moderation-result", v1) == []
    assert contract.errors("moderation-result.v2", v2) == []
    assert contract.errors("moderation-result.v2", late) == []
    # Image-and-text results already had v2's shape in v1: only v differs.
    assert {k: v for k, v in v2.items() if k not in ("v", "id", "source", "timings_ms")} == {
        k: v for k, v in v1.items() if k not in ("v", "id", "source", "timings_ms")}
    assert (v1["v"], v2["v"], v2["rule"], v2["models"]) == (1, 2, "block:text.violence",
                                                           ["text"])
    # Not ok: v1 leaves rule and models out, v2 says no rule decided.
    assert (late["status"], late["rule"], late["models"], late["scores"]) == (
        "expired", "none", [], {})


def test_an_open_nsfw_only_policy_answers_v2_as_the_open_nsfw_task_does(
        task: PolicyModerationTask, photo: bytes, contract: Any) -> None:
    """With image-and-text policies configured, the model.policies ones run here: a v2 result
    has the same form as the open_nsfw task's (worker.tasks.moderation.open_nsfw)."""
    (doc, headers), = _answer_docs(task, _pending("legacy", image=photo,
                                                  schema_version=2)).values()
    assert headers["ktw.schema"] == b"moderation-result/v2"
    assert (doc["policy"], doc["rule"], doc["models"]) == ("default", "allow", ["open_nsfw"])
    assert set(doc["scores"]) == {"open_nsfw.sfw", "open_nsfw.nsfw"}
    assert contract.errors("moderation-result.v2", doc) == []
