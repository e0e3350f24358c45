"""Engine alone: open_nsfw on the torch runner per batch size, from device memory (the ceiling:
CUDA-graph replay on resident inputs) and from host memory through the runner (pinned copy, H2D,
replay, D2H, one batch at a time). Inputs are real preprocessed images, never zeros.

python bench/moderation/engine_bench.py [--sizes 1,8,32,128,256] [--iters 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,8,32,128,256")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from engines.backends.torch.runner import TorchRunner
    from engines.models.open_nsfw import open_nsfw_spec
    from engines.profiles import StaticProfile
    from tests.harness.conformance_inputs import conformance_batch

    sizes = [int(s) for s in args.sizes.split(",")]
    pool = conformance_batch(n_synthetic=56)
    rows = []
    with TorchRunner(open_nsfw_spec(), precision=args.precision,
                     profiles=(StaticProfile("gpu", (224, 224, 3), tuple(sizes)),)) as r:
        for size in sizes:
            x = np.stack([pool[i % len(pool)] for i in range(size)])
            slot = r._slots[(size, (224, 224, 3))][0]  # graphs by (batch size, item shape)
            slot.dev_in[0].copy_(torch.from_numpy(x))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            device_ms = []
            for _ in range(args.iters):
                start.record()
                slot.graph.replay()
                end.record()
                end.synchronize()
                device_ms.append(start.elapsed_time(end))
            host_ms = []
            for _ in range(args.iters):
                start.record()
                r.infer({"input:0": x}).result()
                end.record()
                end.synchronize()
                host_ms.append(start.elapsed_time(end))
            d, h = median(device_ms), median(host_ms)
            rows.append({"batch": size, "device_ms": d, "device_img_s": size / d * 1e3,
                         "host_ms": h, "host_img_s": size / h * 1e3})
            print(f"batch {size:4d}: device {d:7.3f} ms ({size / d * 1e3:9.0f} img/s)   "
                  f"host->host {h:7.3f} ms ({size / h * 1e3:9.0f} img/s)")
    rec = {"benchmark": "engine_open_nsfw_torch", "env": environment(),
           "params": vars(args) | {"out": str(args.out)}, "rows": rows}
    print("wrote", write("engine", rec, args.out))


if __name__ == "__main__":
    main()
