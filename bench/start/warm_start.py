"""Warm start as a user meets it: `trt-worker run` started as a fresh process, broker already
up, one job waiting in the topic; seconds from the process's start to its result at a reader.
The group has a committed offset before the job, as a restarted worker's group has
(``--fresh-group``: a new group, as the older records measured).

Per task (open_nsfw moderation on the torch backend with GPU preprocessing; SD 1.5 generation
with random weights, one 512x512 image of 20 steps), the first run builds the engine cache and
the next ``--runs`` load it. Each run gets fresh topics and group. The worker's stderr lines
are time-stamped as they arrive, so the record also gives the process start to its
``worker_started`` line (imports, engine load, warm-up, before the consumer subscribes).

    python bench/start/warm_start.py --out DIR [--tasks moderation,generation] [--runs 2]

The broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else a LocalKafka (Apache Kafka from the jars;
``JAVA_HOME`` and ``KTW_CACHE_DIR`` as bench/device_kafka.sh sets them). ``--cpu`` runs the
embedded default instead (ONNX Runtime, the CPU machine), for a dry run or the CPU figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402


def sections(task: str, tag: str, cache: Path, blobs: Path, cpu: bool,
             model_extra: dict[str, Any] | None = None,
             engines_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config sections a user of ``task`` writes, as the worker's env overrides take them
    (``model_extra``: more of moderation's model section, e.g. another backend and its profiles,
    or of the generation section, e.g. ``{"backend": "aoti"}``; ``engines_extra``: more of the
    engines section, e.g. ``{"autotune": false}`` for packages built without max-autotune)."""
    topics = {"jobs": f"jobs-{tag}", "results": f"results-{tag}", "dlq": f"dlq-{tag}"}
    common = {"kafka": {"group_id": f"warm-{tag}", "client_id": f"warm-{tag}"},
              "engines": {"cache_dir": str(cache)} | (engines_extra or {}),
              "log": {"level": "INFO"},
              "metrics": {"port": 0}}  # several runs (and other benches) on one machine
    if task == "moderation":
        model = {} if cpu else {"backend": "torch", "preprocess": "gpu",
                                "jpeg_roundtrip": False}
        model |= model_extra or {}
        return common | {"topics": topics, "model": model}
    gen = {"random_weights": "tiny" if cpu else "sd15", "backend": "torch",
           "device": "cpu" if cpu else "cuda:0",
           "sizes": [{"width": 64, "height": 64}] if cpu else [{"width": 512, "height": 512}],
           "text_batch_sizes": [2], "unet_batch_sizes": [2], "vae_batch_sizes": [1],
           "max_images_per_job": 1, "max_images_per_batch": 1, "blob": {"local_dir": str(blobs)},
           "topics": {f: f"gen-{t}" for f, t in topics.items()}} | (model_extra or {})
    return common | {"processing": {"task": "generation"},
                     "topics": {f: f"mod-{t}" for f, t in topics.items()}, "generation": gen,
                     "batch": {"max_batch_size": 1}}


def job(task: str, cpu: bool) -> tuple[str, bytes]:
    if task == "moderation":
        from worker.bundled import samples_dir
        from worker.tools.produce import encode_job

        return "warm-1", encode_job("warm-1", (samples_dir() / "astronaut.jpg").read_bytes())
    from worker.wire.generation_codec import encode_generation_job

    side = 64 if cpu else 512
    return "warm-1", encode_generation_job("warm-1", "a red bicycle against a white wall",
                                           width=side, height=side, steps=20,
                                           scheduler="ddim", seed=1, num_images=1)


def one_run(bootstrap: str, task: str, cache: Path, blobs: Path, cpu: bool,
            timeout_s: float, profile: Path | None = None,
            model_extra: dict[str, Any] | None = None,
            engines_extra: dict[str, Any] | None = None,
            fresh_group: bool = False) -> dict[str, Any]:
    import confluent_kafka as ck

    from worker.devkit.local_kafka.admin import create_topics

    tag = uuid.uuid4().hex[:8]
    cfg = sections(task, tag, cache, blobs, cpu, model_extra, engines_extra)
    tp = cfg["generation"]["topics"] if task == "generation" else cfg["topics"]
    create_topics(bootstrap, [tp["jobs"], tp["results"], tp["dlq"]], partitions=1)
    if task == "generation":  # the moderation topics the generation worker also checks
        create_topics(bootstrap, list(cfg["topics"].values()), partitions=1)
    key, value = job(task, cpu)
    producer = ck.Producer({"bootstrap.servers": bootstrap})
    producer.produce(tp["jobs"], key=key.encode(), value=value)
    producer.flush(10)
    if not fresh_group:
        # A restart: the group has the offset its previous process committed (here 0, with
        # the job after it). A group without one starts with librdkafka's offset reset, which
        # waits a fixed 100 ms before asking for the log's start (on the VM).
        group = ck.Consumer({"bootstrap.servers": bootstrap,
                             "group.id": cfg["kafka"]["group_id"]})
        group.commit(offsets=[ck.TopicPartition(tp["jobs"], 0, 0)], asynchronous=False)
        group.close()
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{tag}",
                          "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    reader.assign([ck.TopicPartition(tp["results"], 0, ck.OFFSET_BEGINNING),
                   ck.TopicPartition(tp["dlq"], 0, ck.OFFSET_BEGINNING)])
    reader.consume(1, 0.5)  # connected and positioned before the clock starts
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, PYTHONUNBUFFERED="1")
    env |= {f"KTW_{k.upper()}": json.dumps(v) for k, v in cfg.items()}
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "worker", "run"], env=env, cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    spy = None
    if profile is not None:  # py-spy attaches to the worker (it writes when the worker exits)
        spy = subprocess.Popen([py_spy(), "record", "--rate", "250", "--format", "speedscope",
                                "-o", str(profile), "--pid", str(proc.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - t0, line.rstrip()))

    pump = threading.Thread(target=read_stderr, daemon=True)
    pump.start()
    got: dict[str, Any] = {}
    try:
        while time.monotonic() - t0 < timeout_s and proc.poll() is None:
            for m in reader.consume(10, 0.005):
                if m.error() is None and m.key() == key.encode():
                    got = {"topic": "dlq" if m.topic() == tp["dlq"] else "results",
                           "s": time.monotonic() - t0, "timings": job_timings(m.value())}
            if got:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        reader.close()
        pump.join(5)
        if spy is not None:
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()

    events = []
    for t, line in lines:
        with contextlib.suppress(ValueError):
            events.append((round(t, 3), json.loads(line)))

    def first(event: str) -> float | None:
        return next((t for t, e in events if e.get("event") == event), None)

    started: dict[str, Any] = next((e for _, e in events if e.get("event") == "worker_started"), {})
    out: dict[str, Any] = {"task": task, "first_result_s": round(got["s"], 3) if got else None,
                           "answered_on": got.get("topic"),
                           # The job's own stage times as its result reports them (ms).
                           "job_timings": got.get("timings"),
                           "to_worker_started_s": first("worker_started"),
                           "to_partitions_assigned_s": first("partitions_assigned"),
                           "startup_s": started.get("startup_s"),
                           # The task's own warm-up steps where it reports them (GPU pipeline).
                           "warm_up_steps_s": next((e.get("steps_s") for _, e in events
                                                    if e.get("event") == "task_warmed"), None),
                           "events": [(t, e.get("event")) for t, e in events][:20],
                           # Per engine and pipeline: import, load, graphs (engines' own lines).
                           "activations": [(t, e.get("event")) for t, e in events
                                           if str(e.get("event", "")).startswith(
                                               ("engine_activated", "pipeline_activated"))]}
    if not got:
        out["stderr_tail"] = [line for _, line in lines[-15:]]
    return out


def job_timings(value: bytes | None) -> Any:
    from worker.exceptions import JobRejected
    from worker.wire.msgpack_map import unpack_map

    try:
        return unpack_map(value or b"").get("timings_ms")
    except JobRejected:  # not a result map
        return None


def py_spy() -> str:
    import shutil

    # On the GPU machine the wheel is installed with --target: its script sits in <target>/bin.
    beside = [Path(p) / "bin" / "py-spy" for p in sys.path if p]
    found = shutil.which("py-spy") or next((str(p) for p in beside if p.is_file()), None)
    if found is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tasks", default="moderation,generation")
    ap.add_argument("--runs", type=int, default=2, help="runs with the engine cached")
    ap.add_argument("--cpu", action="store_true", help="the embedded default (no GPU)")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--cache", type=Path, default=None,
                    help="engine cache folder for every run (default: a fresh one per task, "
                         "so the first run builds)")
    ap.add_argument("--moderation-model", type=json.loads, default=None,
                    help='JSON merged into moderation\'s model section, e.g. '
                         '\'{"backend": "aoti", "profiles": [...]}\'')
    ap.add_argument("--generation", type=json.loads, default=None,
                    help='JSON merged into the generation section, e.g. \'{"backend": "aoti"}\'')
    ap.add_argument("--engines", type=json.loads, default=None,
                    help='JSON merged into the engines section, e.g. \'{"autotune": false}\'')
    ap.add_argument("--fresh-group", action="store_true",
                    help="a new consumer group per run, as the older records (default: "
                         "the group has a committed offset, as a restarted worker's has)")
    ap.add_argument("--profile", action="store_true",
                    help="one more cached run per task under py-spy (speedscope JSON in --out)")
    args = ap.parse_args()
    record: dict[str, Any] = {"benchmark": "warm_start", "env": environment(),
                              "params": vars(args) | {"out": str(args.out),
                                                         "cache": str(args.cache)},
                              # Precompiled bytecode (an installed image's) or none.
                              "pycache_prefix": os.environ.get("PYTHONPYCACHEPREFIX"),
                              "dont_write_bytecode": bool(sys.flags.dont_write_bytecode)}
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
        if bootstrap:
            record["broker"] = {"kind": "env"}
        else:
            from worker.devkit.local_kafka import LocalKafka

            broker = LocalKafka()
            stack.callback(broker.stop)
            bootstrap = broker.start()
            record["broker"] = {"kind": "Apache Kafka (LocalKafka, KRaft, single node)",
                                "group.initial.rebalance.delay.ms": 0}
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="warm-start-")))
        for task in args.tasks.split(","):
            cache = args.cache or work / f"cache-{task}"
            extra = args.moderation_model if task == "moderation" else args.generation
            runs = []
            for _ in range(args.runs + 1):
                before = set(cache.glob("*/*/sidecar.json"))
                r = one_run(bootstrap, task, cache, work / "blobs", args.cpu, args.timeout,
                            model_extra=extra, engines_extra=args.engines,
                            fresh_group=args.fresh_group)
                built = set(cache.glob("*/*/sidecar.json")) - before
                r["engine_cache"] = "built by this run" if built else "cached"
                print(json.dumps(r), flush=True)
                runs.append(r)
            if args.profile:
                target = (args.out or Path(".")) / f"warm-start-{task}.speedscope.json"
                r = one_run(bootstrap, task, cache, work / "blobs", args.cpu, args.timeout,
                            profile=target, model_extra=extra, engines_extra=args.engines,
                            fresh_group=args.fresh_group)
                r["engine_cache"], r["profile"] = "cached, under py-spy", target.name
                print(json.dumps(r), flush=True)
                runs.append(r)
            record[task] = runs
    print("wrote", write("warm-start", record, args.out))


if __name__ == "__main__":
    main()
