"""worker.tasks.moderation.open_nsfw.OpenNsfwTask with the real open_nsfw OrtRunner on the CPU."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.backends.base import FutureHandle, InferHandle, Runner
from engines.backends.onnxruntime import OrtRunner
from engines.exceptions import InferenceFailed
from engines.profiles import StaticProfile
from worker.config import WorkerConfig, load_config
from worker.exceptions import (
    ImageRejected,
    JobRejected,
    NothingToScore,
    TaskFailed,
    Transient,
    UnknownPolicy,
)
from worker.tasks.batcher import Batch, DynamicBatcher
from worker.tasks.moderation.engine_setup.open_nsfw import EnginePlan, engine_plan
from worker.tasks.moderation.images.cpu import decode_image, preprocess_open_nsfw
from worker.tasks.moderation.open_nsfw import OpenNsfwTask, Outcome, Pending
from worker.wire.moderation_codec import decode_result, encode_result, result_to_dict
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.records import SourceRecord, SourceRef

CORRUPT = b"\xff\xd8\xff\xe0 this is not really a jpeg"
TIMING_KEYS = {"queue", "decode", "infer", "total"}


@pytest.fixture(scope="module")
def cfg() -> WorkerConfig:
    return load_config(model={"policies": {"strict": {"review": 0.0, "block": 0.9}}})


@pytest.fixture(scope="module")
def plan(cfg: WorkerConfig) -> EnginePlan:
    return engine_plan(cfg)


@pytest.fixture(scope="module")
def runner(plan: EnginePlan) -> Iterator[OrtRunner]:
    with OrtRunner(plan.spec, intra_op_threads=2) as r:
        yield r


@pytest.fixture
def task(cfg: WorkerConfig, runner: OrtRunner, plan: EnginePlan) -> Iterator[OpenNsfwTask]:
    t = OpenNsfwTask(cfg, runner, plan.spec)
    yield t
    t.close()


def _pending(job_id: str, image: bytes | None, offset: int = 0, **job: Any) -> Pending:
    record = SourceRecord(topic="moderation.jobs", partition=1, offset=offset,
                          key=job_id.encode(), value=b"<msgpack>", headers=None,
                          timestamp_ms=1_796_000_000_000)
    return Pending(ref=SourceRef("moderation.jobs", 1, offset),
                   job=ModerationJob(id=job_id, image=image, **job),
                   consumed_at=time.monotonic(), record=record)


def _batch(plan: EnginePlan, items: list[Pending]) -> Batch[Pending]:
    profile = plan.profiles[0]
    return Batch(profile, items, profile.padded(len(items)))


def _run(task: OpenNsfwTask, batch: Batch[Pending]) -> list[Outcome]:
    return task.submit(batch).result(timeout=120)


def _by_id(outcomes: list[Outcome]) -> dict[str, Outcome]:
    return {o.pending.job.id: o for o in outcomes}


@pytest.fixture(scope="module")
def mixed(sample_paths: list[Path]) -> list[Pending]:
    items = [_pending(p.name, p.read_bytes(), offset=k) for k, p in enumerate(sample_paths)]
    items.insert(3, _pending("corrupt", CORRUPT, offset=99))
    return items


@pytest.fixture(scope="module")
def expected_nsfw(
    runner: OrtRunner, cfg: WorkerConfig, sample_paths: list[Path]
) -> dict[str, float]:
    """Each sample scored alone, straight through the runner."""
    out = {}
    for p in sample_paths:
        x = preprocess_open_nsfw(decode_image(p.read_bytes()),
                                 jpeg_roundtrip=cfg.model.jpeg_roundtrip)
        out[p.name] = float(runner.infer({"input:0": x[None]}).result()["outputs"][0, 1])
    return out


# --- a mixed batch ------------------------------------------------------------------------------


def test_mixed_batch_gives_one_outcome_per_job(
    task: OpenNsfwTask, plan: EnginePlan, mixed: list[Pending]
) -> None:
    outcomes = _run(task, _batch(plan, mixed))
    assert len(outcomes) == len(mixed)
    assert sorted(id(o.pending) for o in outcomes) == sorted(id(p) for p in mixed)


def test_corrupt_image_becomes_a_rejection_not_a_result(
    task: OpenNsfwTask, plan: EnginePlan, mixed: list[Pending]
) -> None:
    bad = _by_id(_run(task, _batch(plan, mixed)))["corrupt"]
    assert bad.result is None
    assert isinstance(bad.rejection, ImageRejected)
    assert bad.rejection.reason == "bad_image"
    assert bad.pending.record.offset == 99  # the original record travels to the DLQ


def test_good_images_get_ok_results_with_scores_and_timings(
    task: OpenNsfwTask, plan: EnginePlan, mixed: list[Pending], runner: OrtRunner
) -> None:
    outcomes = _by_id(_run(task, _batch(plan, mixed)))
    good = [p for p in mixed if p.job.id != "corrupt"]
    assert len(good) >= 8
    for p in good:
        o = outcomes[p.job.id]
        assert o.rejection is None and o.result is not None
        r = o.result
        assert r.status is Status.OK
        assert r.verdict is Verdict.ALLOW
        assert set(r.scores) == {"sfw", "nsfw"}
        assert r.scores["sfw"] + r.scores["nsfw"] == pytest.approx(1.0, abs=1e-4)
        assert set(r.timings_ms) == TIMING_KEYS
        assert all(v >= 0 for v in r.timings_ms.values())
        assert r.timings_ms["total"] >= r.timings_ms["infer"]
        assert r.timings_ms["total"] >= r.timings_ms["queue"]
        assert (r.id, r.policy, r.model_id) == (p.job.id, "default", "open_nsfw")
        assert r.engine_hash == runner.engine_hash != ""
        assert r.source == p.ref
        assert r.error is None


def test_each_score_belongs_to_its_own_image(
    task: OpenNsfwTask, plan: EnginePlan, mixed: list[Pending],
    expected_nsfw: dict[str, float],
) -> None:
    """The corrupt job in the middle must not shift the rows of the jobs after it."""
    assert len({round(v, 6) for v in expected_nsfw.values()}) == len(expected_nsfw)
    outcomes = _by_id(_run(task, _batch(plan, mixed)))
    for name, nsfw in expected_nsfw.items():
        result = outcomes[name].result
        assert result is not None
        assert result.scores["nsfw"] == pytest.approx(nsfw, rel=1e-4, abs=1e-6), name


def test_results_satisfy_the_wire_contract(
    task: OpenNsfwTask, plan: EnginePlan, mixed: list[Pending], contract: Any
) -> None:
    for o in _run(task, _batch(plan, mixed)):
        if o.result is not None:
            assert contract.errors("moderation-result", result_to_dict(o.result)) == []


def test_batch_of_only_corrupt_images_gives_only_rejections(
    task: OpenNsfwTask, plan: EnginePlan
) -> None:
    items = [_pending(f"bad{k}", CORRUPT[: 10 + k]) for k in range(3)]
    outcomes = _run(task, _batch(plan, items))
    assert len(outcomes) == 3
    assert all(isinstance(o.rejection, ImageRejected) and o.result is None for o in outcomes)


def test_static_profile_padding_does_not_change_the_scores(
    cfg: WorkerConfig, runner: OrtRunner, plan: EnginePlan, mixed: list[Pending],
    expected_nsfw: dict[str, float],
) -> None:
    items = mixed[:5]  # 4 good + the corrupt one: 4 rows padded to 8
    static = StaticProfile("gpu", plan.spec.inputs[0].shape[1:], (1, 8))
    task = OpenNsfwTask(cfg, runner, plan.spec)
    try:
        outcomes = task.submit(Batch(static, items, 8)).result(timeout=120)
    finally:
        task.close()
    assert len(outcomes) == 5
    for o in outcomes:
        if o.result is not None:
            name = o.pending.job.id
            assert o.result.scores["nsfw"] == pytest.approx(expected_nsfw[name], rel=1e-4,
                                                            abs=1e-6)


# --- policies -----------------------------------------------------------------------------------


def test_each_job_is_judged_under_its_own_policy(
    task: OpenNsfwTask, plan: EnginePlan, sample_paths: list[Path]
) -> None:
    image = sample_paths[0].read_bytes()
    items = [_pending("lenient", image), _pending("strict", image, policy="strict")]
    outcomes = _by_id(_run(task, _batch(plan, items)))
    lenient, strict = outcomes["lenient"].result, outcomes["strict"].result
    assert lenient is not None and strict is not None
    assert lenient.verdict is Verdict.ALLOW
    assert strict.verdict is Verdict.REVIEW  # review threshold 0.0
    assert strict.policy == "strict"
    assert lenient.scores == pytest.approx(strict.scores)


def test_check_policy_refuses_an_unknown_policy(task: OpenNsfwTask) -> None:
    with pytest.raises(UnknownPolicy, match="'nope'") as info:
        task.check_policy(ModerationJob(id="j", image=b"x", policy="nope"))
    assert "default, strict" in str(info.value)
    assert info.value.reason == "unknown_policy"


@pytest.mark.parametrize("policy", ["default", "strict"])
def test_check_policy_accepts_configured_policies(task: OpenNsfwTask, policy: str) -> None:
    task.check_policy(ModerationJob(id="j", image=b"x", policy=policy))


@pytest.mark.parametrize("policy", ["default", "strict"])
def test_check_policy_refuses_a_job_without_an_image(task: OpenNsfwTask, policy: str) -> None:
    with pytest.raises(NothingToScore) as info:
        task.check_policy(ModerationJob(id="j", image=None, text="a caption", policy=policy))
    assert info.value.reason == "nothing_to_score"
    assert isinstance(info.value, JobRejected) and "no image" in str(info.value)


def test_check_policy_names_an_unknown_policy_before_a_missing_image(
    task: OpenNsfwTask,
) -> None:
    with pytest.raises(UnknownPolicy):
        task.check_policy(ModerationJob(id="j", image=None, text="a caption", policy="nope"))


def test_an_image_less_job_in_a_batch_is_rejected_and_the_others_scored(
    task: OpenNsfwTask, plan: EnginePlan, sample_paths: list[Path]
) -> None:
    """check_policy keeps these out; should one get in, it is dead-lettered, not a crash."""
    items = [_pending("text-only", None, 0, text="a caption"),
             _pending("photo", sample_paths[0].read_bytes(), 1)]
    outcomes = _by_id(_run(task, _batch(plan, items)))
    rejected, photo = outcomes["text-only"], outcomes["photo"]
    assert isinstance(rejected.rejection, NothingToScore) and rejected.result is None
    assert photo.result is not None and photo.result.status is Status.OK
    # open_nsfw-only results carry no rule or model list: they keep the v1 shape
    assert photo.result.rule is None and photo.result.models == ()
    assert not {"rule", "models"} & set(result_to_dict(photo.result))


# --- contract versions: the result follows the job's v ----------------------------------------


def test_v1_and_v2_jobs_in_one_batch_are_each_answered_in_their_version(
    task: OpenNsfwTask, plan: EnginePlan, sample_paths: list[Path], contract: Any
) -> None:
    image = sample_paths[0].read_bytes()
    items = [_pending("v1", image, 0), _pending("v2", image, 1, schema_version=2)]
    outcomes = _by_id(_run(task, _batch(plan, items)))
    (v1_value, v1_headers), (v2_value, v2_headers) = (
        task.encode(outcomes[k].result) for k in ("v1", "v2"))  # type: ignore[arg-type]
    assert ("ktw.schema", b"moderation-result/v1") in v1_headers
    assert ("ktw.schema", b"moderation-result/v2") in v2_headers
    v1, v2 = decode_result(v1_value), decode_result(v2_value)
    assert contract.errors("moderation-result", v1) == []
    assert contract.errors("moderation-result.v2", v2) == []
    # v1: open_nsfw's plain labels, no rule or models, exactly as before v2 existed.
    assert v1["v"] == 1 and set(v1["scores"]) == {"sfw", "nsfw"}
    assert not {"rule", "models"} & set(v1)
    assert v1_value == encode_result(outcomes["v1"].result)  # type: ignore[arg-type]
    # v2: the image-and-text form, the same scores.
    assert (v2["v"], v2["rule"], v2["models"], v2["verdict"]) == (2, "allow", ["open_nsfw"],
                                                                  "allow")
    assert v2["scores"] == {f"open_nsfw.{k}": v for k, v in v1["scores"].items()}
    assert {k: v for k, v in v2.items() if k not in ("v", "id", "scores", "source", "rule",
                                                     "models", "timings_ms")} == {
        k: v for k, v in v1.items() if k not in ("v", "id", "scores", "source", "timings_ms")}


def test_encoding_a_v2_result_leaves_the_result_as_the_plug_in_reads_it(
    task: OpenNsfwTask, plan: EnginePlan, sample_paths: list[Path]
) -> None:
    """The image-and-text task's open_nsfw plug-in reads this task's results' plain labels."""
    p = _pending("v2", sample_paths[0].read_bytes(), schema_version=2)
    result = _by_id(_run(task, _batch(plan, [p])))["v2"].result
    assert result is not None and result.schema_version == 2
    task.encode(result)
    assert set(result.scores) == {"sfw", "nsfw"} and result.rule is None and not result.models


@pytest.mark.parametrize(("verdict", "rule"), [(Verdict.BLOCK, "block:open_nsfw.nsfw"),
                                               (Verdict.REVIEW, "review:open_nsfw.nsfw"),
                                               (Verdict.ALLOW, "allow")])
def test_a_v2_verdict_names_the_rule_that_decided_it(
    task: OpenNsfwTask, contract: Any, verdict: Verdict, rule: str
) -> None:
    result = ModerationResult("j", Status.OK, "default", "open_nsfw", "e", verdict=verdict,
                              scores={"sfw": 0.5, "nsfw": 0.5}, schema_version=2)
    doc = decode_result(task.encode(result)[0])
    assert (doc["rule"], doc["models"]) == (rule, ["open_nsfw"])
    assert contract.errors("moderation-result.v2", doc) == []


def test_a_v2_job_past_its_deadline_is_answered_with_rule_none(
    task: OpenNsfwTask, contract: Any
) -> None:
    p = _pending("late", b"unused", deadline_ms=1_796_000_000_000, schema_version=2)
    value, headers = task.encode(task.expired_result(p, 1_796_000_000_250))
    doc = decode_result(value)
    assert ("ktw.schema", b"moderation-result/v2") in headers
    assert (doc["v"], doc["status"], doc["rule"], doc["models"], doc["scores"]) == (
        2, "expired", "none", [], {})
    assert contract.errors("moderation-result.v2", doc) == []


# --- deadlines ----------------------------------------------------------------------------------


def test_expired_result_for_a_past_deadline(
    task: OpenNsfwTask, contract: Any, runner: OrtRunner
) -> None:
    now_ms = 1_796_000_000_250
    p = _pending("late", b"unused", deadline_ms=1_796_000_000_000)
    result = task.expired_result(p, now_ms)
    assert result.status is Status.EXPIRED
    assert result.verdict is None and result.scores == {}
    assert result.error is not None and "deadline 1796000000000" in result.error
    assert "250 ms" in result.error
    assert set(result.timings_ms) == {"queue", "total"}
    assert all(v >= 0 for v in result.timings_ms.values())
    assert result.source == p.ref and result.engine_hash == runner.engine_hash
    assert contract.errors("moderation-result", result_to_dict(result)) == []


def test_batcher_and_task_expire_only_past_deadlines(
    task: OpenNsfwTask, plan: EnginePlan, sample_paths: list[Path]
) -> None:
    """The batcher decides expiry (the task answers for it); a future deadline is scored."""
    image = sample_paths[0].read_bytes()
    now_ms = int(time.time() * 1e3)
    batcher: DynamicBatcher[Pending] = DynamicBatcher(plan.profiles, max_batch_size=8,
                                                      max_delay_s=0.0)
    late = _pending("late", image, deadline_ms=now_ms - 1)
    fresh = _pending("fresh", image, deadline_ms=now_ms + 60_000)
    none = _pending("none", image)
    for p in (late, fresh, none):
        batcher.add(p)
    due = batcher.schedule(time.monotonic(), now_ms, limit=4)
    assert due.expired == [late]
    assert task.expired_result(late, now_ms).status is Status.EXPIRED
    outcomes = [o for b in due.batches for o in _run(task, b)]
    assert {o.pending.job.id: o.result.status for o in outcomes if o.result} == {
        "fresh": Status.OK, "none": Status.OK}


def test_pending_exposes_what_the_batcher_needs(plan: EnginePlan) -> None:
    p = _pending("j", b"x", offset=5, deadline_ms=123)
    assert p.deadline_ms == 123
    assert p.partition_key == ("moderation.jobs", 1)
    assert p.item_shape == tuple(plan.spec.inputs[0].shape[1:]) == (224, 224, 3)


# --- engine failure -----------------------------------------------------------------------------


def test_an_engine_failing_every_row_is_an_outage_not_an_answer(
    cfg: WorkerConfig, plan: EnginePlan, mixed: list[Pending]
) -> None:
    """Every row failing alone pins nothing on a job: the batch raises Transient (it waits and
    runs again, worker.tasks.batched), where every job used to be answered ``status: error``
    and committed (a consumer failing open then published unmoderated content)."""
    with _ScriptedRunner(lambda x: "device lost") as failing:
        task = OpenNsfwTask(cfg, failing, plan.spec)
        try:
            with pytest.raises(Transient, match=r"every row.*device lost"):
                task.submit(_batch(plan, mixed)).result(timeout=120)
        finally:
            task.close()


def _nsfw_of(runner: OrtRunner, plan: EnginePlan, img: Any) -> float:
    x = preprocess_open_nsfw(img)[None]
    profile = plan.profiles[0]
    x = np.concatenate([x] * profile.padded(1))
    out = runner.infer({plan.spec.inputs[0].name: x}).result()
    return float(out[plan.spec.outputs[0].name][0][1])


def test_a_picture_hidden_in_the_alpha_channel_is_scored_as_shown(
        task: OpenNsfwTask, runner: OrtRunner, plan: EnginePlan) -> None:
    """RGB all black, the picture in the alpha channel: a white page shows it. Scoring
    the RGB alone (alpha dropped) sees a black square; the job must score its worst view."""
    import io

    from PIL import Image

    # A picture the model scores well above a black square (a vertical grey ramp: ~0.38 vs
    # ~0.07 nsfw with the bundled weights); any such picture makes the point.
    picture = Image.fromarray(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 256, 1))
    alpha = Image.eval(picture, lambda v: 255 - v)  # on white this shows the picture
    rgba = Image.merge("RGBA", (*Image.new("RGB", (256, 256)).split(), alpha))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    (outcome,) = _run(task, _batch(plan, [_pending("alpha", buf.getvalue())]))
    assert outcome.result is not None
    got = outcome.result.scores["nsfw"]
    white = Image.alpha_composite(Image.new("RGBA", (256, 256), (255,) * 4), rgba)
    on_white = _nsfw_of(runner, plan, white.convert("RGB"))
    alpha_dropped = _nsfw_of(runner, plan, rgba.convert("RGB"))  # what was scored before
    assert abs(on_white - alpha_dropped) > 1e-3  # the views really differ
    assert on_white > alpha_dropped  # (so scoring the RGB alone under-scores it)
    assert got == pytest.approx(on_white, abs=1e-5)


def test_an_animation_scores_its_worst_sampled_frame_in_chunked_engine_calls(
        task: OpenNsfwTask, runner: OrtRunner, plan: EnginePlan) -> None:
    """Frames after the first count (before: the first frame only), and a full batch of
    animations (up to MAX_SAMPLED_FRAMES rows each) runs in several engine calls."""
    import io

    from PIL import Image

    black = Image.new("RGB", (64, 64))
    ramp = Image.fromarray(np.repeat(np.arange(0, 256, 4, dtype=np.uint8)[:, None], 64, 1))
    frames = [black, black, ramp.convert("RGB"), black, black, black, black, black]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    worst = _nsfw_of(runner, plan, frames[2])
    assert worst > _nsfw_of(runner, plan, black) + 0.05
    profile = plan.profiles[0]
    n = profile.max_batch
    outcomes = _run(task, Batch(profile, [_pending(f"anim-{k}", buf.getvalue(), offset=k)
                                          for k in range(n)], profile.padded(n)))
    assert len(outcomes) == n
    for o in outcomes:
        assert o.result is not None
        assert o.result.scores["nsfw"] == pytest.approx(worst, abs=1e-5)


class _ScriptedRunner(Runner):
    """Scores a row by its mean; fails as ``fail(batch)`` says (None: succeed)."""

    backend = "scripted"

    def __init__(self, fail: Any) -> None:
        super().__init__()
        self.fail, self.calls = fail, []

    @property
    def engine_hash(self) -> str:
        return "scripted-0"

    def _activate(self) -> None:
        self.calls.clear()  # each activation counts its own engine calls

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        x = next(iter(feeds.values()))
        self.calls.append(len(x))
        fut: Future[dict[str, np.ndarray]] = Future()
        why = self.fail(x)
        if why is not None:
            fut.set_exception(InferenceFailed(why))
        else:
            nsfw = (x.reshape(len(x), -1).mean(axis=1) + 200.0) / 400.0
            fut.set_result({"outputs": np.stack([1 - nsfw, nsfw], axis=1).astype(np.float32)})
        return FutureHandle(fut)

    def _deactivate(self) -> None:
        self.fail = None  # an inactive runner answers nothing (infer() refuses before this)


def _images(sample_paths: list[Path], n: int) -> list[Pending]:
    return [_pending(f"j{k}", sample_paths[k % len(sample_paths)].read_bytes(), offset=k)
            for k in range(n)]


def _outcomes(cfg: WorkerConfig, runner: _ScriptedRunner, plan: EnginePlan,
              items: list[Pending]) -> list[Outcome]:
    """``items`` as one batch through an OpenNsfwTask on ``runner`` (activated for it)."""
    with runner:
        task = OpenNsfwTask(cfg, runner, plan.spec)
        try:
            return _run(task, _batch(plan, items))
        finally:
            task.close()


def test_a_batch_that_runs_out_of_memory_is_split_until_it_fits(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    """Before: the whole batch was answered ``error``."""
    oom = _ScriptedRunner(lambda x: "CUDA out of memory. Tried to allocate 2.00 GiB"
                          if len(x) > 2 else None)
    outcomes = _outcomes(cfg, oom, plan, _images(sample_paths, 7))
    assert [o.result.status for o in outcomes if o.result] == [Status.OK] * 7
    assert max(oom.calls) == 7 and min(oom.calls) <= 2
    # The scores are those of each job's own row, not of a neighbour's.
    assert len({o.result.scores["nsfw"] for o in outcomes if o.result}) > 1


def test_only_the_job_whose_row_keeps_failing_is_dead_lettered(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    items = _images(sample_paths, 6)
    with _ScriptedRunner(lambda x: None) as probe:
        poison = OpenNsfwTask(cfg, probe, plan.spec)._prepare(items[4])
    assert isinstance(poison, np.ndarray)
    bad = _ScriptedRunner(lambda x: "kernel failed on this input"
                          if any(np.array_equal(r, poison[0]) for r in x) else None)
    outcomes = _outcomes(cfg, bad, plan, items)
    status = {o.pending.job.id: o.result.status for o in outcomes if o.result}
    assert "j4" not in status and set(status.values()) == {Status.OK}
    [failed] = [o for o in outcomes if o.result is None]
    assert failed.pending.job.id == "j4" and isinstance(failed.rejection, TaskFailed)
    assert "kernel failed on this input" in str(failed.rejection)


def test_a_sticky_cuda_error_stops_the_batch_instead_of_answering_it(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    """An illegal address poisons the context: answering jobs ``error`` would commit them;
    the batch fails, which stops the worker without committing."""
    sticky = _ScriptedRunner(lambda x: "CUDA error: an illegal memory access was encountered")
    with pytest.raises(InferenceFailed, match="illegal memory access"):
        _outcomes(cfg, sticky, plan, _images(sample_paths, 3))
    assert sticky.calls == [3]  # not split: it cannot help
