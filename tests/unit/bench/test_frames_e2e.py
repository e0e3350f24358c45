"""The live-load bench's schedule: a backlog drain of n jobs schedules n jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.frames_e2e import code_provenance, scheduled_jobs, slice_count


@pytest.mark.parametrize("jobs", [600, 1500, 3000, 5000, 20000])
def test_a_drain_of_n_jobs_schedules_n(jobs: int) -> None:
    fast = 1e7  # the drain's rate (bench/frames_e2e.py burst)
    assert scheduled_jobs(fast, jobs / fast) == jobs


def test_a_fixed_rate_schedules_rate_times_seconds() -> None:
    assert scheduled_jobs(80, 33.0) == 2640


def test_a_staged_checkout_names_its_own_commit_and_dirty_flag(tmp_path: Path) -> None:
    (tmp_path / "COMMIT").write_text("1978609\n")
    (tmp_path / "DIRTY").write_text("0\n")
    assert code_provenance(tmp_path) == {"code_commit": "1978609", "code_dirty": False}


def test_a_checkout_without_stamps_is_unknown(tmp_path: Path) -> None:
    assert code_provenance(tmp_path) == {"code_commit": "unknown", "code_dirty": None}


@pytest.mark.parametrize(("steady_s", "slices"), [(30.0, 6), (32.0, 6), (4.0, 1), (5.0, 1)])
def test_the_steady_window_is_cut_into_whole_slices(steady_s: float, slices: int) -> None:
    assert slice_count(steady_s) == slices
