"""available_cpus: the affinity mask capped by a container's CPU quota (cgroup v1 and v2)."""

from __future__ import annotations

import os
from pathlib import Path

from engines.cpus import available_cpus, cgroup_quota


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    assert available_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_cgroup_v2_without_a_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 0.5
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(tmp_path) is None


def test_no_cgroup_files_means_the_affinity_mask(tmp_path: Path) -> None:
    assert available_cpus(tmp_path / "missing") == len(os.sched_getaffinity(0))
