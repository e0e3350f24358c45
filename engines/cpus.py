"""How many CPUs this process may really use: the affinity mask, capped by a container's CPU
quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``).

``os.cpu_count()`` is the host's count: a pod limited to 2 CPUs on a 64-core node would start
64 decode threads and 64 ONNX Runtime threads, which the quota then throttles.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup's quota allows (e.g. 1.5), or None when there is no quota."""
    try:
        parts = (root / "cpu.max").read_text().split()
        if parts and parts[0] != "max":
            return int(parts[0]) / int(parts[1])
        if parts:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(root: Path = CGROUP) -> int:
    """At least 1: the CPUs in this process's affinity mask, capped by the quota (rounded up)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_quota(root)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)
