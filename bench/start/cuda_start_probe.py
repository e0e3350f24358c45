"""Whether the CUDA context can be made while ``import torch`` runs, and what that saves.

A cached moderation start spends most of its time in the runner's first step: ``import torch``
(Python work, holding the GIL) and then the CUDA context (driver work, which holds no GIL when
called through cuda-python). Each mode runs in a fresh process, the modes alternate, and each
process reports its own monotonic times from its start:

- ``driver``: cuInit, then the device's primary context retained (no torch);
- ``serial``: ``import torch``, then its first CUDA tensor (what the worker does today);
- ``overlap``: a thread makes the primary context through cuda-python while the main thread
  imports torch; then the first CUDA tensor (torch's runtime adopts the primary context).

    python bench/start/cuda_start_probe.py --out DIR [--rounds 4]

On the H200 ``overlap`` beat ``serial`` by 0.24 s and 0.5 s by the medians of two
calls, but inside the worker the same thread saved 0.11 s of the engine's load and cost as much
in the import (three-way warm-start A/B, bench/NOTES.md), so the worker does not do it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402

CHILD = r"""
import json, sys, threading, time
t0 = time.monotonic()
mode = sys.argv[1]
out = {}

def context():
    from cuda.bindings import driver
    a = time.monotonic()
    err, = driver.cuInit(0)
    b = time.monotonic()
    err2, dev = driver.cuDeviceGet(0)
    err3, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    c = time.monotonic()
    out["driver"] = {"errors": [int(err), int(err2), int(err3)], "import_s": a - t0,
                     "cuInit_s": b - a, "primary_ctx_s": c - b, "done_at_s": c - t0}

if mode == "driver":
    context()
else:
    th = None
    if mode == "overlap":
        th = threading.Thread(target=context)
        th.start()
    a = time.monotonic()
    import torch
    b = time.monotonic()
    if th is not None:
        th.join()
    c = time.monotonic()
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    d = time.monotonic()
    out |= {"import_torch_s": b - a, "join_wait_s": c - b, "first_tensor_s": d - c,
            "value": float(x.item())}
out["total_s"] = time.monotonic() - t0
print(json.dumps(out))
"""


def run(mode: str) -> dict[str, Any]:
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=120, check=False)
    wall = time.monotonic() - t
    if proc.returncode != 0:
        return {"mode": mode, "error": proc.stderr[-800:], "wall_s": wall}
    return {"mode": mode, "wall_s": round(wall, 3),
            **{k: (round(v, 4) if isinstance(v, float) else v)
               for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    runs = []
    for _ in range(args.rounds):
        for mode in ("serial", "overlap", "driver"):
            runs.append(run(mode))
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for mode in ("serial", "overlap", "driver"):
        totals = [r["total_s"] for r in runs if r["mode"] == mode and "total_s" in r]
        if totals:
            summary[mode] = {"total_s_median": round(statistics.median(totals), 3),
                             "total_s": totals}
    print(json.dumps(summary))
    path = write("cuda-start-probe", {"benchmark": "cuda_start_probe", "env": environment(),
                                      "params": {"rounds": args.rounds}, "runs": runs,
                                      "summary": summary}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
