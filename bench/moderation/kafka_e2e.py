"""The open_nsfw worker end to end through a real Apache Kafka broker on the GPU machine.

Starts a single-node Apache Kafka 4.x (KRaft) with :class:`LocalKafka` from jars and a JDK
that were carried to the machine (``bench/device_kafka.sh`` does the carrying), sized for the
machine (network/io threads, segment size: recorded in the JSON), then runs, in one process
and one run: the engine alone from device memory (the ceiling; with --stages-procs also the GPU
stages alone in K processes at once, bench/moderation/stages_alone.py), the worker end to end with
pre-produced JPEG jobs (sustained frames/s, K worker processes), produce-to-result latency at
half the best sustained rate, and the naive per-message worker. The figures come from
``bench/moderation/pipeline_bench.py``'s functions, so Tansu and Kafka runs measure the same thing.

``--code-root DIR`` imports the worker and the benchmark functions from another checkout (an
older commit), so two commits are compared on one machine, broker and run:

    python bench/moderation/kafka_e2e.py --out $OUT [--code-root .before] [--procs 1,4] \
        [--jobs 40000]

Needs ``JAVA_HOME`` (a JDK >= 17) and ``KTW_CACHE_DIR`` holding ``kafka-<v>/libs`` (the jars).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]


def _moderation_module(name: str) -> Any:
    """bench.moderation.<name> from the code root; a --code-root checkout older than the bench
    folders has it at bench.<name>, and its own copy is the one that matches its worker."""
    try:
        return importlib.import_module(f"bench.moderation.{name}")
    except ModuleNotFoundError as e:
        if e.name != "bench.moderation":
            raise
        return importlib.import_module(f"bench.{name}")


# The bench broker: more network and io threads than the default 3/8 for 16 host cores,
# segments large enough that a 40k-job run never rolls one.
BROKER = {"num.network.threads": "8", "num.io.threads": "16",
          "log.segment.bytes": str(512 << 20), "socket.send.buffer.bytes": str(1 << 20),
          "socket.receive.buffer.bytes": str(1 << 20),
          # Several worker processes join a group over a backlog: the first assignment waits
          # 3 s after each join, so every process that finished warming up within 3 s of the
          # previous one gets partitions at once (Kafka's own default; LocalKafka uses 0).
          "group.initial.rebalance.delay.ms": "3000"}


def _provenance() -> dict[str, Any]:
    """This bench's own ``bench.common.provenance`` (commit, dirty flag, library versions, CPU),
    loaded by path: ``bench`` itself is the code root's, and an older checkout's records lack
    fields this one has."""
    spec = importlib.util.spec_from_file_location("_bench_common_here",
                                                  HERE / "bench" / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.provenance())


def _local_kafka() -> Any:
    try:
        from worker.devkit.local_kafka import LocalKafka
    except ImportError:  # an older checkout
        from worker.local_kafka import LocalKafka  # type: ignore[no-redef]
    return LocalKafka


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code-root", type=Path, default=HERE)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--procs", default="1,4", help="worker processes per sustained run")
    ap.add_argument("--preprocess", default="gpu")
    ap.add_argument("--naive-jobs", type=int, default=1000)
    ap.add_argument("--engine-sizes", default="1,8,32,128,256")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--gpus", type=int, default=0,
                    help="spread worker processes over this many GPUs, one visible to each "
                         "(process i on GPU i mod N), as `trt-worker run --gpus` does; with "
                         "--procs 1,N the summary gives N GPUs' rate over one GPU's")
    ap.add_argument("--worker-overrides", default="",
                    help='JSON merged over the worker config, e.g. {"batch": '
                         '{"max_in_flight_batches": 8}}')
    ap.add_argument("--mps", action="store_true",
                    help="run the worker processes under a private NVIDIA MPS daemon "
                         "(worker.tools.mps), as `trt-worker run --mps` does")
    ap.add_argument("--half-load-fps", type=float, default=None,
                    help="the latency run's rate (default: half the best sustained rate)")
    ap.add_argument("--half-load-procs", type=int, default=None,
                    help="the latency run's worker processes (default: the best run's)")
    ap.add_argument("--half-load-linger-ms", default="5",
                    help="the job producer's linger.ms in the latency run; several values "
                         "(e.g. 5,0) give one latency run each, in that order")
    ap.add_argument("--stages-procs", default="",
                    help="also measure the GPU stages alone (engine, decode, the task's batch "
                         "path) with these many processes at once, e.g. 1,4 "
                         "(bench/moderation/stages_alone.py), the ceilings for the sustained runs")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="the worker processes' sys.setswitchinterval (Python's default: 5 ms)")
    args = ap.parse_args()
    if args.switch_interval_ms is not None:
        os.environ["BENCH_SWITCH_INTERVAL_MS"] = str(args.switch_interval_ms)
    if args.worker_overrides:
        os.environ["BENCH_WORKER_OVERRIDES"] = args.worker_overrides
    root = args.code_root.resolve()
    sys.path.insert(0, str(root))
    import numpy as np
    import torch

    from bench.common import environment, write
    from bench.corpus import jpeg_photos
    pipeline_bench = _moderation_module("pipeline_bench")
    end_to_end, engine_ceiling, naive = (pipeline_bench.end_to_end, pipeline_bench.engine_ceiling,
                                         pipeline_bench.naive)
    from worker.logs import configure_logging  # (the same module in every checkout so far)

    configure_logging("WARNING")
    torch.backends.cudnn.benchmark = False
    record: dict[str, Any] = {
        "benchmark": "kafka_e2e_open_nsfw", "env": {**_provenance(), **environment()},
        "code_root": str(root), "code_commit": os.environ.get("BENCH_CODE_COMMIT", "unknown"),
        "params": {"jobs": args.jobs, "procs": args.procs, "preprocess": args.preprocess,
                   "naive_jobs": args.naive_jobs, "gpus": args.gpus,
                   "worker_overrides": json.loads(args.worker_overrides or "{}"),
                   "switch_interval_ms": args.switch_interval_ms, "mps": args.mps,
                   "half_load_fps": args.half_load_fps, "half_load_procs": args.half_load_procs,
                   "half_load_linger_ms": args.half_load_linger_ms,
                   "stages_procs": args.stages_procs},
    }
    mps = None
    if args.mps:  # before any worker process starts; the children inherit the variables
        from worker.tools.mps import MpsDaemon

        mps = MpsDaemon()
        os.environ.update(mps.start())
        atexit.register(mps.stop)  # whatever fails after this (stop is idempotent)
    photos = jpeg_photos(4096, seed=0)
    record["params"]["mean_jpeg_bytes"] = float(np.mean([len(p) for p in photos]))
    sizes = [int(s) for s in args.engine_sizes.split(",")]
    record["engine"] = engine_ceiling(sizes, 30)
    print("engine:", [(r["batch"], round(r["img_s"])) for r in record["engine"]], flush=True)
    if args.stages_procs:  # before the broker: the GPU and the host cores to themselves
        stages_alone = _moderation_module("stages_alone").stages_alone

        record["stages_alone"] = []
        for k in (int(p) for p in args.stages_procs.split(",")):
            record["stages_alone"].append(stages_alone(k))
            print("stages alone:", record["stages_alone"][-1], flush=True)
    broker = _local_kafka()(num_partitions=8, extra_config=BROKER)
    t0 = time.monotonic()
    bootstrap = broker.start(timeout=180)
    record["broker"] = {"kind": "Apache Kafka (KRaft, single node)", "version": broker.version,
                        "settings": BROKER, "start_s": round(time.monotonic() - t0, 1),
                        "java_home": os.environ.get("JAVA_HOME", "")}
    try:
        runs = []
        for procs in (int(p) for p in args.procs.split(",")):
            # Every sustained run answers a backlog produced before its processes start; the
            # group's first assignment waits for all of them (BROKER). Producing once they
            # held partitions made the producer the limit (~13k jobs/s here), and the window
            # was misread (pipeline_bench.end_to_end).
            r = end_to_end(bootstrap, photos, args.jobs, args.preprocess, None, procs,
                           args.gpus, produce_after_ready=False)
            runs.append(r)
            print("sustained:", r, flush=True)
        record["sustained"] = runs
        best = max(runs, key=lambda r: r["sustained_fps"])
        if not args.skip_latency:
            half = args.half_load_fps or best["sustained_fps"] / 2
            record["half_load_runs"] = []
            for linger in (float(x) for x in args.half_load_linger_ms.split(",")):
                record["half_load_runs"].append(end_to_end(
                    bootstrap, photos, min(int(half * 10), 100_000), args.preprocess, half,
                    args.half_load_procs or int(best["worker_processes"]), args.gpus,
                    producer_linger_ms=linger))
                print("half load:", record["half_load_runs"][-1], flush=True)
            record["half_load"] = record["half_load_runs"][0]
        if args.naive_jobs:
            record["naive"] = naive(bootstrap, photos, args.naive_jobs)
            print("naive:", record["naive"], flush=True)
        ceiling = max(r["img_s"] for r in record["engine"])
        record["summary"] = {"engine_best_img_s": ceiling, "sustained_best_fps":
                             best["sustained_fps"], "of_engine": best["sustained_fps"] / ceiling}
        for st in record.get("stages_alone", []):
            same = [r for r in runs if r["worker_processes"] == st["procs"] and r["gpus"] == 1]
            if same and "slowest_stage_img_s" in st:
                record["summary"][f"of_slowest_stage_procs_{st['procs']}"] = (
                    same[0]["sustained_fps"] / st["slowest_stage_img_s"])
                record["summary"][f"of_task_alone_procs_{st['procs']}"] = (
                    same[0]["sustained_fps"] / st["task_img_s"])
        if "naive" in record:
            record["summary"]["vs_naive"] = best["sustained_fps"] / record["naive"]["fps"]
        one = [r for r in runs if r["gpus"] == 1 and r["worker_processes"] == 1]
        if args.gpus > 1 and one:
            record["summary"]["gpu_scaling"] = {
                f"{r['gpus']}_gpus_over_1": r["sustained_fps"] / one[0]["sustained_fps"]
                for r in runs if r["gpus"] > 1}
            # A ratio holds only when every process answered its share (one that joined the
            # group late would leave its GPU idle part of the window).
            record["summary"]["gpu_scaling_valid"] = all(
                r.get("process_share_min_over_max", 0) >= 0.95 for r in runs if r["gpus"] > 1)
        if mps is not None:
            record["mps_servers"] = mps.servers()
    finally:
        broker.stop()
    print("summary:", record.get("summary"), flush=True)
    print("wrote", write("kafka-e2e", record, args.out))


if __name__ == "__main__":
    main()
