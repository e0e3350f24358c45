"""open_nsfw as an AOTInductor engine vs today's engine (the eager fp16 network under a CUDA
graph), one run: build (once per batch size, in parallel processes, max-autotune), check
against the float32 CPU reference, time cached loads, and time each way to serve a batch size
from device memory (the engine alone) and through the runner from host memory.

python bench/aoti/aoti_bench.py [--sizes 1,512] [--cache DIR] [--out DIR] [--no-autotune]

Each batch size is its own engine (one static profile), built in its own process so the
compiles overlap; the measurements then run in this process with every engine cached.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, write

ITEM = (224, 224, 3)


def plan_for(size: int, cache: Path, autotune: bool, backend: str = "aoti") -> Any:
    from engines.assembly import EngineParams, EnginePlan
    from engines.models.open_nsfw import open_nsfw_spec
    from engines.profiles import StaticProfile

    return EnginePlan(open_nsfw_spec(), (StaticProfile(f"b{size}", ITEM, (size,)),),
                      EngineParams(backend=backend, precision="fp16", cache_dir=cache,
                                   autotune=autotune))


def build_all(sizes: list[int], cache: Path, autotune: bool) -> dict[int, float]:
    """Wall seconds per size, building in parallel processes (cached sizes return at once)."""
    procs = {}
    for size in sizes:
        cmd = [sys.executable, __file__, "--build-one", str(size), "--cache", str(cache)]
        procs[size] = (time.monotonic(), subprocess.Popen(
            cmd + ([] if autotune else ["--no-autotune"])))
    walls = {}
    for size, (started, proc) in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"building batch size {size} failed (exit {proc.returncode})")
        walls[size] = round(time.monotonic() - started, 1)
    return walls


def reference_check(runner: Any, size: int) -> float:
    """Max |difference| of the engine's probabilities from onnxruntime's float32 CPU run of
    the bundled model on real preprocessed images (the conformance inputs)."""
    import onnxruntime as ort

    from engines.models.open_nsfw import bundled_onnx_path
    from tests.harness.conformance_inputs import conformance_batch

    x = conformance_batch()
    sess = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    ref = sess.run(["outputs"], {"input:0": x})[0]
    got = []
    for start in range(0, len(x), size):
        got.append(runner.infer({"input:0": x[start:start + size]}).result()["outputs"])
    return float(np.abs(np.concatenate(got) - ref).max())


def host_throughput(runner: Any, size: int, seconds: float = 3.0) -> float:
    """Images/s through ``runner.infer`` from host memory, two batches in flight."""
    from tests.harness.conformance_inputs import conformance_batch

    pool = conformance_batch(n_synthetic=56)
    x = np.resize(pool, (size, *pool.shape[1:]))
    feeds = {"input:0": x}
    runner.infer(feeds).result()
    done, started, pending = 0, time.perf_counter(), runner.infer(feeds)
    while time.perf_counter() - started < seconds:
        nxt = runner.infer(feeds)
        pending.result()
        done += size
        pending = nxt
    pending.result()
    return round((done + size) / (time.perf_counter() - started), 1)


def measure(size: int, cache: Path, autotune: bool) -> dict[str, Any]:
    import torch

    from engines.backends.aoti.build import time_variants
    from engines.backends.aoti.bundle import load_from_bundle, shape_name
    from engines.backends.aoti.weights import read_weights

    plan = plan_for(size, cache, autotune)
    entry = plan.cache.lookup(plan.recipe())
    assert entry is not None, "built above"
    started = time.perf_counter()
    weights = read_weights(entry.artifact, "cuda:0")
    model = load_from_bundle(entry.artifact, shape_name(size, ITEM), True, weights)
    load_s = time.perf_counter() - started
    torch.cuda.synchronize()
    started = time.perf_counter()
    runner = plan.runner()
    runner.activate()  # cache lookup (SHA-256), package load, graph capture where chosen
    activate_s = time.perf_counter() - started
    native = plan.spec.native
    eager, _ = native.fresh("cuda:0")
    eager = eager.to(device="cuda:0", dtype=torch.float16).to(memory_format=torch.channels_last)
    x = torch.from_numpy(np.resize(_pool(), (size, *ITEM))).to("cuda:0")
    ms = time_variants(model, eager.eval(), (x,), cuda=True)
    # Today's engine through its runner (the eager network under graphs) vs the AOTI runner,
    # both from host memory.
    torch_plan = plan_for(size, cache, autotune, backend="torch")
    with torch_plan.runner() as torch_runner:
        torch_host = host_throughput(torch_runner, size)
        torch_error = reference_check(torch_runner, size)
    record = {
        "batch": size, "serving": runner.serving[shape_name(size, ITEM)],
        "build": entry.sidecar["build"]["shapes"][shape_name(size, ITEM)],
        "bundle_bytes": entry.artifact.stat().st_size, "package_load_s": round(load_s, 3),
        "runner_activate_s": round(activate_s, 3),
        "device_ms": ms,
        "device_img_per_s": {k: round(size * 1000 / v, 1) for k, v in ms.items() if v},
        "host_img_per_s": {"aoti_runner": host_throughput(runner, size),
                           "torch_runner": torch_host},
        "max_abs_diff_vs_fp32_cpu": {"aoti_runner": reference_check(runner, size),
                                     "torch_runner": torch_error},
    }
    runner.deactivate()
    return record


def _pool() -> np.ndarray:
    from tests.harness.conformance_inputs import conformance_batch

    return conformance_batch(n_synthetic=56)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,512")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/aoti-cache"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-autotune", action="store_true")
    ap.add_argument("--build-one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    autotune = not args.no_autotune
    if args.build_one is not None:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        plan_for(args.build_one, args.cache, autotune).loader()()
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    walls = build_all(sizes, args.cache, autotune)
    rows = []
    for size in sizes:
        row = measure(size, args.cache, autotune)
        row["build_wall_s"] = walls[size]
        rows.append(row)
        print(json.dumps(row), flush=True)
    record = {"bench": "aoti_open_nsfw", "env": environment(), "precision": "fp16",
              "autotune": autotune, "item": list(ITEM), "rows": rows,
              "note": "device_ms: median ms per call on device-resident real images, calls back "
                      "to back; aoti = the package called directly, aoti_graph = a CUDA graph "
                      "over it, eager_graph = today's torch engine (eager fp16 network under a "
                      "CUDA graph). host_img_per_s: runner.infer from host memory, 2 in flight."}
    if args.out is not None:
        write("aoti_open_nsfw", record, args.out)
    print(write("aoti_open_nsfw", record))


if __name__ == "__main__":
    main()
