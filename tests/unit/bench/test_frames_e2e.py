"""The live-load bench's schedule: a backlog drain of n jobs schedules n jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.frames_e2e import code_provenance, scheduled_jobs, slice_count, worker_command


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


def test_one_worker_process_is_a_plain_run() -> None:
    assert worker_command(1, False)[1:] == ["-m", "worker", "run"]


@pytest.mark.parametrize(("procs", "mps", "tail"), [
    (4, False, ["--gpus", "1", "--procs-per-gpu", "4"]),
    (4, True, ["--gpus", "1", "--procs-per-gpu", "4", "--mps"]),
    (1, True, ["--gpus", "1", "--procs-per-gpu", "1", "--mps"])])
def test_several_processes_run_on_one_gpu_under_the_supervisor(procs: int, mps: bool,
                                                               tail: list[str]) -> None:
    assert worker_command(procs, mps)[1:] == ["-m", "worker", "run", *tail]
