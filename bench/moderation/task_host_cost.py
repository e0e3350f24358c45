"""What the moderation task costs the worker's loop thread per job, with the decode and the engine
taken out, for this checkout and an older one (``--code-root``), alternating, in one call.

The GPU end-to-end figure of one worker process is set by its Python loop thread (the engine
and the decoders have room to spare), so a per-job cost that moves onto the loop thread shows
there. This runs the served task as the worker builds it (``moderation_task(cfg)``: the CPU
default, open_nsfw alone) through the Task protocol the loop drives (admit a consumed batch,
schedule, collect) with two of the model's own steps replaced: the image decode returns a
ready 224x224 row and the engine returns fixed scores at once, so everything the worker does
per job between the two (intake decode, parts and batching, scoring, the policy decision, the
result, its encoding) runs as it does in production. The loop's Kafka side is not in it
(bench/kafka/passthrough_bench.py measures that).

Per run: the loop thread's CPU microseconds per job (its own CPU clock), the batch threads'
(the process's CPU less the loop's), jobs per second of wall time on this loop alone, and the
young-generation collections. Two modes per round: ``threads`` (batches on the task's own
batch threads, as in the worker: on a 2-core machine they compete with the loop, so its
figures spread) and ``inline`` (each batch runs on the loop thread as it is submitted: the
loop's CPU per job is then all of the task's Python work per job, the figure that the GIL
makes count whichever thread does it). Each side runs in its own interpreter (its own
``worker`` package); ``--rounds`` alternate the sides.

    python bench/moderation/task_host_cost.py [--code-root DIR] [--jobs 60000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONSUMED = 500  # records per consumed batch (consume(num_messages=...) gives up to this)


def _side(code_root: Path, jobs: int, inline: bool) -> dict[str, Any]:
    """One run, in this interpreter, of the worker package under ``code_root``."""
    sys.path.insert(0, str(code_root))
    from concurrent.futures import Future

    import msgpack
    import numpy as np

    from worker.config import load_config
    from worker.tasks.moderation.factory import moderation_task
    from worker.tasks.protocol import ConsumedBatch
    from worker.wire.records import SourceRecord

    cfg = load_config(
        kafka={"bootstrap_servers": "unused:9092", "group_id": "g"},
        topics={"jobs": "jobs", "results": "results", "dlq": "dlq"},
        batch={"max_batch_size": 128, "max_delay_ms": 4, "max_in_flight_batches": 4},
        log={"level": "WARNING"})
    task: Any = moderation_task(cfg)
    # The model's decode and engine steps (same names in both layouts: the open_nsfw task of
    # older checkouts, the open_nsfw model of the moderation task now).
    old_layout = not hasattr(task, "models")
    model = task if old_layout else task.models["open_nsfw"]
    row = np.zeros((1, 224, 224, 3), np.float32)
    scores = np.tile(np.array([[0.9, 0.1]], np.float32), (128, 1))
    model._prepare = lambda p: row
    if old_layout:
        model._infer_chunks = lambda rows, profile: (scores[: len(rows)], {})
    else:
        model._infer_chunks = lambda rows, profile: scores[: len(rows)]
    if inline:
        def at_once(fn: Any, *args: Any) -> Future[Any]:
            done: Future[Any] = Future()
            done.set_result(fn(*args))
            return done

        for name in ("_pool", "_batch_pool"):  # the batch threads (older layout: _batch_pool)
            if hasattr(task, name):
                getattr(task, name).submit = at_once

    image = sorted((REPO / "worker" / "samples").glob("*.jpg"))[0].read_bytes()
    values = [msgpack.packb({"v": 1, "id": f"job-{i:08d}", "image": image})
              for i in range(jobs)]
    records = [SourceRecord("jobs", i % 6, i // 6, f"job-{i:08d}".encode(), v, [], 0)
               for i, v in enumerate(values)]
    free_max = cfg.batch.max_in_flight_batches
    answered = 0
    # The worker's collector policy once warm (worker.loop.heap, the shipped [gc] settings):
    # without it, young collections triggered by the jobs' allocations dominate the figures.
    gc.collect()
    gc.freeze()
    gc.set_threshold(cfg.gc.young_threshold, *gc.get_threshold()[1:])
    young0 = gc.get_stats()[0]["collections"]
    loop0, cpu0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
    at = 0
    while answered < jobs:
        if at < jobs:
            chunk = records[at:at + CONSUMED]
            at += len(chunk)
            answered += len(task.admit(ConsumedBatch(chunk, {}, time.monotonic())))
        now = time.monotonic()
        answered += len(task.schedule(now, int(time.time() * 1e3),
                                      free=free_max - task.in_flight(), force=at >= jobs))
        answered += len(task.collect(block=task.in_flight() >= free_max))
    loop_s, cpu_s = time.thread_time() - loop0, time.process_time() - cpu0
    wall = time.perf_counter() - t0
    young = gc.get_stats()[0]["collections"] - young0
    task.close()
    return {"jobs": jobs, "answered": answered, "wall_s": wall, "jobs_per_s": jobs / wall,
            "loop_us_per_job": loop_s / jobs * 1e6,
            "other_threads_us_per_job": (cpu_s - loop_s) / jobs * 1e6,
            "young_collections": young, "mode": "inline" if inline else "threads"}


def _run_side(code_root: Path, jobs: int, inline: bool) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--side", str(code_root), "--jobs", str(jobs),
         *(["--inline"] if inline else [])],
        check=True, capture_output=True, text=True, cwd=code_root,
        env={**os.environ, "PYTHONPATH": str(code_root)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code-root", type=Path, default=None,
                    help="an older checkout to run beside this one (e.g. .before)")
    ap.add_argument("--jobs", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    if a.side is not None:
        print(json.dumps(_side(a.side, a.jobs, a.inline)))
        return

    sys.path.insert(0, str(REPO))
    from bench.common import environment, median, write
    from bench.frames_e2e import code_provenance

    sides = {"this": REPO} | ({"older": a.code_root.resolve()} if a.code_root else {})
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(a.rounds):
        for name, root in (sides.items() if r % 2 == 0 else reversed(sides.items())):
            for inline in (False, True):
                res = _run_side(root, a.jobs, inline)
                runs[name].append(res)
                print(f"round {r + 1} {name} {res['mode']}: loop {res['loop_us_per_job']:.2f} "
                      f"us/job, other threads {res['other_threads_us_per_job']:.2f}, "
                      f"{res['jobs_per_s']:.0f} jobs/s, {res['young_collections']} young GCs",
                      flush=True)

    def stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
        loop = [x["loop_us_per_job"] for x in rs]
        return {"loop_us_per_job_median": median(loop), "loop_us_per_job_range": [min(loop),
                                                                                  max(loop)],
                "jobs_per_s_median": median([x["jobs_per_s"] for x in rs])}

    summary = {name: {**{mode: stats([x for x in rs if x["mode"] == mode])
                         for mode in ("threads", "inline")}, **code_provenance(sides[name])}
               for name, rs in runs.items()}
    record = {"benchmark": "moderation_task_host_cost",
              "params": {"jobs": a.jobs, "rounds": a.rounds, "consumed_batch": CONSUMED,
                         "config": "CPU default, open_nsfw alone; decode and engine replaced "
                                   "by a ready row and fixed scores",
                         "note": a.note},
              "env": environment(), "runs": runs, "summary": summary}
    path = write("task-host-cost", record, a.out)
    print(json.dumps(summary, indent=1))
    print(f"record {path}")


if __name__ == "__main__":
    main()
