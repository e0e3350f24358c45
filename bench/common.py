"""Benchmark bookkeeping: environment record, medians, JSON output under bench/results/."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str:
    # BENCH_COMMIT first: on the GPU machine the copied tree's git metadata can be older than
    # the files (bench/device_kafka.sh sets it from the staged checkout).
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, cwd=Path(__file__).parent)
        return out.stdout.strip() or os.environ.get("BENCH_COMMIT", "unknown")
    except OSError:
        return os.environ.get("BENCH_COMMIT", "unknown")


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "commit": commit(),
                           "host_cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                              time.gmtime())}
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda_runtime"] = torch.version.cuda
            from engines.device import cuda_fingerprint

            fp = cuda_fingerprint(0)
            env["cuda_driver_api"], env["compute_capability"] = fp.driver, fp.arch
            try:
                import pynvml

                pynvml.nvmlInit()
                env["driver"] = pynvml.nvmlSystemGetDriverVersion()
                h = pynvml.nvmlDeviceGetHandleByIndex(0)
                env["gpu_clocks_mhz"] = {
                    "sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "mem": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)}
            except (ImportError, OSError, RuntimeError) as exc:
                env["driver"] = f"unknown ({type(exc).__name__})"
    except ImportError:
        env["torch"] = None  # not installed (the CPU default runs without it)
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        env["onnxruntime"] = None
    # Every record, GPU or CPU, carries the same provenance (dirty flag, library versions, CPU).
    return {**provenance(), **env}


def gc_totals(heap: Any) -> dict[str, dict[str, float]]:
    """A worker's collector pauses (worker.loop.heap.HeapPolicy) per generation: how many and
    their total milliseconds."""
    return {g: {"n": b.count, "total_ms": round(b.sum * 1e3, 1)}
            for g, b in sorted(heap.pauses.items())}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def write(name: str, record: dict[str, Any], out_dir: Path | None = None) -> Path:
    folder = out_dir or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    return path


def provenance() -> dict[str, Any]:
    """What a CPU bench record needs to be compared with another: commit and whether the tree
    had uncommitted changes, library versions (missing ones as null), the CPU model."""
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    dirty: bool | None = None
    if os.environ.get("BENCH_DIRTY") in ("0", "1"):  # the GPU machine's copy has no git
        dirty = os.environ["BENCH_DIRTY"] == "1"
    else:
        try:
            out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, check=False,
                                 cwd=Path(__file__).parent)
            dirty = bool(out.stdout.strip()) if out.returncode == 0 else None
        except OSError:
            dirty = None
    cpu_model = platform.processor() or None
    with contextlib.suppress(OSError):  # (no /proc: platform's answer stands)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    rec: dict[str, Any] = {"commit": commit(), "dirty": dirty, "cpu_model": cpu_model,
                           "cpus": os.cpu_count(), "python": platform.python_version()}
    for dist in ("torch", "torchvision", "onnxruntime", "pillow", "confluent-kafka", "msgspec",
                 "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "nvidia-dali-cuda130"):
        rec[dist.replace("-", "_")] = version(dist)
    try:
        import confluent_kafka

        rec["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        rec["librdkafka"] = None
    return rec
