"""GenerationTask end to end on the tiny engines (torch fp32 and ONNX Runtime on the CPU):
decoded jobs in, results with PNGs out; seeds, ordering, idempotence, batching, blobs, errors."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from gen_support import needs_sd, settings
from PIL import Image

from engines.backends.base import InferHandle, Runner
from engines.exceptions import InferenceFailed
from engines.models.sd.engines import SdEngines
from worker.tasks.batcher import Batch, DynamicBatcher
from worker.tasks.generation.blobs import LocalBlobStore
from worker.tasks.generation.task import GenerationOutcome, GenerationPending, GenerationTask
from worker.wire.generation_codec import generation_result_to_dict
from worker.wire.generation_jobs import GenerationResult
from worker.wire.moderation_jobs import Status
from worker.wire.records import SourceRef

pytestmark = needs_sd


def payload(**kw: Any) -> bytes:
    doc = {"v": 1, "id": "job-1", "prompt": "a red car", "width": 64, "height": 64, "steps": 4,
           "seed": 42} | kw
    return msgpack.packb(doc, use_bin_type=True)


def make_task(engines: SdEngines, blob_dir: Path, **overrides: Any) -> GenerationTask:
    backend = "onnxruntime" if engines.runners["unet"].backend == "onnxruntime" else "torch"
    return GenerationTask(settings(backend, **overrides), engines, LocalBlobStore(blob_dir),
                          own_engines=False)


@pytest.fixture()
def task(torch_engines: SdEngines, blob_dir: Path) -> Iterator[GenerationTask]:
    t = make_task(torch_engines, blob_dir)
    yield t
    t.close()


def run(task: GenerationTask, *payloads: bytes) -> list[GenerationOutcome]:
    items = [task.pending(p, SourceRef("generation.jobs", 0, i)) for i, p in enumerate(payloads)]
    return task.submit(Batch(task.batcher_profiles()[0], items, len(items))).result(timeout=120)


def only(task: GenerationTask, p: bytes) -> GenerationResult:
    (outcome,) = run(task, p)
    assert outcome.result is not None and outcome.rejection is None
    return outcome.result


def pixels(png: bytes | None) -> np.ndarray:
    assert png is not None
    with Image.open(io.BytesIO(png)) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        return np.asarray(im)


def test_result_is_valid_and_holds_a_png_of_the_job_size(task: GenerationTask,
                                                          contract: Any) -> None:
    r = only(task, payload(width=128, height=64))
    assert r.status is Status.OK and r.random_weights and r.model_id == "tiny-random-s0"
    assert contract.errors("generation-result", generation_result_to_dict(r)) == []
    (im,) = r.images
    assert (im.index, im.seed, im.width, im.height) == (0, 42, 128, 64)
    px = pixels(im.png)
    assert px.shape == (64, 128, 3) and px.std() > 0  # drawn, not a constant
    assert set(r.timings_ms) == {"queue", "engines_wait", "text", "denoise", "vae", "png", "total"}
    assert r.engine_hashes == task.engines.engine_hashes()
    assert ("ktw.schema", b"generation-result/v1") in task.headers(r)


def test_a_v2_job_is_answered_in_v2_with_the_same_images(task: GenerationTask,
                                                       contract: Any) -> None:
    v1, v2 = only(task, payload()), only(task, payload(v=2))
    doc = generation_result_to_dict(v2)
    assert (v1.schema_version, v2.schema_version, doc["v"]) == (1, 2, 2)
    assert contract.errors("generation-result.v2", doc) == []
    assert ("ktw.schema", b"generation-result/v2") in task.headers(v2)
    assert v2.images == v1.images
    expired = task.expired_result(task.pending(payload(v=2, deadline_ms=1),
                                               SourceRef("generation.jobs", 0, 9)), 5)
    assert contract.errors("generation-result.v2", generation_result_to_dict(expired)) == []


@pytest.mark.parametrize("scheduler", ["ddim", "euler", "euler_a"])
def test_same_seed_gives_identical_png_bytes(task: GenerationTask, scheduler: str) -> None:
    a, b = (only(task, payload(scheduler=scheduler)) for _ in range(2))
    assert a.images[0].png == b.images[0].png
    c = only(task, payload(scheduler=scheduler, seed=43))
    assert c.images[0].png != a.images[0].png


def test_same_seed_identical_bytes_on_onnxruntime(ort_engines: SdEngines,
                                                   blob_dir: Path) -> None:
    t = make_task(ort_engines, blob_dir)
    try:
        a, b = (only(t, payload(scheduler="euler_a")) for _ in range(2))
        assert a.images[0].png == b.images[0].png
    finally:
        t.close()


def test_onnxruntime_and_torch_draw_the_same_images(task: GenerationTask,
                                                    ort_engines: SdEngines,
                                                    blob_dir: Path) -> None:
    t = make_task(ort_engines, blob_dir)
    try:
        for sched in ("ddim", "euler_a"):
            a = pixels(only(task, payload(scheduler=sched)).images[0].png).astype(int)
            b = pixels(only(t, payload(scheduler=sched)).images[0].png).astype(int)
            assert np.abs(a - b).max() <= 2 and np.mean(a != b) < 0.02
    finally:
        t.close()


def test_variants_are_ordered_with_seed_plus_index(task: GenerationTask) -> None:
    r = only(task, payload(num_images=5, seed=2**32 - 2))  # 5 images: two UNet chunks here
    assert [(im.index, im.seed) for im in r.images] == [
        (0, 2**32 - 2), (1, 2**32 - 1), (2, 0), (3, 1), (4, 2)]
    assert len({im.png for im in r.images}) == 5
    # Variant i is the image a one-image job with seed + i draws (up to batch-size rounding).
    third = only(task, payload(seed=0))
    np.testing.assert_allclose(pixels(r.images[2].png), pixels(third.images[0].png), atol=2)


def test_a_job_draws_the_same_images_alone_or_in_a_mixed_batch(task: GenerationTask) -> None:
    alone = only(task, payload(id="b", seed=7, scheduler="euler"))
    outcomes = run(task, payload(id="a", steps=6, num_images=2),
                   payload(id="b", seed=7, scheduler="euler"),
                   payload(id="c", width=128, height=64, steps=3, prompt="a cat"))
    assert [o.result.id for o in outcomes if o.result] == ["a", "b", "c"]
    results = {o.result.id: o.result for o in outcomes if o.result}
    assert all(r.status is Status.OK for r in results.values())
    assert [len(r.images) for r in results.values()] == [2, 1, 1]
    assert pixels(results["c"].images[0].png).shape == (64, 128, 3)
    np.testing.assert_allclose(pixels(results["b"].images[0].png),
                               pixels(alone.images[0].png), atol=2)


def test_prompt_and_negative_prompt_steer_the_image(task: GenerationTask) -> None:
    base = pixels(only(task, payload()).images[0].png)
    assert not np.array_equal(base, pixels(only(task, payload(prompt="a blue boat")).images[0].png))
    assert not np.array_equal(base, pixels(only(task, payload(negative_prompt="red"))
                                           .images[0].png))


def test_large_results_go_to_the_blob_store_idempotently(torch_engines: SdEngines,
                                                         blob_dir: Path, contract: Any) -> None:
    t = make_task(torch_engines, blob_dir, results_max_bytes=4096)
    try:
        first, again = (only(t, payload(num_images=2)) for _ in range(2))
    finally:
        t.close()
    assert all(im.png is None and im.blob is not None for im in first.images)
    assert [im.blob for im in first.images] == [im.blob for im in again.images]
    assert len(t.encode_result(first)) <= 4096 and "blob" in first.timings_ms
    assert contract.errors("generation-result", generation_result_to_dict(first)) == []
    for im in first.images:
        assert im.blob is not None
        path = Path(im.blob.uri.removeprefix("file://"))
        assert path.is_file() and path.stat().st_size == im.blob.bytes
        assert pixels(path.read_bytes()).shape == (64, 64, 3)
        assert path.is_relative_to(blob_dir)


class FailingRunner(Runner):
    backend = "broken"

    @property
    def engine_hash(self) -> str:
        return "broken-1"

    def _activate(self) -> None: ...

    def _deactivate(self) -> None: ...

    def _infer(self, feeds: Any, stream: Any) -> InferHandle:
        raise InferenceFailed("device lost")


def test_an_engine_failure_is_raised_never_answered_error(torch_engines: SdEngines,
                                                          blob_dir: Path) -> None:
    """An engine failure used to answer every job ``status: error`` and commit it (a consumer
    that fails open then let unmoderated content through). Now the batch's future raises: the
    task's base waits out an outage (out of memory) or splits the batch down to the job that
    fails alone, which is dead-lettered (tests/unit/tasks/test_batched.py)."""
    broken = replace(torch_engines, runners={**torch_engines.runners, "unet": FailingRunner()})
    t = GenerationTask(settings(), broken, LocalBlobStore(blob_dir), own_engines=False)
    try:
        with pytest.raises(InferenceFailed, match="device lost"):
            run(t, payload(id="a"), payload(id="b", num_images=3))
    finally:
        t.close()


def test_expired_result(task: GenerationTask, contract: Any) -> None:
    p = task.pending(payload(deadline_ms=1_000), SourceRef("generation.jobs", 3, 9))
    r = task.expired_result(p, now_ms=2_500)
    assert r.status is Status.EXPIRED and "1500 ms" in (r.error or "")
    assert contract.errors("generation-result", generation_result_to_dict(r)) == []


def test_batcher_queues_jobs_per_resolution(task: GenerationTask) -> None:
    profiles = task.batcher_profiles()
    assert [p.min_item for p in profiles] == [(4, 8, 8), (4, 8, 16)]
    batcher: DynamicBatcher[GenerationPending] = DynamicBatcher(
        profiles, max_batch_size=8, max_delay_s=0.0)
    for i, size in enumerate([(64, 64), (128, 64), (64, 64)]):
        batcher.add(task.pending(payload(id=f"j{i}", width=size[0], height=size[1]),
                                 SourceRef("t", 0, i)))
    batches = batcher.schedule(now=1e9, now_ms=0, limit=4).batches
    assert sorted([p.job.id for p in b.items] for b in batches) == [["j0", "j2"], ["j1"]]


def test_warm_up_runs_every_static_shape(torch_engines: SdEngines, blob_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_task(torch_engines, blob_dir, warm_up="all_shapes")  # auto: none on the CPU
    seen: list[tuple[str, tuple[int, ...]]] = []
    for name, r in task.engines.runners.items():
        def spy(feeds: Any, stream: Any = None, _r: Runner = r, _n: str = name) -> InferHandle:
            seen.append((_n, next(iter(feeds.values())).shape))
            return type(_r).infer(_r, feeds, stream)
        monkeypatch.setattr(r, "infer", spy)
    try:
        task.warm_up()
    finally:
        task.close()
    assert sorted(s for n, s in seen if n == "text_encoder") == [(2, 77), (4, 77), (8, 77)]
    assert sorted(s for n, s in seen if n == "unet") == sorted(
        (b, 4, 8, w) for b in (2, 4, 8) for w in (8, 16))
    assert sorted(s for n, s in seen if n == "vae") == sorted(
        (b, 4, 8, w) for b in (1, 2, 4) for w in (8, 16))


def test_beside_moderation_each_denoising_step_yields_to_its_batches(task: GenerationTask
                                                                      ) -> None:
    from worker.tasks.gpu_share import GpuShare

    share = GpuShare(max_wait_s=0.001)
    task.share_gpu(share, yields=True)
    share.claim()  # a moderation batch in flight throughout
    r = only(task, payload(steps=3))
    assert r.status is Status.OK
    # one wait before each UNet step, and one before the one-image batch's paced VAE launch
    assert share.yields == 3 + 1


def test_beside_moderation_a_paced_vae_decode_waits_its_turn_before_each_launch(
        torch_engines: SdEngines, blob_dir: Path) -> None:
    from worker.tasks.gpu_share import GpuShare

    outs, turns = [], []
    for shared in (False, True):
        t = make_task(torch_engines, blob_dir, vae_yield_ms=1.0, vae_yield_images=4)
        share = GpuShare(max_wait_s=0.0)  # UNet steps never wait: only the VAE's launches
        try:
            if shared:
                t.share_gpu(share, yields=True)
                share.claim()  # a moderation batch in flight throughout
            outs.append(only(t, payload(steps=2, num_images=5)))
        finally:
            t.close()
        turns.append(share.yields)
    # five images: UNet chunks of 4 and 1 pairs, one VAE launch of at most 4 each
    assert turns == [0, 2]
    alone, paced = outs
    assert alone.status is paced.status is Status.OK
    assert [i.png for i in alone.images] == [i.png for i in paced.images]
    assert all(i.png for i in paced.images)


class _Partitionable(Runner):
    """A runner that records the SMs it was asked to leave free (or cannot, or is active)."""

    def __init__(self, can: bool = True, active: bool = False) -> None:
        super().__init__()
        self.can, self._active = can, active
        self.asked: list[int] = []

    def leave_sms_free(self, sms: int) -> bool:
        from engines.exceptions import RunnerStateError

        if self._active:
            raise RunnerStateError("unet: SMs are partitioned before activation")
        self.asked.append(sms)
        return self.can

    def _activate(self) -> None: ...

    def _deactivate(self) -> None: ...

    def _infer(self, feeds: Any, stream: Any) -> InferHandle:
        raise AssertionError("not run here")


@pytest.mark.parametrize(("free", "yields", "asked"), [(16, True, [16]), (0, True, []),
                                                       (16, False, [])])
def test_beside_moderation_generation_leaves_the_configured_sms_free(
        torch_engines: SdEngines, blob_dir: Path, free: int, yields: bool, asked: list[int]
) -> None:
    from structlog.testing import capture_logs

    from worker.tasks.gpu_share import GpuShare

    runners = {c: _Partitionable() for c in ("text_encoder", "unet", "vae")}
    t = make_task(replace(torch_engines, runners=runners), blob_dir, device="cuda:0")
    share = GpuShare(max_wait_s=0.001, free_sms=free)
    with capture_logs() as logs:
        t.share_gpu(share, yields=yields)
    assert all(r.asked == asked for r in runners.values())
    assert [e["free_sms"] for e in logs if e["event"] == "gpu_free_sms"] == ([free] if asked
                                                                            else [])
    # What the other tasks may keep to (processing.gpu_disjoint_sms): only SMs left free.
    assert share.left_free == (free if asked else 0)
    t._batch_pool.shutdown()
    t._png_pool.shutdown()


@pytest.mark.parametrize(("runner", "said"), [(_Partitionable(can=False), "engines"),
                                              (_Partitionable(active=True), "reason")])
def test_sms_that_cannot_be_left_free_are_a_warning_not_a_failed_start(
        torch_engines: SdEngines, blob_dir: Path, runner: _Partitionable, said: str) -> None:
    from structlog.testing import capture_logs

    from worker.tasks.gpu_share import GpuShare

    t = make_task(replace(torch_engines, runners={"unet": runner}), blob_dir, device="cuda:0")
    share = GpuShare(max_wait_s=0.001, free_sms=16)
    with capture_logs() as logs:
        t.share_gpu(share, yields=True)
    (warned,) = [e for e in logs if e["event"] == "gpu_free_sms_ignored"]
    assert said in warned
    assert share.left_free == 0, "no SMs were left free for the other tasks to keep to"
    t._batch_pool.shutdown()
    t._png_pool.shutdown()


def test_generation_on_the_cpu_leaves_no_sms_and_says_nothing(torch_engines: SdEngines,
                                                               blob_dir: Path) -> None:
    from structlog.testing import capture_logs

    from worker.tasks.gpu_share import GpuShare

    runner = _Partitionable()
    t = make_task(replace(torch_engines, runners={"unet": runner}), blob_dir)  # device cpu
    with capture_logs() as logs:
        t.share_gpu(GpuShare(max_wait_s=0.001, free_sms=16), yields=True)
    assert runner.asked == [] and not [e for e in logs if "gpu_free_sms" in e["event"]]
    t._batch_pool.shutdown()
    t._png_pool.shutdown()
