"""GPU series on /metrics where the process uses CUDA: memory always, utilisation with NVML."""

from __future__ import annotations

import importlib.util


def test_gpu_memory_is_exported_once_cuda_is_in_use() -> None:
    import torch

    from worker.observe.gpu import metrics

    x = torch.ones((1024, 1024), device="cuda")  # initialises CUDA, reserves memory
    got = {m.name: m for m in metrics("t")}
    used = got["t_gpu_memory_used_bytes"].samples
    total = got["t_gpu_memory_total_bytes"].samples
    assert used and used[0].value > 4 * 1024 * 1024 and total[0].value > used[0].value
    util = got["t_gpu_utilization_ratio"].samples
    if importlib.util.find_spec("pynvml") is not None:
        assert util and 0.0 <= util[0].value <= 1.0
    print(f"used {used[0].value / 2**30:.2f} GiB of {total[0].value / 2**30:.0f} GiB, "
          f"utilisation series: {len(util)}")
    del x
