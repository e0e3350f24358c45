"""Does the loop keep a timed engine busy? The production loop, codec, batcher and committer over
a backlog of 1 KB jobs, with an "engine" that takes ``--engine-ms`` per batch on its own threads
(a GPU's batch time, without a GPU), under the shipped batch settings (``[batch]`` defaults:
16 jobs, 2 in flight, 50 ms poll timeout, pause at 512 held) and under the GPU benchmarks'.

Reported per setting: jobs/s, against the engine-bound ceiling (batches in flight x batch size /
engine time) and the loop alone (the same settings, the engine answering at once). A loop that
only launches batches after its consume() call returns idles the engine while it waits there.

    python bench/kafka/loop_gaps.py [--jobs 20000] [--engine-ms 2] [--torch-heap] [--gc python]
                              [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, gc_totals, write
from bench.kafka.passthrough_bench import InstantTask, create, fill

SETTINGS = {
    "shipped": {},
    "gpu_bench": {"max_batch_size": 128, "max_delay_ms": 4, "max_in_flight_batches": 4,
                  "high_watermark": 8192, "low_watermark": 2048, "poll_timeout_ms": 5},
}


class TimedTask(InstantTask):
    """InstantTask whose batches take ``engine_s`` each, on one thread per batch in flight."""

    def __init__(self, cfg: Any, engine_s: float) -> None:
        super().__init__(cfg)
        self._engine_s = engine_s
        self._pool = ThreadPoolExecutor(cfg.batch.max_in_flight_batches)
        self._flying: list[tuple[Future[list[Any]], int]] = []

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Any]:
        due = self._batcher.schedule(now, now_ms, limit=max(free, 0), force=force)
        for b in due.batches:
            self._flying.append((self._pool.submit(self._run, b), len(b.items)))
        return []

    def _run(self, batch: Any) -> list[Any]:
        time.sleep(self._engine_s)
        return self._answers(batch, time.monotonic())

    def collect(self, *, block: bool) -> list[Any]:
        out: list[Any] = []
        keep = []
        for fut, n in self._flying:
            if block or fut.done():
                out += fut.result()
            else:
                keep.append((fut, n))
        self._flying = keep
        return out

    def held(self) -> int:
        return len(self._batcher) + sum(n for _, n in self._flying)

    def in_flight(self) -> int:
        return len(self._flying)

    def wait(self, timeout: float) -> None:
        if self._flying:
            wait([f for f, _ in self._flying], timeout=timeout, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def run(bootstrap: str, n: int, batch: dict[str, Any], engine_s: float | None,
        partitions: int, gc: dict[str, Any] | None = None) -> dict[str, Any]:
    import threading

    from worker.config import load_config
    from worker.logs import configure_logging
    from worker.loop.build import build_worker

    configure_logging("WARNING")
    tag = uuid.uuid4().hex[:8]
    create(bootstrap, [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}"], partitions)
    fill(bootstrap, f"jobs-{tag}", n, 1024)
    cfg = load_config(kafka={"bootstrap_servers": bootstrap, "group_id": f"g-{tag}"},
                      topics={"jobs": f"jobs-{tag}", "results": f"results-{tag}",
                              "dlq": f"dlq-{tag}"}, batch=batch, log={"level": "WARNING"},
                      metrics={"port": 0}, gc=gc or {})
    task = InstantTask(cfg) if engine_s is None else TimedTask(cfg, engine_s)
    worker = build_worker(cfg, task)
    th = threading.Thread(target=worker.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 300
    while worker.stats.consumed == 0 and time.monotonic() < deadline:
        time.sleep(0.0005)
    t0 = time.perf_counter()
    while time.monotonic() < deadline and not (
            worker.stats.results >= n and worker.committer.pending() == 0):
        time.sleep(0.001)
    took = time.perf_counter() - t0
    worker.stop()
    th.join(60)
    b = cfg.batch
    out: dict[str, Any] = {"jobs_s": round(worker.stats.results / took),
                           "results": worker.stats.results, "seconds": round(took, 2),
                           "pauses": worker.stats.pauses,
                           "gc_pauses": gc_totals(worker.heap)}
    if engine_s is not None:
        out["engine_bound_jobs_s"] = round(b.max_in_flight_batches * b.max_batch_size / engine_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--engine-ms", type=float, default=2.0)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--settings", default="shipped,gpu_bench")
    ap.add_argument("--torch-heap", action="store_true",
                    help="import torch and torch._inductor first: the heap a GPU worker carries")
    ap.add_argument("--gc", default="shipped", choices=["shipped", "python"],
                    help="the worker's [gc] defaults, or Python's collector left as it is")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from worker.devkit.local_kafka import DEFAULT_VERSION, kafka_from_env_or_local

    if args.torch_heap:
        import torch
        import torch._inductor  # noqa: F401
    gc = {} if args.gc == "shipped" else {"freeze_after_warm_up": False, "young_threshold": 0}

    record: dict[str, Any] = {"benchmark": "loop_gaps", "env": environment(),
                              "params": vars(args) | {"out": str(args.out)},
                              "broker": {"kind": "Apache Kafka", "version": DEFAULT_VERSION},
                              "runs": {}}
    with kafka_from_env_or_local() as bootstrap:
        for name in args.settings.split(","):
            batch = SETTINGS[name]
            timed = run(bootstrap, args.jobs, batch, args.engine_ms / 1e3, args.partitions, gc)
            alone = run(bootstrap, args.jobs, batch, None, args.partitions, gc)
            record["runs"][name] = {"batch": batch, "timed_engine": timed, "loop_alone": alone}
            print(f"{name}: {timed['jobs_s']:,} jobs/s with a {args.engine_ms} ms engine "
                  f"(engine-bound {timed['engine_bound_jobs_s']:,}, {timed['pauses']} pauses); "
                  f"loop alone {alone['jobs_s']:,}; gc {timed['gc_pauses']}", flush=True)
    print("wrote", write("loop-gaps", record, args.out))


if __name__ == "__main__":
    main()
