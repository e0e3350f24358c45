"""GPU memory and utilisation, only where this process already uses CUDA through torch.

Nothing is imported for it: a CPU worker (torch absent, or never initialising CUDA) exports no
GPU series. Utilisation comes from NVML through torch (``torch.cuda.utilization``, which needs
the ``nvidia-ml-py`` package); without NVML only memory is exported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric


def metrics(prefix: str) -> Iterator[Metric]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    memory = GaugeMetricFamily(f"{prefix}_gpu_memory_used_bytes",
                               "Device memory in use (all processes).", labels=["gpu"])
    total = GaugeMetricFamily(f"{prefix}_gpu_memory_total_bytes", "Device memory.",
                              labels=["gpu"])
    util = GaugeMetricFamily(f"{prefix}_gpu_utilization_ratio",
                             "Fraction of the last sample period a kernel ran (NVML).",
                             labels=["gpu"])
    for i in range(torch.cuda.device_count()):
        if not torch.cuda.memory_reserved(i):
            continue  # a device this process never used: asking would create a context on it
        free, size = torch.cuda.mem_get_info(i)
        memory.add_metric([str(i)], size - free)
        total.add_metric([str(i)], size)
        try:
            util.add_metric([str(i)], torch.cuda.utilization(i) / 100.0)
        except Exception:  # noqa: BLE001 - NVML missing or refused: memory only
            continue
    yield memory
    yield total
    yield util
