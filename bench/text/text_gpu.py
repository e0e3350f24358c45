"""The GPU half of bench/text/text_bench.py: MiniLM on the torch runner, CLIP ViT-B/32 image tower.

Per shape, two numbers: device (CUDA-graph replay on inputs already on the GPU: the ceiling)
and host (``runner.infer(...).result()``: pinned copy, H2D, replay, D2H, one batch at a time).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import median
from bench.text.text_inputs import token_rows
from engines.loaders import OnnxModel
from engines.profiles import StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec

TEXT_BATCHES = (1, 8, 32, 128)
CLIP_BATCHES = (1, 32, 256)
BUCKETS = (16, 32, 64, 128)


def _no_onnx() -> OnnxModel:
    raise RuntimeError("the torch runner never reads ONNX")


def _with_net(spec: EngineSpec, net: Any, identity: str) -> EngineSpec:
    """``spec`` whose native network (what the torch runner runs) is a copy of ``net``."""
    return dataclasses.replace(spec, native=NativeNet(lambda device: (copy.deepcopy(net),
                                                                      identity)))


def _time(runner: Any, key: tuple[int, tuple[int, ...]], feeds: dict[str, np.ndarray],
          iters: int) -> tuple[float, float]:
    """(device ms, host ms), medians over ``iters``."""
    import torch

    slot = runner._slots[key][0]
    for dev, name in zip(slot.dev_in, [t.name for t in runner.spec.inputs], strict=True):
        dev.copy_(torch.from_numpy(feeds[name]))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device, host = [], []
    for _ in range(iters):
        start.record()
        slot.graph.replay()
        end.record()
        end.synchronize()
        device.append(start.elapsed_time(end))
    runner.infer(feeds).result()  # warm the path
    for _ in range(iters):
        start.record()
        runner.infer(feeds).result()
        end.record()
        end.synchronize()
        host.append(start.elapsed_time(end))
    return median(device), median(host)


def _row(kind: str, shape: Any, batch: int, d: float, h: float) -> dict[str, Any]:
    print(f"{kind:10s} {shape!s:>14s} batch {batch:4d}: device {d:8.3f} ms "
          f"({batch / d * 1e3:9.0f}/s)  host {h:8.3f} ms ({batch / h * 1e3:9.0f}/s)")
    return {"model": kind, "shape": shape, "batch": batch, "device_ms": d, "host_ms": h,
            "device_per_s": batch / d * 1e3, "host_per_s": batch / h * 1e3}


def gpu_text_rows(net: Any, folder: Path | None, iters: int
                  ) -> tuple[list[dict[str, Any]], float]:
    import torch

    from engines.backends.torch.runner import TorchRunner

    spec = EngineSpec("minilm_l6_v2", _no_onnx,
                      (TensorSpec("input_ids", (-1, -1), "int64"),
                       TensorSpec("attention_mask", (-1, -1), "int64")),
                      (TensorSpec("embedding", (-1, 384)),))
    profiles = tuple(StaticProfile(f"tok{n}", (n,), TEXT_BATCHES) for n in BUCKETS)
    runner = TorchRunner(_with_net(spec, net, "bench"), profiles=profiles, precision="fp16",
                         device=0)
    rows = []
    with runner:
        for n in BUCKETS:
            for b in TEXT_BATCHES:
                d, h = _time(runner, (b, (n,)), token_rows(folder, n, b, seed=b), iters)
                rows.append(_row("minilm", n, b, d, h))
        feeds = token_rows(folder, 64, 32, seed=1)
        fp16 = runner.infer(feeds).result()["embedding"]
    return rows, _vs_fp32("minilm", net, fp16,
                          *(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask")))


def clip_rows(iters: int) -> tuple[list[dict[str, Any]], float]:
    """Rows per batch size, and the fp16 runner's max abs difference from CPU fp32 (batch 32)."""
    import torch

    from engines.backends.torch.runner import TorchRunner
    from engines.models.clip import vit_b32_vision
    from engines.models.clip.net import ClipImageEncoder

    torch.manual_seed(0)  # PyTorch's default initialisation: random, never zeros
    cfg = vit_b32_vision()
    size = cfg.image_size
    spec = EngineSpec("clip_image", _no_onnx, (TensorSpec("pixel_values", (-1, 3, size, size)),),
                      (TensorSpec("embedding", (-1, 512)),))
    profile = StaticProfile("px224", (3, size, size), CLIP_BATCHES)
    net = ClipImageEncoder(cfg, 512).eval()
    runner = TorchRunner(_with_net(spec, net, "vit-b32-random"), profiles=(profile,),
                         precision="fp16", device=0)
    rng = np.random.default_rng(0)
    rows = []
    with runner:
        for b in CLIP_BATCHES:
            pixels = rng.standard_normal((b, 3, size, size)).astype(np.float32)
            d, h = _time(runner, (b, profile.item_shape), {"pixel_values": pixels}, iters)
            rows.append(_row("clip-b32", f"{size}x{size}", b, d, h))
        pixels = rng.standard_normal((32, 3, size, size)).astype(np.float32)  # fresh rows
        fp16 = runner.infer({"pixel_values": pixels}).result()["embedding"]
    return rows, _vs_fp32("clip-b32", net, fp16, torch.from_numpy(pixels))


def _vs_fp32(kind: str, net: Any, fp16: np.ndarray, *inputs: Any) -> float:
    """Max abs difference of the GPU fp16 rows from the same module in fp32 on the CPU."""
    import torch

    with torch.no_grad():
        fp32 = net(*inputs).float().numpy()
    if fp16.shape != fp32.shape:
        print(f"{kind} fp16 vs fp32: shapes differ, {fp16.shape} vs {fp32.shape}")
        return float("nan")
    diff = float(np.abs(fp16 - fp32).max())  # NaN if the fp16 rows hold any NaN
    print(f"{kind} fp16 vs fp32 (CPU) max abs difference: {diff:.2e} "
          f"(fp32 row norms {np.linalg.norm(fp32, axis=1).mean():.3f})")
    return diff
