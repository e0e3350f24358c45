"""Both tasks in one worker process (``trt-worker run --task moderation,generation``) under live
load: what moderation latency does while generation runs at full load, and what generation
throughput gives up for it, per ``processing.gpu_yield_ms`` (worker/tasks/gpu_share.py),
``processing.gpu_priority`` (moderation's CUDA streams at the device's highest priority) and
``processing.gpu_free_sms`` (SMs generation leaves free; the worker's default applies unless a
variant sets it: ``0:on+processing.gpu_free_sms=0`` is generation on every SM).

Per variant (``--variants YIELD_MS:on|off|auto[+SECTION.KEY=VALUE...],...``, or each
``--yield-ms`` value with the priority "auto", the worker's default: on only where generation
leaves no SMs free; a variant's ``+`` settings go to its worker only):
fresh topics and groups, one worker process serving both tasks, a warm-up
(moderation jobs and one generation job answered), then three phases:

1. generation alone: a closed-loop feeder keeps ``--gen-outstanding`` generation jobs
   unanswered (full load without an unbounded backlog); images/s over the steady window;
2. moderation alone: an open-loop producer process at ``--mod-rate`` jobs/s
   (bench/frames_e2e.py's ``one_rate``: latency from the scheduled send time to the result's
   arrival, p50/p99 over the steady window, HdrHistogram);
3. both: the feeder and the producer together; moderation p50/p99 and generation images/s
   over the same window (the feeder's window starts when the producer's schedule does);
   ``timeline``: each moderation job of that window slower than ``--slow-ms`` (its due time
   and latency) and each generation result's arrival, in seconds from the window's start, so
   a tail can be set against generation's batches; with each batch's stages laid out from its
   results' ``timings_ms`` (``gen_stages``: text encoding, denoising, VAE, image checks, PNG)
   and the slow jobs counted by the stage running when they were due (``slow_by_gen_stage``).

In both moderation phases the worker's histograms (bench/worker_metrics.py: per task its hops,
engine seconds per batch, batch sizes; the collector's pauses) are read at the window's start
and end (``worker_metrics``): a tail beside generation shows in the hop that grew.

Moderation jobs are the bundled sample photos at 320x240 (bench/cpu_e2e.py's ``make_jpeg``).
``--tiny``: the tiny random SD engines on the CPU at 64x64 and 4 steps, a smoke run for any
machine; without it, SD 1.5's architecture with random weights at 512x512 and ``--steps``
(speed does not depend on the weights), on the GPU. Worker settings: ``--set
section.key=value`` (e.g. ``--set model.backend=torch``), ``--gen-json`` merged into the
generation section.

python bench/generation/two_tasks.py --tiny --mod-rate 10 --warmup-s 2 --steady-s 8
python bench/generation/two_tasks.py --mod-rate 200 --yield-ms 0,5 --set model.backend=torch
python bench/generation/two_tasks.py --mod-rate 2000 --variants 0:off,0:on,5:on ...
python bench/generation/two_tasks.py --variants 0:on,0:on+batch.max_delay_ms=2 ...

The record's ``targets`` (bench/generation/two_tasks_pool.py) sets each variant against the
two targets (moderation p99 <= 25 ms beside generation, generation >= 80% of its rate alone);
generation's share of its rate alone on every SM needs a variant with
``processing.gpu_free_sms=0`` in the same call (``0:on+processing.gpu_free_sms=0``).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, provenance, write
from bench.cpu_e2e import (
    REPO,
    WORKER_STOP_TIMEOUT_S,
    BenchFailed,
    Reader,
    create_topics,
    kill_worker,
    local_kafka_class,
    log_tail,
    make_jpeg,
    produce_jobs,
    stop_worker,
    worker_env,
)
from bench.frames_e2e import due_time, one_rate
from bench.generation.two_tasks_pool import targets, variant_name
from worker.devkit.local_kafka.config import free_port

WARMUP_MOD_JOBS = 8
TINY_SIDE, TINY_STEPS = 64, 4
FULL_SIDE = 512


def frames() -> list[bytes]:
    from worker.bundled import samples_dir

    paths = sorted(p for p in samples_dir().iterdir()
                   if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not paths:
        raise BenchFailed(f"no sample images in {samples_dir()}")
    return [make_jpeg(p) for p in paths]


def generation_settings(args: argparse.Namespace, topics: dict[str, str],
                        cache: Path) -> dict[str, Any]:
    if args.tiny:
        g: dict[str, Any] = {
            "random_weights": "tiny", "backend": "torch", "device": "cpu",
            "warm_up": "first_use", "sizes": [{"width": TINY_SIDE, "height": TINY_SIDE}],
            "text_batch_sizes": [2, 4], "unet_batch_sizes": [2, 4], "vae_batch_sizes": [1, 2],
            "max_steps": max(args.steps, TINY_STEPS), "max_images_per_job": 1,
            "png_threads": 1}
    else:
        g = {"random_weights": "sd15", "max_images_per_job": 1}
    return g | {"topics": topics, "blob": {"local_dir": str(cache / "blobs")}} | args.gen_json


class GenFeeder(threading.Thread):
    """Closed loop: keeps ``outstanding`` generation jobs unanswered until stopped."""

    def __init__(self, bootstrap: str, topic: str, reader: Reader, prefix: str,
                 outstanding: int, job: dict[str, Any]) -> None:
        super().__init__(daemon=True, name=f"gen-feeder-{prefix}")
        self.bootstrap, self.topic, self.reader, self.prefix = bootstrap, topic, reader, prefix
        self.outstanding, self.job = outstanding, job
        self.sent = 0
        self.halt = threading.Event()
        self.error: str | None = None

    def answered(self) -> int:
        with self.reader.lock:
            return sum(1 for k in [*self.reader.results, *self.reader.dlq]
                       if k.startswith(self.prefix))

    def run(self) -> None:
        import confluent_kafka as ck

        from worker.wire.generation_codec import encode_generation_job

        p = ck.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "acks": "all",
                         "enable.idempotence": True, "log_level": 3})
        try:
            while not self.halt.is_set():
                while self.sent - self.answered() < self.outstanding:
                    job_id = f"{self.prefix}{self.sent}"
                    p.produce(self.topic, key=job_id.encode(),
                              value=encode_generation_job(job_id, **self.job))
                    self.sent += 1
                p.poll(0)
                time.sleep(0.005)
        except Exception as exc:  # noqa: BLE001 - reported in the record
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            p.flush(30)

    def images_per_s(self, t0: float, t1: float) -> float:
        with self.reader.lock:
            n = sum(1 for k, (arrival, _) in self.reader.results.items()
                    if k.startswith(self.prefix) and t0 <= arrival < t1)
        return round(n * self.job["num_images"] / (t1 - t0), 3)

    def finish(self, drain_s: float) -> dict[str, Any]:
        self.halt.set()
        self.join(30)
        deadline = time.monotonic() + drain_s
        while self.answered() < self.sent and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"sent": self.sent, "answered": self.answered(), "error": self.error}


def _wait(what: str, done: Any, proc: subprocess.Popen[bytes], log_path: Path,
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchFailed(f"{what} not answered (worker exit {proc.poll()}); log "
                              f"{log_path}:\n{log_tail(log_path)}")
        time.sleep(0.1)


# gpu_yield_ms, gpu_priority (True, False or "auto"), its own settings
Variant = tuple[float, bool | str, dict[str, str]]


def parse_variants(spec: str | None, yield_ms: str) -> list[Variant]:
    """``--variants`` ("0:off,5:on+batch.max_delay_ms=2", "0:auto"), else each
    ``--yield-ms`` value with the priority "auto", the worker's default: (gpu_yield_ms,
    gpu_priority, settings) per worker process."""
    if not spec:
        return [(float(y), "auto", {}) for y in yield_ms.split(",") if y]
    out = []
    for item in spec.split(","):
        head, *settings = item.split("+")
        y, _, prio = head.partition(":")
        if prio not in ("on", "off", "auto"):
            raise ValueError(f"variant {item!r}: YIELD_MS:on, YIELD_MS:off or YIELD_MS:auto")
        extra = {}
        for kv in settings:
            key, eq, value = kv.partition("=")
            if not eq or "." not in key:
                raise ValueError(f"variant {item!r}: +SECTION.KEY=VALUE, not {kv!r}")
            extra[key] = value
        out.append((float(y), "auto" if prio == "auto" else prio == "on", extra))
    return out


def worker_overrides(common: dict[str, str], variant: Variant, generation: dict[str, Any]
                     ) -> dict[str, str]:
    """A variant's worker settings: ``common`` (``--set``), the two-task ones, the generation
    section as JSON, then the variant's own: its ``generation.*`` settings go into that JSON
    (values parsed as JSON where they parse: ``generation.vae_batch_sizes=[1]``), the rest
    as they are."""
    yield_ms, priority, extra = variant
    own_gen = {k.removeprefix("generation."): _value(v) for k, v in extra.items()
               if k.startswith("generation.")}
    return dict(common) | {
        "processing.task": "moderation,generation", "processing.gpu_yield_ms": str(yield_ms),
        "processing.gpu_priority": str(priority).lower(),
        "processing.max_batch_ms": "120000", "kafka.transaction_timeout_ms": "300000",
        "generation": json.dumps(generation | own_gen)} | {
        k: v for k, v in extra.items() if not k.startswith("generation.")}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# A generation batch's stages in the order they run (worker/tasks/generation/task.py), each a
# duration in its results' ``timings_ms``; the last ends about when its results arrive.
GEN_STAGES = ("prompt_check", "engines_wait", "text", "denoise", "vae", "moderation", "png")


def gen_stages(arrival: float, timings: dict[str, float]) -> list[tuple[str, float, float]]:
    """A generation result's stages as (stage, start, end) wall times, laid back to back from
    its arrival (the output step and the reader's delivery, a few ms, are not in them)."""
    out, end = [], arrival
    for stage in reversed(GEN_STAGES):
        ms = timings.get(stage)
        if isinstance(ms, (int, float)) and ms > 0:
            out.append((stage, end - ms / 1e3, end))
            end -= ms / 1e3
    return out[::-1]


def batch_stages(arrived: list[tuple[str, float]], timings: dict[str, dict[str, float]],
                 t0: float) -> list[list[list[Any]]]:
    """Each generation batch's stages as [stage, start, end] seconds from ``t0``, batches in
    time order. A batch's results share their stage timings (the same stamps): it is laid out
    once, from the first of them to arrive."""
    first: dict[tuple[tuple[str, float], ...], float] = {}
    for k, arrival in arrived:
        if k in timings:
            stamps = tuple((st, timings[k][st]) for st in GEN_STAGES if st in timings[k])
            first[stamps] = min(arrival, first.get(stamps, arrival))
    laid = [[[name, round(a - t0, 3), round(b - t0, 3)]
             for name, a, b in gen_stages(arrival, dict(stamps))]
            for stamps, arrival in first.items()]
    return sorted((batch for batch in laid if batch), key=lambda batch: batch[0][1])


def slow_by_stage(slow: list[list[float]], stages: list[list[list[Any]]]
                  ) -> dict[str, dict[str, float]]:
    """The slow jobs ([due, ms]) counted by the generation stage running when each was due
    ("none" between batches), with their median and largest latency. A batch waiting for the
    engines (the other batch in flight holds them) is not what runs then."""
    by: dict[str, list[float]] = {}
    for due, ms in slow:
        running = [name for batch in stages for name, a, b in batch
                   if a <= due < b and name != "engines_wait"]
        by.setdefault(running[0] if running else "none", []).append(ms)
    return {name: {"n": len(v), "p50_ms": round(statistics.median(v), 2), "max_ms": max(v)}
            for name, v in sorted(by.items())}


def timeline(mod: Reader, gen: Reader, mod_prefix: str, gen_prefix: str, start_at: float,
             rate: float, window: tuple[float, float], slow_ms: float, keep: int = 5000
             ) -> dict[str, Any]:
    """The moderation jobs due in ``window`` (wall times) slower than ``slow_ms``, as [due,
    latency ms], and the generation results that arrived in it, as seconds from its start:
    the slowest ``keep`` jobs if there are more. Where the generation reader kept its results'
    stage timings, also ``gen_stages`` (:func:`batch_stages`) and ``slow_by_gen_stage``
    (:func:`slow_by_stage`)."""
    t0, t1 = window
    with mod.lock:
        jobs = [(k, arrival) for k, (arrival, _) in mod.results.items()
                if k.startswith(mod_prefix)]
    with gen.lock:
        arrived = [(k, arrival) for k, (arrival, _) in gen.results.items()
                   if k.startswith(gen_prefix) and t0 <= arrival < t1]
        timings = {k: gen.timings[k] for k, _ in arrived if k in gen.timings}
    slow = []
    for key, arrival in jobs:
        due = due_time(key, mod_prefix, start_at, rate)
        ms = (arrival - due) * 1e3
        if t0 <= due < t1 and ms > slow_ms:
            slow.append([round(due - t0, 4), round(ms, 2)])
    slow = sorted(sorted(slow, key=lambda x: -x[1])[:keep])
    out: dict[str, Any] = {"slow_ms": slow_ms, "slow_mod_jobs": slow,
                           "gen_results_s": sorted(round(a - t0, 4) for _, a in arrived)}
    stages = batch_stages(arrived, timings, t0)
    if stages:
        out["gen_stages"] = stages
        out["slow_by_gen_stage"] = slow_by_stage(slow, stages)
    return out


def one_variant(bootstrap: str, pics: list[bytes], variant: Variant, args: argparse.Namespace,
                logs: Path) -> dict[str, Any]:
    yield_ms, priority, extra = variant
    tag = uuid.uuid4().hex[:8]
    mod = {k: f"two-tasks-mod-{k}-{tag}" for k in ("jobs", "results", "dlq")}
    gen = {k: f"two-tasks-gen-{k}-{tag}" for k in ("jobs", "results", "dlq")}
    create_topics(bootstrap, {mod["jobs"]: args.partitions, gen["jobs"]: args.partitions,
                              **{t[k]: 1 for t in (mod, gen) for k in ("results", "dlq")}})
    readers = {"mod": Reader(bootstrap, mod["results"], mod["dlq"]),
               "gen": Reader(bootstrap, gen["results"], gen["dlq"], keep_timings=True)}
    for r in readers.values():
        r.start()
        if not r.ready.wait(30) or r.error:
            raise BenchFailed(r.error or "results reader not ready after 30 s")
    side = TINY_SIDE if args.tiny else FULL_SIDE
    job = {"prompt": "a red car on a mountain road", "width": side, "height": side,
           "steps": args.steps, "num_images": 1}
    overrides = worker_overrides(args.overrides, variant, generation_settings(args, gen, logs))
    env, _dropped = worker_env(bootstrap, mod, f"two-tasks-{tag}", overrides)
    port = free_port()
    env |= {"KTW_METRICS__PORT": str(port), "KTW_METRICS__HOST": "127.0.0.1"}
    out: dict[str, Any] = {"gpu_yield_ms": yield_ms, "gpu_priority": priority,
                           "settings": extra}
    name = variant_name(out)  # the name the record's targets and the pool use
    log_path = logs / f"worker-{name.replace(' ', '-').replace(',', '')}.log"
    out["worker_log"] = str(log_path)
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "worker", "run"], cwd=REPO, env=env,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        produce_jobs(bootstrap, mod["jobs"], pics[0], WARMUP_MOD_JOBS, "w-")
        warm = GenFeeder(bootstrap, gen["jobs"], readers["gen"], "gw-", 1, job)
        warm.start()
        _wait("the warm-up", lambda: readers["mod"].answered() >= WARMUP_MOD_JOBS
              and warm.answered() >= 1, proc, log_path, args.start_timeout)
        warm.finish(args.drain_s)

        window = args.warmup_s + args.steady_s
        alone = GenFeeder(bootstrap, gen["jobs"], readers["gen"], "ga-", args.gen_outstanding,
                          job)
        t0 = time.time()
        alone.start()
        time.sleep(window)
        out["generation_alone"] = {
            "images_per_s": alone.images_per_s(t0 + args.warmup_s, t0 + window),
            **alone.finish(args.drain_s)}
        print(f"  {name}: generation alone {out['generation_alone']}", flush=True)

        out["moderation_alone"] = one_rate(bootstrap, mod["jobs"], readers["mod"], pics,
                                           args.mod_rate, args, "ma-", [port])
        print(f"  {name}: moderation alone "
              f"{out['moderation_alone']['latency']}", flush=True)

        both = GenFeeder(bootstrap, gen["jobs"], readers["gen"], "gb-", args.gen_outstanding,
                         job)
        both.start()
        step = one_rate(bootstrap, mod["jobs"], readers["mod"], pics, args.mod_rate, args,
                        "mb-", [port])
        t0 = step["schedule_start"]
        steady = (t0 + args.warmup_s, t0 + window)
        out["both"] = {"moderation": step, "generation": {
            "images_per_s": both.images_per_s(*steady), **both.finish(args.drain_s)},
            "timeline": timeline(readers["mod"], readers["gen"], "mb-", "gb-", t0,
                                 args.mod_rate, steady, args.slow_ms)}
        print(f"  {name}: both: moderation {step['latency']}, generation "
              f"{out['both']['generation']}", flush=True)
        out["worker_exit_code"] = stop_worker(proc, WORKER_STOP_TIMEOUT_S)
    finally:
        if proc is not None:
            kill_worker(proc)
        for r in readers.values():
            r.halt.set()
            r.join(15)
    return out


def full_load(gen_json: dict[str, Any]) -> int:
    """One-image generation jobs to keep unanswered so that a full batch always waits while
    another runs: twice the batch's image budget. Fewer leave the GPU idle between batches:
    4.3 images/s alone on every SM of an H100 with four, 5.0 with eight, 6.6 with 32
    (bench/NOTES.md)."""
    from worker.config.generation import GenerationSettings

    budget = gen_json.get("max_images_per_batch",
                          GenerationSettings.model_fields["max_images_per_batch"].default)
    return 2 * int(budget)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true",
                    help="tiny random SD engines on the CPU at 64x64: a smoke run")
    ap.add_argument("--mod-rate", type=float, default=100.0, help="moderation jobs/s offered")
    ap.add_argument("--gen-outstanding", type=int, default=None,
                    help="one-image generation jobs kept unanswered (default: twice the "
                         "generation batch's image budget, so a full batch waits while one "
                         "runs: full load)")
    ap.add_argument("--steps", type=int, default=20, help="denoising steps per generation job")
    ap.add_argument("--yield-ms", default="0", help="processing.gpu_yield_ms values, comma "
                                                    "separated: one worker process each")
    ap.add_argument("--variants", default=None,
                    help="YIELD_MS:on|off|auto[+SECTION.KEY=VALUE...],... (processing.gpu_yield_ms,"
                         " processing.gpu_priority, settings of that variant's worker only): "
                         "one worker process each; overrides --yield-ms")
    ap.add_argument("--slow-ms", type=float, default=25.0,
                    help="moderation jobs slower than this beside generation go to the "
                         "record's timeline")
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--steady-s", type=float, default=30.0)
    ap.add_argument("--drain-s", type=float, default=60.0)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--producers", type=int, default=1,
                    help="moderation producer processes splitting the schedule")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE", help="worker config override (repeatable)")
    ap.add_argument("--gen-json", type=json.loads, default={},
                    help="JSON merged into the generation section")
    ap.add_argument("--machine-note", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.tiny and args.steps == 20:
        args.steps = TINY_STEPS
    args.overrides = dict(kv.split("=", 1) for kv in args.overrides)
    if args.gen_outstanding is None:
        args.gen_outstanding = full_load(args.gen_json)
    variants = parse_variants(args.variants, args.yield_ms)
    yields = [y for y, _, _ in variants]

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds the finally blocks: worker and broker stop

    signal.signal(signal.SIGTERM, on_term)
    pics = frames()
    logs = Path(tempfile.mkdtemp(prefix="ktw-two-tasks-"))
    started = time.monotonic()
    kafka = local_kafka_class()()
    runs: list[dict[str, Any]] = []
    failure: str | None = None
    try:
        bootstrap = kafka.start(timeout=180)
        try:
            for variant in variants:
                runs.append(one_variant(bootstrap, pics, variant, args, logs))
        finally:
            kafka.stop()
    except BenchFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        failure = str(exc)[-2000:]
    record = {
        "bench": "two-tasks", "env": environment(),
        "provenance": {**provenance(), "broker": "local Kafka (KRaft, worker.devkit)",
                       "broker_version": getattr(kafka, "version", None),
                       "machine": args.machine_note},
        "params": {"tiny": args.tiny, "mod_rate": args.mod_rate, "steps": args.steps,
                   "gen_outstanding": args.gen_outstanding, "yield_ms": yields,
                   "variants": [{"gpu_yield_ms": y, "gpu_priority": p, "settings": e}
                                for y, p, e in variants],
                   "slow_ms": args.slow_ms,
                   "warmup_s": args.warmup_s, "steady_s": args.steady_s,
                   "partitions": args.partitions, "worker_config_overrides": args.overrides,
                   "gen_json": args.gen_json,
                   "worker_command": "python -m worker run (processing.task = "
                                     "moderation,generation)"},
        "method": {"moderation": "open loop at mod_rate (bench/frames_e2e.py one_rate): "
                                 "latency from the scheduled send to the result's arrival",
                   "generation": "closed loop, gen_outstanding jobs unanswered; images/s "
                                 "over the steady window"},
        "runs": runs, "targets": targets(runs, args.overrides), "failure": failure,
        "wall_s": round(time.monotonic() - started, 1)}
    name = "two-tasks" + ("-tiny" if args.tiny else "") + (f"-{args.label}" if args.label
                                                            else "")
    path = write(name, record, args.out)
    print(f"record {path}")
    return 1 if failure or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
