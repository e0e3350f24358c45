"""The open_nsfw GPU model alone, without Kafka or the loop: how fast the worker's own batch path
(nvJPEG decode, resize, pipeline slot, graph, D2H) runs, where a batch's time goes, and what more
batches in flight buy. The issue-13 question it answers: is the ~5-8k frames/s seen through
Kafka set by the task path or by the loop and the broker?

Same model and config as bench/moderation/kafka_e2e.py's worker (torch backend, GPU
preprocessing, batch 128, ``decode_threads`` = cores): the open_nsfw package's model
(:mod:`worker.tasks.moderation.models.open_nsfw.gpu`), built as the moderation task builds it,
fed the bench's real JPEGs as the parts the task would batch (decoded job records, one image
part each). The task's batch threads do nothing but call the part kind's model
(``ModerationModel.run``), so this is the task's batch path. For each in-flight count K,
batches are run on K threads with K outstanding (as the loop does) and the run reports
images/s and, per batch, the median milliseconds of each step, timed by wrapping the model's
own functions (no product code changes):

    wait     submit -> the batch thread starts
    acquire  the pipeline slot (waits when every slot of the size is busy)
    decode   torchvision's batched nvJPEG decode (host side; it synchronises its stream)
    resize   resize + crop + write into the slot (host side, kernels queued)
    launch   H2D wait / graph replay / D2H enqueue
    result   waiting for the slot's outputs

Beside it, in the same process: the decode alone from K threads and the engine (graph replay)
alone, the two stages the batch path chains. ``--trace`` saves a torch.profiler chrome trace of
a few batches at the largest K. ``--dry-run``: no GPU, the default CPU model (onnxruntime),
small batches, to check the harness (its figures mean nothing).

    python bench/moderation/task_probe.py --out DIR      (GPU machine; bench/device_kafka.sh probe)
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write
from bench.corpus import jpeg_photos
from bench.moderation.cpu_decode_probe import decode_crop, rate


class StepTimes:
    """Per-thread step timings: wrap a callable so each call's duration lands under ``name``."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                with self._lock:
                    self.ms[name].append((time.perf_counter() - t) * 1e3)
        return timed

    def summary(self) -> dict[str, float]:
        return {k: round(median(v), 3) for k, v in sorted(self.ms.items())}

    def worst(self) -> dict[str, list[float]]:
        """The three slowest calls per step: where a stall sits, which medians hide."""
        return {k: [round(x, 1) for x in sorted(v)[-3:]] for k, v in sorted(self.ms.items())}


def make_model(dry_run: bool) -> Any:
    """open_nsfw's model as the moderation task builds it (engines built or loaded from the
    cache, activated, warmed; nvJPEG warm on the GPU path)."""
    from bench.moderation.pipeline_bench import worker_cfg
    from worker.config import load_config
    from worker.tasks.moderation.models import make_models
    from worker.tasks.moderation.served_policies import effective_policies

    if dry_run:  # the harness on a machine without a GPU: the default CPU model
        cfg = load_config(kafka={"bootstrap_servers": "127.0.0.1:9"})
    else:
        cfg = worker_cfg("127.0.0.1:9", "probe", "gpu")
    policies = effective_policies(cfg)
    model = make_models(cfg, {"default": policies["default"]})["open_nsfw"]
    model.warm_up()
    if hasattr(model, "wait_for_gpu_decoder"):  # nvJPEG warms up after warm_up (CPU decodes)
        model.wait_for_gpu_decoder(120)
    return cfg, model


def image_parts(cfg: Any, model: Any, photos: list[bytes], n: int) -> list[Any]:
    """``n`` jobs as the task admits them (decoded, checked), each as the model's parts."""
    from worker.tasks.moderation.parts import JobState, Pending
    from worker.tasks.moderation.served_policies import effective_policies
    from worker.tasks.protocol import source_ref
    from worker.tools.produce import encode_job
    from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job
    from worker.wire.records import SourceRecord

    policy = effective_policies(cfg)["default"]
    limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
    out: list[Any] = []
    for i in range(n):
        value = encode_job(f"j{i:07d}", photos[i % len(photos)])
        rec = SourceRecord("jobs", i % 8, i, None, value, None, None)
        job = decode_moderation_job(value, limits)
        model.check(job)
        state = JobState(Pending(source_ref(rec), job, time.monotonic(), rec, 0), policy)
        parts = model.parts(state)
        state.outstanding = len(parts)
        out += parts
    return out


def run_batches(model: Any, items: list[Any], batch: int, in_flight: int, steps: StepTimes
                ) -> dict[str, Any]:
    """Run batches of ``batch`` parts on ``in_flight`` threads, keeping ``in_flight``
    outstanding; images/s."""
    from worker.tasks.batcher import Batch

    (kind, profiles), = model.profiles().items()
    profile = profiles[0]
    batches = [items[i:i + batch] for i in range(0, len(items) - batch + 1, batch)]
    outstanding: list[Future[Any]] = []
    waits: list[float] = []
    totals: list[float] = []  # each batch, start to end on its thread

    def run(b: Any, submitted: float) -> Any:
        t = time.perf_counter()
        waits.append((t - submitted) * 1e3)
        try:
            return model.run(kind, b)
        finally:
            totals.append((time.perf_counter() - t) * 1e3)

    t0 = time.perf_counter()
    done = 0
    with ThreadPoolExecutor(in_flight, thread_name_prefix="batch") as pool:
        for b in batches:
            if len(outstanding) >= in_flight:
                done += len(outstanding.pop(0).result())
            outstanding.append(pool.submit(run, Batch(profile, b, batch), time.perf_counter()))
        done += sum(len(fut.result()) for fut in outstanding)
    dt = time.perf_counter() - t0
    return {"in_flight": in_flight, "batches": len(batches), "images": done,
            "img_s": round(done / dt), "steps_ms": {"wait": round(median(waits), 3),
                                                     **steps.summary()},
            "batch_ms": {"median": round(median(totals), 1),
                         "slowest": [round(x, 1) for x in sorted(totals)[-5:]]},
            "slowest_steps_ms": steps.worst()}


def decode_alone(photos: list[bytes], batch: int, threads: int, batches: int) -> int:
    """The same decode as the task's, batches of ``batch``, from ``threads`` threads."""
    import torch

    from bench.moderation.decode_probe import decode_rate

    raw = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in photos]
    work = [raw[(i * batch) % len(raw):][:batch] for i in range(batches)]
    return decode_rate([w for w in work if len(w) == batch], threads)


def engine_alone(model: Any, batch: int, reps: int) -> float:
    """Graph replays of the pipeline's slot for ``batch``, back to back on its stream."""
    import torch

    pipe = model.pipeline
    slot = pipe._slots[pipe.size_for(batch)][0]
    stream = torch.cuda.ExternalStream(pipe.compute.ptr)
    with torch.cuda.stream(stream):
        slot.graph.replay()
    stream.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        for _ in range(reps):
            slot.graph.replay()
    stream.synchronize()
    return round(reps * slot.size / (time.perf_counter() - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=None, help="default 128 (8 with --dry-run)")
    ap.add_argument("--batches", type=int, default=None, help="default 80 (4 with --dry-run)")
    ap.add_argument("--in-flight", default=None, help="default 1,2,4,8 (1,2 with --dry-run)")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: run the harness on the default CPU model (no figures)")
    args = ap.parse_args()
    small = args.dry_run
    args.batch = args.batch or (8 if small else 128)
    args.batches = args.batches or (4 if small else 80)
    args.in_flight = args.in_flight or ("1,2" if small else "1,2,4,8")
    photos = jpeg_photos(2048 if not small else 64)
    cfg, model = make_model(args.dry_run)
    steps = StepTimes()
    if not args.dry_run:
        # The steps, wrapped where the model looks them up at each call (module attributes).
        import worker.tasks.moderation.images.gpu as gpu_decode
        import worker.tasks.moderation.models.open_nsfw.gpu_preprocess as gpu_prep
        from engines.backends.torch import pipeline as pipeline_mod

        gpu_decode.decode_all = steps.wrap("decode", gpu_decode.decode_all)
        gpu_prep.prepare_batch = steps.wrap("decode+resize", gpu_prep.prepare_batch)
        pipe = model.pipeline
        pipe.acquire = steps.wrap("acquire", pipe.acquire)
        pipe.launch = steps.wrap("launch", pipe.launch)
        pipeline_mod.PipelineHandle.result = steps.wrap(  # type: ignore[method-assign]
            "result", pipeline_mod.PipelineHandle.result)

    items = image_parts(cfg, model, photos, args.batch * args.batches)
    record: dict[str, Any] = {"benchmark": "task_probe_open_nsfw_gpu", "env": environment(),
                              "model": type(model).__name__,
                              "params": vars(args) | {"out": str(args.out),
                                                      "mean_jpeg_bytes": round(
                                                          sum(map(len, photos)) / len(photos))}}
    run_batches(model, items[: args.batch * min(8, args.batches)], args.batch, 4,
                StepTimes())  # warm
    runs = []
    # More batches in flight than the worker's batch threads would only queue: K threads each
    # (the pipeline keeps its max_in_flight_batches + 1 slots per size, 5 here).
    for k in [int(x) for x in args.in_flight.split(",")]:
        steps.ms.clear()
        r = run_batches(model, items, args.batch, k, steps)
        print("task", r, flush=True)
        runs.append(r)
    record["task"] = runs
    if not args.dry_run:
        record["decode_alone_img_s"] = {t: decode_alone(photos, args.batch, t, 64)
                                        for t in (1, 4)}
        record["engine_alone_img_s"] = engine_alone(model, args.batch, 200)
        # Pillow decode + resize + crop on the model's own decode threads, no GPU work.
        record["cpu_decode_alone_img_s"] = rate(model._decode_pool, decode_crop, photos)
        print("cpu decode alone", record["cpu_decode_alone_img_s"], flush=True)
        print("decode alone", record["decode_alone_img_s"], "engine alone",
              record["engine_alone_img_s"], flush=True)
    if args.trace and args.out is not None and not args.dry_run:
        from torch.profiler import ProfilerActivity, profile

        k = max(int(x) for x in args.in_flight.split(","))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_batches(model, items[: args.batch * 12], args.batch, k, StepTimes())
        trace = args.out / "task-probe-trace.json"
        prof.export_chrome_trace(str(trace))
        record["trace"] = trace.name
    model.close()
    print("wrote", write("task-probe", record, args.out))


if __name__ == "__main__":
    main()
