"""The live-load bench's schedule: a backlog drain of n jobs schedules n jobs."""

from __future__ import annotations

import pytest

from bench.frames_e2e import scheduled_jobs


@pytest.mark.parametrize("jobs", [600, 1500, 3000, 5000, 20000])
def test_a_drain_of_n_jobs_schedules_n(jobs: int) -> None:
    fast = 1e7  # the drain's rate (bench/frames_e2e.py burst)
    assert scheduled_jobs(fast, jobs / fast) == jobs


def test_a_fixed_rate_schedules_rate_times_seconds() -> None:
    assert scheduled_jobs(80, 33.0) == 2640
