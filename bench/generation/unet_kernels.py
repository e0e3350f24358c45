"""SD 1.5 UNet step (the in-house module, 512x512 latents, fp16, CUDA graph): which attention
kernel and memory layout are fastest, checked against a float32 CPU reference first.

Full SD 1.5 architecture with random weights (PyTorch's default initialisation, never zeros;
timings do not depend on the values). For batch 2 (one CFG pair) and 16, per variant: the
scaled-dot-product-attention backend the graph was captured with (PyTorch's own choice, flash,
cuDNN, memory-efficient) and the layout (contiguous, channels-last), the median graph replay in
ms over ``--iters`` on resident inputs, and the output's largest difference from the float32
CPU reference at batch 2 (relative to the reference's largest magnitude).
``--compile`` adds torch.compile (max-autotune-no-cudagraphs) of the best eager layout under a
graph: minutes of compilation.

    python bench/generation/unet_kernels.py --out DIR [--iters 30] [--compile]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write

BACKENDS = ("default", "flash", "cudnn", "efficient")


def inputs(b: int, device: str, dtype: Any, seed: int = 0) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(seed + b)
    return [torch.randn(b, 4, 64, 64, generator=g).to(device),
            torch.full((b,), 500.0).to(device),
            torch.randn(b, 77, 768, generator=g).to(device)]


def sdpa_context(name: str) -> Any:
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "default":
        return contextlib.nullcontext()
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION}[name])


def graph_ms(net: Any, dev_in: list[Any], backend: str, iters: int) -> tuple[float, Any]:
    import torch

    from engines.backends.torch.graphs import capture

    with sdpa_context(backend):
        graph, out = capture(net, dev_in)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return median(times), out.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    import torch

    from engines.models.sd.arch import SD15
    from engines.models.sd.nets import skeleton

    t0 = time.monotonic()
    torch.manual_seed(0)
    net32 = skeleton("unet", SD15.unet, "cuda")  # random init on the GPU: seconds, not minutes
    cpu_ref = copy.deepcopy(net32).cpu()
    net = net32.half()
    record: dict[str, Any] = {"benchmark": "unet_kernels_sd15_512", "weights": "random",
                              "env": environment(), "params": vars(args) | {"out": str(args.out)},
                              "init_s": round(time.monotonic() - t0, 1)}
    with torch.no_grad():
        t = time.monotonic()
        ref = cpu_ref(*inputs(2, "cpu", torch.float32)).float()
        record["cpu_fp32_reference_s"] = round(time.monotonic() - t, 1)
    del cpu_ref
    scale = float(ref.abs().max())

    def measure(model: Any, b: int, layout: str, backend: str, **extra: Any) -> dict[str, Any]:
        """One row: the graph's median ms (capture_s includes compiling a compiled model) and,
        at batch 2, the largest difference from the float32 CPU reference."""
        row: dict[str, Any] = {"batch": b, "layout": layout, "sdpa": backend, **extra}
        dev_in = inputs(b, "cuda", torch.float16)
        if layout == "channels_last":
            dev_in[0] = dev_in[0].contiguous(memory_format=torch.channels_last)
        t = time.monotonic()
        try:
            ms, out = graph_ms(model, dev_in, backend, args.iters)
            row |= {"graph_ms": round(ms, 3), "capture_s": round(time.monotonic() - t, 1)}
            if b == 2:
                row["max_rel_diff_vs_fp32_cpu"] = round(
                    float((out.cpu() - ref).abs().max()) / scale, 5)
        except Exception as exc:  # noqa: BLE001 - a backend that refuses these shapes
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(row, flush=True)
        return row

    def in_layout(layout: str) -> Any:
        """The network's weights in ``layout`` (converted in place, once per layout)."""
        return net.to(memory_format=torch.channels_last if layout == "channels_last"
                      else torch.contiguous_format)

    rows: list[dict[str, Any]] = []
    for layout in ("contiguous", "channels_last"):
        model = in_layout(layout)
        rows += [measure(model, b, layout, backend) for b in (2, 16) for backend in BACKENDS]
    record["variants"] = rows
    record["reference_max_abs"] = scale
    if args.compile:
        best = min((r for r in rows if "graph_ms" in r and r["batch"] == 2),
                   key=lambda r: r["graph_ms"])
        compiled = torch.compile(in_layout(best["layout"]), mode="max-autotune-no-cudagraphs")
        out_rows = [measure(compiled, b, best["layout"], best["sdpa"],
                            compiled="max-autotune-no-cudagraphs") for b in (2, 16)]
        record["compiled"] = out_rows
    best_by_batch: dict[int, dict[str, Any]] = {}
    for r in rows + record.get("compiled", []):
        if "graph_ms" in r and (r["batch"] not in best_by_batch
                                or r["graph_ms"] < best_by_batch[r["batch"]]["graph_ms"]):
            best_by_batch[r["batch"]] = r
    record["best"] = best_by_batch
    record["targets"] = {"b2_ms": {"target": 6.0, "best": best_by_batch.get(2, {}).get("graph_ms")},
                         "b16_ms": {"target": 30.0,
                                    "best": best_by_batch.get(16, {}).get("graph_ms")}}
    print(record["targets"], flush=True)
    print("wrote", write("unet-kernels", record, args.out))


if __name__ == "__main__":
    main()
