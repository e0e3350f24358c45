"""open_nsfw with the real OrtRunner on the CPU: the model on batches of parts
(worker.tasks.moderation.models.open_nsfw.model), and policies that run it alone through the
moderation task, driven as the loop drives it (admit, schedule, collect)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from engines.backends.base import FutureHandle, InferHandle, Runner
from engines.backends.onnxruntime import OrtRunner
from engines.backends.registry import BACKENDS
from engines.exceptions import InferenceFailed
from engines.profiles import StaticProfile
from tests.unit.tasks.moderation.parts_support import Scored, image_part, run_batch
from worker.config import WorkerConfig, load_config
from worker.exceptions import ImageRejected
from worker.tasks import batched
from worker.tasks.batcher import Batch
from worker.tasks.moderation.factory import moderation_task
from worker.tasks.moderation.images.cpu import decode_image
from worker.tasks.moderation.models.base import ModelContext
from worker.tasks.moderation.models.open_nsfw.engine import EnginePlan, engine_plan
from worker.tasks.moderation.models.open_nsfw.model import OpenNsfwModel
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw
from worker.tasks.moderation.parts import Part
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import Answer, ConsumedBatch
from worker.wire.moderation_codec import decode_result
from worker.wire.records import SourceRecord

CORRUPT = b"\xff\xd8\xff\xe0 this is not really a jpeg"
TIMING_KEYS = {"queue", "decode", "infer", "total"}


@pytest.fixture(scope="module")
def cfg() -> WorkerConfig:
    return load_config(model={"policies": {"strict": {"review": 0.0, "block": 0.9}}},
                       batch={"max_delay_ms": 0})


@pytest.fixture(scope="module")
def plan(cfg: WorkerConfig) -> EnginePlan:
    return engine_plan(cfg)


@pytest.fixture(scope="module")
def runner(plan: EnginePlan) -> Iterator[OrtRunner]:
    with OrtRunner(plan.spec, intra_op_threads=2) as r:
        yield r


@pytest.fixture
def model(cfg: WorkerConfig, runner: OrtRunner, plan: EnginePlan) -> Iterator[OpenNsfwModel]:
    m = OpenNsfwModel(cfg, runner, plan.spec, plan.profiles)
    yield m
    m.close()


@pytest.fixture
def task(cfg: WorkerConfig, runner: OrtRunner) -> Iterator[ModerationTask]:
    t = moderation_task(cfg, runner=runner)
    yield t
    t.close()


def _batch(plan: EnginePlan, parts: list[Part]) -> Batch[Part]:
    profile = plan.profiles[0]
    return Batch(profile, parts, profile.padded(len(parts)))


def _by_id(scored: list[Scored]) -> dict[str, Scored]:
    return {s.job_id: s for s in scored}


@pytest.fixture(scope="module")
def mixed(sample_paths: list[Path]) -> list[tuple[str, bytes]]:
    items = [(p.name, p.read_bytes()) for p in sample_paths]
    items.insert(3, ("corrupt", CORRUPT))
    return items


def _parts(items: list[tuple[str, bytes]]) -> list[Part]:
    return [image_part(name, image, k) for k, (name, image) in enumerate(items)]


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


# --- the model on a batch of parts -------------------------------------------------------------


def test_a_mixed_batch_gives_each_part_its_own_scores_or_rejection(
    model: OpenNsfwModel, plan: EnginePlan, mixed: list[tuple[str, bytes]],
    expected_nsfw: dict[str, float],
) -> None:
    """The corrupt job in the middle must not shift the rows of the jobs after it."""
    scored = _by_id(run_batch(model, _batch(plan, _parts(mixed))))
    assert len(scored) == len(mixed)
    bad = scored.pop("corrupt")
    assert bad.scores is None and isinstance(bad.rejection, ImageRejected)
    assert bad.rejection.reason == "bad_image"
    assert len({round(v, 6) for v in expected_nsfw.values()}) == len(expected_nsfw)
    for name, nsfw in expected_nsfw.items():
        s = scored[name].scores
        assert s is not None and set(s) == {"sfw", "nsfw"}
        assert s["sfw"] + s["nsfw"] == pytest.approx(1.0, abs=1e-4)
        assert s["nsfw"] == pytest.approx(nsfw, rel=1e-4, abs=1e-6), name


def test_a_batch_of_only_corrupt_images_gives_only_rejections(
    model: OpenNsfwModel, plan: EnginePlan
) -> None:
    parts = [image_part(f"bad{k}", CORRUPT[: 10 + k], k) for k in range(3)]
    scored = run_batch(model, _batch(plan, parts))
    assert all(isinstance(s.rejection, ImageRejected) and s.scores is None for s in scored)


def test_static_profile_padding_does_not_change_the_scores(
    model: OpenNsfwModel, plan: EnginePlan, mixed: list[tuple[str, bytes]],
    expected_nsfw: dict[str, float],
) -> None:
    parts = _parts(mixed[:5])  # 4 good + the corrupt one: 4 rows padded to 8
    static = StaticProfile("gpu", plan.spec.inputs[0].shape[1:], (1, 8))
    for s in run_batch(model, Batch(static, parts, 8)):
        if s.scores is not None:
            assert s.scores["nsfw"] == pytest.approx(expected_nsfw[s.job_id], rel=1e-4,
                                                     abs=1e-6)


def _nsfw_of(runner: OrtRunner, plan: EnginePlan, img: Any) -> float:
    x = preprocess_open_nsfw(img)[None]
    profile = plan.profiles[0]
    x = np.concatenate([x] * profile.padded(1))
    out = runner.infer({plan.spec.inputs[0].name: x}).result()
    return float(out[plan.spec.outputs[0].name][0][1])


def test_a_picture_hidden_in_the_alpha_channel_is_scored_as_shown(
        model: OpenNsfwModel, runner: OrtRunner, plan: EnginePlan) -> None:
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
    (s,) = run_batch(model, _batch(plan, [image_part("alpha", buf.getvalue())]))
    assert s.scores is not None
    white = Image.alpha_composite(Image.new("RGBA", (256, 256), (255,) * 4), rgba)
    on_white = _nsfw_of(runner, plan, white.convert("RGB"))
    alpha_dropped = _nsfw_of(runner, plan, rgba.convert("RGB"))  # what was scored before
    assert abs(on_white - alpha_dropped) > 1e-3  # the views really differ
    assert on_white > alpha_dropped  # (so scoring the RGB alone under-scores it)
    assert s.scores["nsfw"] == pytest.approx(on_white, abs=1e-5)


def test_an_animation_scores_its_worst_sampled_frame_in_chunked_engine_calls(
        model: OpenNsfwModel, runner: OrtRunner, plan: EnginePlan) -> None:
    """Frames after the first count, and a full batch of animations (up to MAX_SAMPLED_FRAMES
    rows each) runs in several engine calls."""
    import io

    from PIL import Image

    black = Image.new("RGB", (64, 64))
    ramp = Image.fromarray(np.repeat(np.arange(0, 256, 4, dtype=np.uint8)[:, None], 64, 1))
    frames = [black, black, ramp.convert("RGB"), black, black, black, black, black]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    worst = _nsfw_of(runner, plan, frames[2])
    assert worst > _nsfw_of(runner, plan, black) + 0.05
    n = plan.profiles[0].max_batch
    scored = run_batch(model, _batch(plan, [image_part(f"anim-{k}", buf.getvalue(), k)
                                            for k in range(n)]))
    assert len(scored) == n
    for s in scored:
        assert s.scores is not None and s.scores["nsfw"] == pytest.approx(worst, abs=1e-5)


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


@pytest.mark.parametrize(("pipelined", "registered"), [(True, True), (False, True),
                                                       (False, False)])
def test_the_pipeline_model_is_picked_by_the_runner_s_backend_record(
        cfg: WorkerConfig, monkeypatch: pytest.MonkeyPatch, pipelined: bool,
        registered: bool) -> None:
    """The runner's backend record says whether its runner drives the pixel pipeline; a runner
    of a backend the registry does not know (a stand-in) takes the plain path."""
    from worker.tasks.moderation.models.open_nsfw import gpu

    class Pipelined(OpenNsfwModel):
        """Stands in for the GPU pipeline model (which needs torch)."""

    monkeypatch.setattr(gpu, "OpenNsfwGpuModel", Pipelined)
    if registered:
        monkeypatch.setitem(BACKENDS, "scripted", dataclasses.replace(
            BACKENDS["onnxruntime"], name="scripted", pipelined=pipelined))
    with _ScriptedRunner(lambda x: None) as runner:
        model = OpenNsfwModel.create(ModelContext(cfg, {}, runner))
        model.close()
        assert model.runner is runner and runner.active  # shared: left as it was
    assert type(model) is (Pipelined if pipelined else OpenNsfwModel)


def _images(sample_paths: list[Path], n: int) -> list[tuple[str, bytes]]:
    return [(f"j{k}", sample_paths[k % len(sample_paths)].read_bytes()) for k in range(n)]


def test_an_engine_call_out_of_memory_is_halved_until_it_fits(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    """A smaller call needs less memory: the model fits its calls, no job is answered for it."""
    oom = _ScriptedRunner(lambda x: "CUDA out of memory. Tried to allocate 2.00 GiB"
                          if len(x) > 2 else None)
    with oom:
        m = OpenNsfwModel(cfg, oom, plan.spec, plan.profiles)
        try:
            scored = run_batch(m, _batch(plan, _parts(_images(sample_paths, 7))))
        finally:
            m.close()
    assert all(s.scores is not None for s in scored)
    assert max(oom.calls) == 7 and min(oom.calls) <= 2
    assert len({s.scores["nsfw"] for s in scored if s.scores}) > 1  # each its own row


def test_a_failing_engine_call_fails_the_batch_instead_of_answering_it(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    """The model answers nothing it could not score (before: ``status: error``, which a
    consumer failing open published unmoderated): the batch fails, for the task to isolate."""
    with _ScriptedRunner(lambda x: "kernel failed") as failing:
        m = OpenNsfwModel(cfg, failing, plan.spec, plan.profiles)
        try:
            with pytest.raises(InferenceFailed, match="kernel failed"):
                run_batch(m, _batch(plan, _parts(_images(sample_paths, 3))))
        finally:
            m.close()


# --- open_nsfw-only policies through the task --------------------------------------------------


def _record(offset: int, partition: int = 0, **doc: Any) -> SourceRecord:
    value = msgpack.packb({"v": 1, **doc}, use_bin_type=True)
    return SourceRecord("moderation.jobs", partition, offset, None, value, None, None)


def _serve(task: Any, *records: SourceRecord, rounds: int = 200) -> list[Answer]:
    answers: list[Answer] = task.admit(ConsumedBatch(records, {("moderation.jobs", 0): 3},
                                                     time.monotonic()))
    for _ in range(rounds):
        if not task.held():
            break
        answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2, force=True)
        answers += task.collect(block=True)
    assert task.held() == 0, "every job answered"
    return answers


def _docs(answers: list[Answer]) -> dict[str, dict[str, Any]]:
    return {a.job_id: decode_result(a.value) for a in answers if a.value is not None}


def test_an_open_nsfw_only_worker_answers_v1_jobs_in_its_form(
    task: ModerationTask, runner: OrtRunner, sample_paths: list[Path], contract: Any,
    expected_nsfw: dict[str, float],
) -> None:
    name = sample_paths[0].name
    answers = _serve(task, _record(0, id="j", image=sample_paths[0].read_bytes()))
    (a,) = answers
    doc = decode_result(a.value or b"")
    assert contract.errors("moderation-result", doc) == []
    assert (doc["id"], doc["status"], doc["policy"], doc["model_id"], doc["verdict"]) == (
        "j", "ok", "default", "open_nsfw", "allow")
    assert list(doc["scores"]) == ["sfw", "nsfw"] and not {"rule", "models"} & set(doc)
    assert doc["scores"]["nsfw"] == pytest.approx(expected_nsfw[name], rel=1e-4, abs=1e-6)
    assert set(doc["timings_ms"]) == TIMING_KEYS
    assert doc["timings_ms"]["total"] >= doc["timings_ms"]["infer"]
    assert doc["engine_hash"] == runner.engine_hash != ""
    assert doc["source"] == {"topic": "moderation.jobs", "partition": 0, "offset": 0}
    assert dict(a.headers or [])["ktw.schema"] == b"moderation-result/v1"
    assert a.epoch == 3 and a.key == b"j" and a.status == "ok"


def test_each_job_is_judged_under_its_own_policy(
    task: ModerationTask, sample_paths: list[Path]
) -> None:
    image = sample_paths[0].read_bytes()
    docs = _docs(_serve(task, _record(0, id="lenient", image=image),
                        _record(1, id="strict", image=image, policy="strict")))
    assert docs["lenient"]["verdict"] == "allow"
    assert docs["strict"]["verdict"] == "review"  # review threshold 0.0
    assert docs["strict"]["policy"] == "strict"
    assert docs["lenient"]["scores"] == pytest.approx(docs["strict"]["scores"])


@pytest.mark.parametrize(("doc", "reason", "says"), [
    ({"image": b"x", "policy": "nope"}, "unknown_policy", "(known: default, strict)"),
    ({"text": "a caption", "policy": "nope"}, "unknown_policy", "'nope'"),
    ({"text": "a caption"}, "nothing_to_score", "no image"),
    ({"text": "a caption", "policy": "strict"}, "nothing_to_score", "no image"),
])
def test_jobs_an_open_nsfw_only_policy_cannot_score_go_to_the_dlq(
        task: ModerationTask, doc: dict[str, Any], reason: str, says: str) -> None:
    (a,) = _serve(task, _record(0, id="x", **doc))
    assert a.rejection is not None and a.rejection.reason == reason
    assert says in str(a.rejection) and a.value is None


def test_corrupt_images_are_dead_lettered_and_the_others_scored(
    task: ModerationTask, mixed: list[tuple[str, bytes]]
) -> None:
    answers = _serve(task, *(_record(k, id=name, image=image)
                             for k, (name, image) in enumerate(mixed)))
    assert len(answers) == len(mixed)
    by_offset = {a.ref.offset: a for a in answers}
    bad = by_offset[3]  # the original record travels to the DLQ
    assert isinstance(bad.rejection, ImageRejected) and bad.rejection.reason == "bad_image"
    assert all(a.status == "ok" for k, a in by_offset.items() if k != 3)


def test_v1_and_v2_jobs_are_each_answered_in_their_version(
    task: ModerationTask, sample_paths: list[Path], contract: Any
) -> None:
    image = sample_paths[0].read_bytes()
    answers = _serve(task, _record(0, id="v1", image=image),
                     _record(1, id="v2", image=image, v=2))
    by_id = {a.job_id: a for a in answers}
    assert dict(by_id["v1"].headers or [])["ktw.schema"] == b"moderation-result/v1"
    assert dict(by_id["v2"].headers or [])["ktw.schema"] == b"moderation-result/v2"
    v1, v2 = decode_result(by_id["v1"].value or b""), decode_result(by_id["v2"].value or b"")
    assert contract.errors("moderation-result", v1) == []
    assert contract.errors("moderation-result.v2", v2) == []
    assert v1["v"] == 1 and set(v1["scores"]) == {"sfw", "nsfw"}
    assert not {"rule", "models"} & set(v1)
    assert (v2["v"], v2["rule"], v2["models"], v2["verdict"]) == (2, "allow", ["open_nsfw"],
                                                                  "allow")
    assert v2["scores"] == {f"open_nsfw.{k}": v for k, v in v1["scores"].items()}
    assert {k: v for k, v in v2.items() if k not in ("v", "id", "scores", "source", "rule",
                                                     "models", "timings_ms")} == {
        k: v for k, v in v1.items() if k not in ("v", "id", "scores", "source", "timings_ms")}


@pytest.mark.parametrize(("policy", "rule"), [("strict", "review:open_nsfw.nsfw"),
                                              ("default", "allow")])
def test_a_v2_verdict_names_the_rule_that_decided_it(
        task: ModerationTask, sample_paths: list[Path], contract: Any, policy: str,
        rule: str) -> None:
    (a,) = _serve(task, _record(0, id="j", image=sample_paths[0].read_bytes(), v=2,
                                policy=policy))
    doc = decode_result(a.value or b"")
    assert (doc["rule"], doc["models"]) == (rule, ["open_nsfw"])
    assert contract.errors("moderation-result.v2", doc) == []


@pytest.mark.parametrize("version", [1, 2])
def test_a_job_past_its_deadline_is_answered_expired_without_the_engine(
        cfg: WorkerConfig, plan: EnginePlan, contract: Any, version: int) -> None:
    with _ScriptedRunner(lambda x: "never called") as runner:
        task = moderation_task(cfg, runner=runner)
        try:
            (a,) = _serve(task, _record(0, id="late", image=b"unused", deadline_ms=1,
                                        v=version))
        finally:
            task.close()
        assert runner.calls == []
    doc = decode_result(a.value or b"")
    assert a.expired and doc["status"] == "expired" and doc["scores"] == {}
    assert "verdict" not in doc and "deadline 1 passed" in doc["error"]
    assert set(doc["timings_ms"]) == {"queue", "total"}
    assert (doc["model_id"], doc["engine_hash"]) == ("open_nsfw", "scripted-0")
    if version == 1:
        assert contract.errors("moderation-result", doc) == [] and "rule" not in doc
    else:
        assert contract.errors("moderation-result.v2", doc) == []
        assert (doc["rule"], doc["models"]) == ("none", [])


def test_ignoring_deadlines_scores_a_late_job(cfg: WorkerConfig, runner: OrtRunner,
                                              sample_paths: list[Path]) -> None:
    task = moderation_task(cfg, runner=runner, ignore_deadlines=True)
    try:
        (a,) = _serve(task, _record(0, id="late", image=sample_paths[0].read_bytes(),
                                    deadline_ms=1))
    finally:
        task.close()
    assert a.status == "ok"


# --- engine failure, through the task's isolation (worker.tasks.batched) -----------------------


def _scripted_task(cfg: WorkerConfig, runner: Runner, delay_ms: int = 60_000
                   ) -> ModerationTask:
    """A task whose batches form when forced (the drain), or after ``delay_ms``."""
    return moderation_task(load_config(**{**cfg.model_dump(include={"model"}),
                                          "batch": {"max_delay_ms": delay_ms}}), runner=runner)


def test_only_the_job_whose_row_keeps_failing_is_dead_lettered(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    images = _images(sample_paths, 6)
    poison = preprocess_open_nsfw(decode_image(images[4][1]),
                                  jpeg_roundtrip=cfg.model.jpeg_roundtrip)
    bad = _ScriptedRunner(lambda x: "kernel failed on this input"
                          if any(np.array_equal(r, poison) for r in x) else None)
    with bad:
        task = _scripted_task(cfg, bad)
        try:
            answers = _serve(task, *(_record(k, id=name, image=image)
                                     for k, (name, image) in enumerate(images)))
        finally:
            task.close()
    by_id = {a.job_id: a for a in answers}
    assert len(answers) == 6
    failed = by_id["j4"]
    assert failed.rejection is not None and failed.rejection.reason == "internal_error"
    assert "kernel failed on this input" in str(failed.rejection)
    assert {by_id[f"j{k}"].status for k in (0, 1, 2, 3, 5)} == {"ok"}


def test_an_engine_failing_every_job_alone_is_an_outage_not_an_answer(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job failing alone pins nothing on a job: the batch waits and runs again
    (readiness says why), where every job used to be answered ``status: error`` and
    committed."""
    monkeypatch.setattr(batched, "TRANSIENT_FIRST_S", 60.0)
    with _ScriptedRunner(lambda x: "device lost") as failing:
        task = _scripted_task(cfg, failing, delay_ms=0)
        try:
            answers = task.admit(ConsumedBatch(
                [_record(k, id=name, image=image)
                 for k, (name, image) in enumerate(_images(sample_paths, 3))], {},
                time.monotonic()))
            for _ in range(10):
                answers += task.schedule(time.monotonic(), int(time.time() * 1e3), free=2,
                                         force=False)
                answers += task.collect(block=True)
            assert answers == [] and task.held() == 3
            reason = task.unavailable()
            assert reason is not None and "device lost" in reason
        finally:
            task.schedule(time.monotonic(), 0, free=0, force=True)  # the drain drops it
            assert task.held() == 0
            task.close()


def test_a_sticky_cuda_error_stops_the_worker_instead_of_answering(
        cfg: WorkerConfig, plan: EnginePlan, sample_paths: list[Path]) -> None:
    """An illegal address poisons the context: answering jobs would commit them."""
    sticky = _ScriptedRunner(lambda x: "CUDA error: an illegal memory access was encountered")
    with sticky:
        task = _scripted_task(cfg, sticky)
        try:
            with pytest.raises(InferenceFailed, match="illegal memory access"):
                _serve(task, *(_record(k, id=name, image=image)
                               for k, (name, image) in enumerate(_images(sample_paths, 3))))
            assert sticky.calls == [3]  # not split: it cannot help
        finally:
            task.close()
