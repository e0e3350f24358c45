"""The GPU stages alone, in K processes at once: the ceilings an end-to-end run of K worker
processes is measured against, in the same run (issue 13: ">= 85% of the slowest stage alone").

One process's stage figures (bench/moderation/task_probe.py) are no ceiling for K processes
under MPS, whose decodes and engines run side by side. So each of K spawned processes builds the
worker's own task (bench/moderation/pipeline_bench.worker_cfg with the bench's overrides: the
served backend, aoti included), warms it up, and then all K run each stage together, started
by one barrier:

    task     the task's whole batch path (decode, resize, slot, graph, D2H), 4 batches in flight
    engine   graph replays of the pipeline's slot for the batch size, from device memory
    decode   torchvision's nvJPEG decode of the bench's JPEGs, 4 threads per process

A stage's rate is all images over the span from the common start to the last process's end.
Each stage runs ``reps`` times (the order task, engine, decode repeated) and the median counts:
single one-second runs of the same stage spread 14k-25k img/s on the H200.
The GPU path's slowest stage is the smaller of engine and decode; ``task`` chains both.
"""

from __future__ import annotations

import time
from statistics import median
from typing import Any

# The task first, as bench/moderation/task_probe.py runs it (its figures and these should agree).
STAGES = ("task", "engine", "decode")


def _stage_proc(batch: int, batches: int, reps: int, barrier: Any, out: Any) -> None:
    import torch  # (spawned: the parent's sys.path, the code root included, comes along)

    from bench.corpus import jpeg_photos
    from bench.moderation.decode_probe import decode_rate
    from bench.moderation.task_probe import (
        StepTimes,
        engine_alone,
        image_parts,
        make_model,
        run_batches,
    )

    photos = jpeg_photos(2048)
    cfg, model = make_model(dry_run=False)
    items = image_parts(cfg, model, photos, batch * batches)
    raw = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in photos]
    work = [raw[(i * batch) % len(raw):][:batch] for i in range(batches)]
    work = [w for w in work if len(w) == batch]
    # Warm, as task_probe does; 4 batches in flight on 4 batch threads.
    run_batches(model, items[: batch * 8], batch, 4, StepTimes())
    spans: list[tuple[str, int, float, float]] = []
    for stage in STAGES * reps:
        barrier.wait(timeout=300)
        t0 = time.time()
        if stage == "engine":
            replays = batches * 2
            engine_alone(model, batch, replays)
            n = replays * model.pipeline.size_for(batch)  # the slot replayed, padding included
        elif stage == "decode":
            decode_rate(work, 4)
            n = len(work) * batch
        else:
            n = int(run_batches(model, items, batch, 4, StepTimes())["images"])
        spans.append((stage, n, t0, time.time()))
    model.close()
    out.put(spans)


def stages_alone(procs: int, batch: int = 128, batches: int = 160, reps: int = 3
                 ) -> dict[str, Any]:
    """Images/s of each stage with ``procs`` processes running it at once (see the module)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    children = [ctx.Process(target=_stage_proc, args=(batch, batches, reps, barrier, out))
                for _ in range(procs)]
    for ch in children:
        ch.start()
    reports = []
    for _ in children:
        try:
            reports.append(out.get(timeout=420))
        except Exception:  # noqa: BLE001 - a process that died reports nothing
            break
    for ch in children:
        ch.join(60)
    if len(reports) < procs:  # the rest may wait at a barrier, holding the GPU: end them
        for ch in children:
            if ch.is_alive():
                ch.terminate()
                ch.join(30)
        return {"procs": procs, "error": f"{len(reports)} of {procs} processes reported",
                "exit_codes": [ch.exitcode for ch in children]}
    rec: dict[str, Any] = {"procs": procs, "batch": batch, "batches_per_process": batches,
                           "reps": reps}
    for i, stage in enumerate(STAGES):
        rates = []
        for j in range(i, len(STAGES) * reps, len(STAGES)):  # this stage's runs, in order
            n = sum(r[j][1] for r in reports)
            span = max(r[j][3] for r in reports) - min(r[j][2] for r in reports)
            rates.append(round(n / span))
        rec[f"{stage}_img_s"] = round(median(rates))
        rec[f"{stage}_runs_img_s"] = rates
    rec["slowest_stage_img_s"] = min(rec["engine_img_s"], rec["decode_img_s"])
    return rec
