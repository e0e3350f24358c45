"""The open_nsfw pipeline benchmark, one run, one table, one JSON (bench/results/ or --out):

a. ceilings: the engine fed from device memory per batch size; decoding + preprocessing alone
   (CPU path: one core and a pool of all cores; GPU path: nvJPEG + torch resize/crop);
b. the pipeline with overlap vs the same pipeline forced serial, at a size where copy time is
   close to compute time (float32 input, batch 256), and with uint8 pixels (the worker's path);
c. the worker end to end through a broker (Tansu) with pre-produced ~256x256 JPEG jobs:
   sustained frames/s, then produce-to-result latency p50/p99 at half that rate;
d. a naive worker in the same run: one message at a time, PIL + eager float32 torch, no
   batching, no streams.
Inputs are real photos (bench/corpus.py), never zeros.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, gc_totals, median, write
from bench.corpus import jpeg_photos

ITEM = (224, 224, 3)


def timed(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


# -- (a) ceilings -----------------------------------------------------------------------------
def engine_ceiling(sizes: list[int], iters: int) -> list[dict[str, float]]:
    import torch

    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner
    from engines.models.open_nsfw import open_nsfw_spec
    from engines.profiles import StaticProfile

    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("g", ITEM, tuple(sizes)),),
                         cuda_graphs=False)
    pipe = TorchPipeline(runner, tuple(sizes), slots=1, pixels=True)
    pipe.activate()
    photos = jpeg_photos(64, seed=1)
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    pixels = np.stack([crop_pixels(decode_image(b), jpeg_roundtrip=False) for b in photos])
    rows = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for size in sizes:
        slot = pipe._slots[size][0]
        slot.dev_in.copy_(torch.from_numpy(pixels[np.arange(size) % len(pixels)]))
        ms = []
        for _ in range(iters):
            start.record()
            slot.graph.replay()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        m = median(ms)
        rows.append({"batch": size, "ms": m, "img_s": size / m * 1e3})
    pipe.deactivate()
    runner.deactivate()
    return rows


def preprocess_ceilings(photos: list[bytes]) -> dict[str, float]:
    import torch

    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    def cpu_one(b: bytes) -> np.ndarray:
        return crop_pixels(decode_image(b), jpeg_roundtrip=False)

    t = min(timed(lambda: [cpu_one(b) for b in photos[:512]], 3))
    single = 512 / t
    cores = os.cpu_count() or 1
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(cpu_one, photos[:256]))
        t = min(timed(lambda: list(pool.map(cpu_one, photos[:4096])), 3))
    pooled = min(4096, len(photos)) / t
    out = torch.empty((128, *ITEM), dtype=torch.uint8, device="cuda")

    def gpu() -> None:
        for i in range(0, 1024, 128):
            prepare_batch(photos[i:i + 128], out)
        torch.cuda.synchronize()

    gpu()
    t = min(timed(gpu, 5))
    return {"cpu_1core_img_s": single, "cpu_pool_img_s": pooled, "cpu_cores": cores,
            "gpu_img_s": 1024 / t}


# -- (b) overlap vs serial --------------------------------------------------------------------
def overlap_vs_serial(pixels: bool, size: int, batches: int) -> dict[str, Any]:
    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner
    from engines.models.open_nsfw import open_nsfw_spec
    from engines.profiles import StaticProfile

    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("g", ITEM, (size,)),),
                         cuda_graphs=False)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"batch": size, "input": "uint8" if pixels else "float32"}
    for overlap in (False, True):
        pipe = TorchPipeline(runner, (size,), slots=3, pixels=pixels, overlap=overlap)
        pipe.activate()
        for slot in pipe._slots[size]:  # real-valued inputs written once, outside the clock
            if pixels:
                slot.host_in.array[...] = rng.integers(0, 256, slot.host_in.array.shape)
            else:
                slot.host_in.array[...] = rng.normal(0, 50, slot.host_in.array.shape)

        def run(pipe: Any = pipe) -> None:
            handles = []
            for _ in range(batches):
                slot = pipe.acquire(size)
                handles.append(pipe.launch(slot, size))
                if len(handles) >= 3:
                    handles.pop(0).result()
            for h in handles:
                h.result()

        run()
        t = median(timed(run, 3))
        out["overlap_img_s" if overlap else "serial_img_s"] = batches * size / t
        pipe.deactivate()
    out["ratio"] = out["overlap_img_s"] / out["serial_img_s"]
    runner.deactivate()
    return out


def stage_times(size: int, pixels: bool) -> dict[str, Any]:
    """Per-stage milliseconds for one batch, timed with CUDA events on one stream."""
    import torch

    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner
    from engines.cudart import Event, check, runtime
    from engines.models.open_nsfw import open_nsfw_spec
    from engines.profiles import StaticProfile

    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("g", ITEM, (size,)),),
                         cuda_graphs=False)
    pipe = TorchPipeline(runner, (size,), slots=1, pixels=pixels, overlap=False)
    pipe.activate()
    slot = pipe._slots[size][0]
    s = pipe.compute
    assert s is not None
    ev = [Event(timing=True) for _ in range(4)]
    rt = runtime()
    res: dict[str, list[float]] = {"h2d_ms": [], "compute_ms": [], "d2h_ms": []}
    for _ in range(20):
        ev[0].record(s)
        check(rt.cudaMemcpyAsync(slot.dev_in.data_ptr(), slot.host_in.ptr, slot.host_in.nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyHostToDevice, s.handle))
        ev[1].record(s)
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            slot.graph.replay()
        ev[2].record(s)
        check(rt.cudaMemcpyAsync(slot.host_out.ptr, slot.dev_out.data_ptr(),
                                 slot.host_out.nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, s.handle))
        ev[3].record(s)
        ev[3].synchronize()
        res["h2d_ms"].append(ev[1].elapsed_ms(ev[0]))
        res["compute_ms"].append(ev[2].elapsed_ms(ev[1]))
        res["d2h_ms"].append(ev[3].elapsed_ms(ev[2]))
    pipe.deactivate()
    runner.deactivate()
    return {k: median(v) for k, v in res.items()} | {"batch": size,
                                                      "input": "uint8" if pixels else "float32"}


# -- (c) end to end through the broker --------------------------------------------------------
def produce_jobs(bootstrap: str, topic: str, photos: list[bytes], n: int, prefix: str,
                 rate: float | None = None, sent: dict[str, float] | None = None,
                 linger_ms: float = 5) -> float:
    """``linger_ms``: the job producer's own batching wait, part of what a latency run
    measures from the send (librdkafka's default is 5 ms)."""
    import confluent_kafka as ck

    from worker.tools.produce import encode_job

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms,
                     "batch.size": 1 << 20,
                     "queue.buffering.max.kbytes": 1 << 21, "compression.type": "none"})
    payloads = [encode_job(f"{prefix}{i:07d}", photos[i % len(photos)]) for i in range(n)]
    t0 = time.perf_counter()
    for i, value in enumerate(payloads):
        if rate is not None:
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        while True:
            try:
                p.produce(topic, key=f"{prefix}{i:07d}".encode(), value=value)
                if sent is not None:
                    sent[f"{prefix}{i:07d}"] = time.time()
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    return time.perf_counter() - t0


# The reader must add little to the latency it measures. consume(n, timeout) returns only when n
# messages or the timeout are reached, and librdkafka's default fetch.wait.max.ms (500) lets
# Tansu hold a fetch: with consume(2000, 0.2) and the default, the reader alone added p50 229 ms,
# p99 416 ms to plain produce -> read at 100 msg/s (CPU, Tansu); with these, p50 5 ms, p99 9 ms.
# Even a 5 ms window stamps a record that came early in it at the window's end: on the 2-core
# VM (1,000 msg/s, plain producer, two readers at once) consume(2000, 0.005) read p50 4.5-4.7 /
# p99 10.4-17.3 ms where poll() for the first record and then taking what is already fetched
# read 1.5-1.8 / 7.2-14.2 ms. The reader therefore polls ("prompt"); "window" is the earlier
# reader, kept to compare with the records it made.
READER_FETCH_WAIT_MS, READER_CONSUME_TIMEOUT_S = 5, 0.005
READER_MODES = ("prompt", "window")


def collect(bootstrap: str, topic: str, n: int, timeout: float, sink: dict[str, float],
            produced: dict[str, float] | None = None, mode: str = "prompt") -> None:
    """Arrival wall time per result key (the reader polls continuously); with ``produced``,
    also each result's CreateTime (the worker's produce call), in seconds. ``mode``: "prompt"
    stamps a record when it is there; "window" is consume(2000, 5 ms), the reader the older
    records used."""
    import confluent_kafka as ck

    if mode not in READER_MODES:
        raise ValueError(f"reader mode {mode!r}: one of {READER_MODES}")
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "fetch.wait.max.ms": READER_FETCH_WAIT_MS})
    c.subscribe([topic])
    deadline = time.monotonic() + timeout
    while len(sink) < n and time.monotonic() < deadline:
        if mode == "window":
            batch = c.consume(2000, timeout=READER_CONSUME_TIMEOUT_S)
        else:
            first = c.poll(READER_CONSUME_TIMEOUT_S)
            batch = [] if first is None else [first, *c.consume(2000, timeout=0)]
        now = time.time()
        for m in batch:
            if m.error() is None:
                key = (m.key() or b"").decode()
                sink[key] = now
                kind, ms = m.timestamp()
                if produced is not None and kind == ck.TIMESTAMP_CREATE_TIME:
                    produced[key] = ms / 1e3
    c.close()


def worker_cfg(bootstrap: str, tag: str, preprocess: str) -> Any:
    from worker.config import load_config

    cores = os.cpu_count() or 1
    # BENCH_WORKER_OVERRIDES: JSON {"kafka", "batch", "model", "engines", "gc": {...}} merged
    # over these (env, because worker processes are spawned); kafka_e2e.py --worker-overrides
    # and task_probe.py read it.
    extra = json.loads(os.environ.get("BENCH_WORKER_OVERRIDES") or "{}")
    return load_config(
        kafka={"bootstrap_servers": bootstrap, "group_id": f"g-{tag}", **extra.get("kafka", {})},
        topics={"jobs": f"jobs-{tag}", "results": f"results-{tag}", "dlq": f"dlq-{tag}"},
        model={"backend": "torch", "preprocess": preprocess, "jpeg_roundtrip": False,
               "decode_threads": cores,
               "profiles": [{"name": "gpu", "kind": "static", "batch_sizes": [8, 32, 128]}],
               **extra.get("model", {})},
        batch={"max_batch_size": 128, "max_delay_ms": 4, "max_in_flight_batches": 4,
               "high_watermark": 8192, "low_watermark": 2048, "fetch_queue_kbytes": 262144,
               "poll_timeout_ms": 5, **extra.get("batch", {})},
        engines={"use_cache": False, **extra.get("engines", {})}, gc=extra.get("gc", {}),
        log={"level": "WARNING"},
    )


def _worker_proc(bootstrap: str, tag: str, preprocess: str, counter: Any, ready: Any,
                 stop: Any, hops: Any, gpu: str | None = None) -> None:
    """One worker process: the Python loop is per process, so K processes share one GPU, or
    each gets its own (``gpu``: the one device it sees, as `trt-worker run --gpus` does)."""
    if gpu is not None:  # before anything initialises CUDA in this (spawned) process
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if os.environ.get("BENCH_SWITCH_INTERVAL_MS"):  # kafka_e2e.py --switch-interval-ms
        sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL_MS"]) / 1e3)
    from worker.logs import configure_logging
    from worker.loop.build import build_worker

    configure_logging("WARNING")
    worker = build_worker(worker_cfg(bootstrap, tag, preprocess))
    th = threading.Thread(target=worker.run, daemon=True)
    th.start()
    while not stop.is_set():
        counter.value = worker.stats.results
        if worker.task.ready() and worker.parts.consumer._client is not None and \
                worker.parts.consumer.assignment():
            ready.set()
        time.sleep(0.02)
    worker.stop()
    th.join(60)
    summary: dict[str, Any] = dict(worker.hops.summary())  # each job's time, hop by hop
    vitals = getattr(worker, "vitals", None)  # (older checkouts have none)
    if vitals is not None:  # batch sizes per profile: do the batches fill?
        summary["batches"] = {p: {"n": b.count, "mean_size": round(b.sum / max(1, b.count), 1)}
                              for p, b in vitals.batch_size.items()}
    heap = getattr(worker, "heap", None)  # (older checkouts have none)
    if heap is not None:  # the collector's pauses: no other thread runs Python code meanwhile
        summary["gc_pauses"] = gc_totals(heap)
    hops.put(summary)


def end_to_end(bootstrap: str, photos: list[bytes], n: int, preprocess: str,
               rate: float | None, procs: int = 1, gpus: int = 0,
               produce_after_ready: bool | None = None,
               producer_linger_ms: float = 5) -> dict[str, float]:
    """``gpus`` > 0: worker process i sees only GPU ``i % gpus`` (0: all share the default).
    ``produce_after_ready`` (sustained runs; default: with several processes): the jobs are
    produced once every process holds partitions, instead of before the processes start.
    Compare runs made the same way only."""
    import multiprocessing as mp

    from worker.devkit.local_kafka.admin import create_topics

    tag = uuid.uuid4().hex[:8]
    cfg = worker_cfg(bootstrap, tag, preprocess)
    create_topics(bootstrap, [cfg.topics.jobs], partitions=8)
    create_topics(bootstrap, [cfg.topics.results, cfg.topics.dlq], partitions=8)
    sent: dict[str, float] = {}
    # Sustained: everything waits before the worker starts. With several processes the first
    # one ready would take every partition and a rebalance would follow mid-run (seen on two
    # GPUs: one process answered 88% of the jobs, the rebalance inside the measured window),
    # so then the jobs are produced, as fast as possible, once every process holds partitions.
    if produce_after_ready is None:
        produce_after_ready = procs > 1
    produce_first = rate is None and not produce_after_ready
    if produce_first:
        produce_jobs(bootstrap, cfg.topics.jobs, photos, n, "j", None)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    members = [(ctx.Value("q", 0), ctx.Event()) for _ in range(procs)]
    hops = ctx.Queue()
    children = [ctx.Process(target=_worker_proc,
                            args=(bootstrap, tag, preprocess, c, r, stop, hops,
                                  str(i % gpus) if gpus else None))
                for i, (c, r) in enumerate(members)]
    results: dict[str, float] = {}
    produced: dict[str, float] = {}
    reader = threading.Thread(target=collect, args=(bootstrap, cfg.topics.results, n, 300,
                                                    results, produced), daemon=True)
    # Latency runs also read with the earlier reader, in its own group, for comparison.
    windowed: dict[str, float] = {}
    window_reader = (threading.Thread(target=collect, args=(
        bootstrap, cfg.topics.results, n, 300, windowed, None, "window"), daemon=True)
        if rate is not None else None)
    for ch in children:
        ch.start()
    reader.start()
    if window_reader is not None:
        window_reader.start()
    progress: list[tuple[float, int]] = []  # (time, results produced by all workers)

    def answered() -> tuple[float, int]:
        return time.perf_counter(), sum(int(c.value) for c, _ in members)

    def sample() -> None:  # from the start: the jobs may be produced while workers answer
        while reader.is_alive():
            progress.append(answered())
            reader.join(0.05)
        time.sleep(0.05)  # the workers publish their counters every 20 ms: one last sample
        progress.append(answered())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    producing: tuple[float, float] | None = None  # (start, end) when produced during the run
    if rate is None and not produce_first:
        deadline = time.monotonic() + 180
        while not all(r.is_set() for _, r in members) and time.monotonic() < deadline:
            time.sleep(0.1)
        t_start = time.perf_counter()
        produce_jobs(bootstrap, cfg.topics.jobs, photos, n, "j", None)
        producing = (t_start, time.perf_counter())
    if rate is not None:
        # The worker is warm (graphs captured, partitions assigned) before the clock starts.
        deadline = time.monotonic() + 180
        while not all(r.is_set() for _, r in members) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        produce_jobs(bootstrap, cfg.topics.jobs, photos, n, "j", rate, sent, producer_linger_ms)
    sampler.join()
    answered_by = [int(c.value) for c, _ in members]  # results each process produced
    stop.set()
    per_process = []
    for _ in children:
        try:
            per_process.append(hops.get(timeout=90))
        except Exception:  # noqa: BLE001 - a worker that died reports nothing
            per_process.append({})
    for ch in children:
        ch.join(90)
    ts = np.array(sorted(results.values()), dtype=np.float64) * 1e3
    out: dict[str, Any] = {"jobs": n, "answered": len(results), "preprocess": preprocess,
                           "worker_processes": procs, "gpus": min(procs, gpus) if gpus else 1,
                           "produced_after_every_process_was_assigned": not produce_first,
                           "hops": per_process}
    if rate is None:
        # Sustained rate from the worker's own counter between 10% and 90% of the jobs.
        t10 = next((t for t, c in progress if c >= 0.1 * n), None)
        t90 = next((t for t, c in progress if c >= 0.9 * n), None)
        if t10 is None or t90 is None or t90 <= t10:
            out["sustained_fps"] = 0.0
            out["error"] = f"the workers answered {progress[-1][1]} of {n} jobs"
        else:
            out["sustained_fps"] = 0.8 * n / (t90 - t10)
        out["reader_span_s"] = float((ts[-1] - ts[0]) / 1e3) if len(ts) else 0.0
        if producing is not None:
            # Jobs produced while the workers answered: the rate cannot exceed the producer's.
            # (Sampled only after the producer finished, the window read several times too
            # high.)
            rate_in = n / (producing[1] - producing[0])
            out["producer_jobs_per_s"] = rate_in
            out["producer_bound"] = out["sustained_fps"] >= 0.9 * rate_in
        out["answered_by_process"] = answered_by
        if len(answered_by) > 1 and max(answered_by):
            out["process_share_min_over_max"] = min(answered_by) / max(answered_by)
    else:
        lat = np.array([(results[k] - sent[k]) * 1e3 for k in results if k in sent])
        out |= {"rate": rate, "producer_linger_ms": producer_linger_ms,
                "latency_p50_ms": float(np.percentile(lat, 50)),
                "latency_p99_ms": float(np.percentile(lat, 99)), "latency_n": len(lat),
                "reader": {"mode": "prompt", "fetch_wait_max_ms": READER_FETCH_WAIT_MS,
                           "poll_timeout_ms": READER_CONSUME_TIMEOUT_S * 1e3}}
        if window_reader is not None:
            window_reader.join(30)
        wlat = np.array([(windowed[k] - sent[k]) * 1e3 for k in windowed if k in sent])
        if len(wlat):  # the same results through the window reader
            out["window_reader"] = {"latency_p50_ms": float(np.percentile(wlat, 50)),
                                    "latency_p99_ms": float(np.percentile(wlat, 99)),
                                    "latency_n": len(wlat),
                                    "consume": [2000, READER_CONSUME_TIMEOUT_S]}
        # Produce call to the worker's produce call of the result (its CreateTime, 1 ms steps):
        # the part of the latency that is the worker's, without the result's trip to the reader.
        wl = np.array([(produced[k] - sent[k]) * 1e3 for k in produced if k in sent])
        if len(wl):
            out |= {"to_result_produce_p50_ms": float(np.percentile(wl, 50)),
                    "to_result_produce_p99_ms": float(np.percentile(wl, 99))}
    return out


# -- (d) naive worker -------------------------------------------------------------------------
def naive(bootstrap: str, photos: list[bytes], n: int) -> dict[str, float]:
    import confluent_kafka as ck
    import msgpack
    import torch

    from engines.models.open_nsfw import open_nsfw_spec
    from engines.models.open_nsfw.net import build_module
    from worker.devkit.local_kafka.admin import create_topics
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    tag = uuid.uuid4().hex[:8]
    create_topics(bootstrap, [f"naive-{tag}", f"naive-out-{tag}"], partitions=1)
    produce_jobs(bootstrap, f"naive-{tag}", photos, n, "n", None)
    net = build_module(open_nsfw_spec().onnx().data).cuda().eval()  # float32, eager
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"naive-{tag}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    p = ck.Producer({"bootstrap.servers": bootstrap})
    c.subscribe([f"naive-{tag}"])
    done, t0 = 0, None
    while done < n:
        m = c.poll(1.0)
        if m is None or m.error() is not None:
            continue
        if t0 is None:
            t0 = time.perf_counter()
        job = msgpack.unpackb(m.value() or b"", raw=False)
        x = torch.from_numpy(preprocess_open_nsfw(decode_image(job["image"]),
                                                  jpeg_roundtrip=False))[None].cuda()
        with torch.no_grad():
            score = net(x)[0].cpu().numpy()
        p.produce(f"naive-out-{tag}", key=job["id"].encode(),
                  value=msgpack.packb({"id": job["id"], "nsfw": float(score[1])}))
        p.poll(0)
        c.commit(message=m, asynchronous=False)
        done += 1
    p.flush(30)
    c.close()
    assert t0 is not None
    return {"jobs": n, "fps": n / (time.perf_counter() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=40000)
    ap.add_argument("--naive-jobs", type=int, default=1000)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--skip-ceilings", action="store_true")
    ap.add_argument("--e2e", default="gpu:1,gpu:2,gpu:4,cpu:4",
                    help="preprocess:processes runs for (c)")
    args = ap.parse_args()
    import torch

    from worker.logs import configure_logging

    configure_logging("WARNING")
    torch.backends.cudnn.benchmark = False
    record: dict[str, Any] = {"benchmark": "pipeline_open_nsfw", "env": environment(),
                              "params": {"jobs": args.jobs, "naive_jobs": args.naive_jobs}}
    args.e2e = [(x.split(":")[0], int(x.split(":")[1])) for x in args.e2e.split(",")]
    record["params"]["e2e_runs"] = args.e2e
    photos = jpeg_photos(4096, seed=0)
    record["params"]["mean_jpeg_bytes"] = float(np.mean([len(p) for p in photos]))
    if not args.skip_ceilings:
        record["a_engine"] = engine_ceiling([1, 8, 32, 64, 128, 256], 30)
        print("a engine:", [(r["batch"], round(r["img_s"])) for r in record["a_engine"]],
              flush=True)
        record["a_preprocess"] = preprocess_ceilings(photos)
        print("a preprocess:", record["a_preprocess"], flush=True)
        record["b_stages"] = [stage_times(256, False), stage_times(128, True)]
        record["b_overlap"] = [overlap_vs_serial(False, 256, 24),
                               overlap_vs_serial(True, 128, 48)]
        print("b:", record["b_stages"], record["b_overlap"], flush=True)
    if not args.skip_e2e:
        _end_to_end_runs(args, record, photos)
    print("wrote", write("pipeline", record, args.out))


def _end_to_end_runs(args: Any, record: dict[str, Any], photos: list[bytes]) -> None:
    from bench.kafka.tansu import Tansu

    broker = Tansu(Path(args.out or ".") / "tansu.log")
    bootstrap = broker.start()
    try:
        e2e = [end_to_end(bootstrap, photos, args.jobs, pre, None, procs)
               for pre, procs in args.e2e]
        record["c_sustained"] = e2e
        print("c sustained:", e2e, flush=True)
        best_run = max(e2e, key=lambda e: e["sustained_fps"])
        half = best_run["sustained_fps"] / 2
        record["c_latency"] = end_to_end(bootstrap, photos, min(int(half * 10), 150_000),
                                         str(best_run["preprocess"]), half,
                                         int(best_run["worker_processes"]))
        print("c latency:", record["c_latency"], flush=True)
        if args.naive_jobs:
            record["d_naive"] = naive(bootstrap, photos, args.naive_jobs)
            print("d naive:", record["d_naive"], flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
