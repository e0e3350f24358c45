from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from worker.observe.vitals import Vitals


def _stats(partitions: dict[str, dict[str, object]]) -> str:
    # The shape of librdkafka's statistics JSON (STATISTICS.md): topics -> partitions, with
    # the internal UA partition "-1" always present.
    return json.dumps({"name": "c#consumer-1", "type": "consumer", "topics": {
        "jobs": {"topic": "jobs", "partitions": {
            "-1": {"partition": -1, "desired": False, "consumer_lag": -1}, **partitions}}}})


def test_lag_comes_from_desired_partitions_with_a_known_lag() -> None:
    v = Vitals()
    v.on_stats(_stats({"0": {"partition": 0, "desired": True, "consumer_lag": 12},
                       "1": {"partition": 1, "desired": True, "consumer_lag": -1},
                       "2": {"partition": 2, "desired": False, "consumer_lag": 40}}))
    assert v.lag == {("jobs", 0): 12}


def test_unreadable_statistics_keep_the_last_lag() -> None:
    v = Vitals()
    v.on_stats(_stats({"0": {"partition": 0, "desired": True, "consumer_lag": 3}}))
    v.on_stats("{not json")
    assert v.lag == {("jobs", 0): 3}


def test_lost_until_assigned_again_and_lag_dropped_on_revoke() -> None:
    v = Vitals()
    v.on_stats(_stats({"0": {"partition": 0, "desired": True, "consumer_lag": 3}}))
    v.rebalanced("lost", 1)
    assert v.lost and v.lag == {}
    v.rebalanced("assigned", 1)
    assert not v.lost
    assert v.rebalances == {"lost": 1, "assigned": 1}


def test_batches_by_profile() -> None:
    v = Vitals()
    v.batch_done(0.02, 6, "b8", 8)
    v.batch_done(0.04, 8, "b8", 8)
    assert v.batch_size["b8"].count == 2
    assert v.batch_fill["b8"].cumulative()[-1] == ("+Inf", 2)
    assert [n for le, n in v.batch_fill["b8"].cumulative() if le == "0.8"] == [1]  # 6/8=0.75
    assert abs(v.engine_seconds["b8"].sum - 0.06) < 1e-9


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process_age_s reads Linux /proc")
def test_process_age_counts_from_the_process_start_not_from_the_import() -> None:
    # The child sleeps before it imports the worker: its age must include that time.
    code = ("import time; time.sleep(1.2); from worker.observe.vitals import process_age_s; "
            "print(process_age_s())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    age = float(out.stdout.strip())
    assert 1.2 <= age < 30.0


def _eos_stats(committed: int, ls: int, lag: int) -> str:
    # Exactly-once: the statistics' committed offset is the one fetched at assignment.
    return _stats({"0": {"partition": 0, "desired": True, "consumer_lag": lag,
                         "committed_offset": committed, "ls_offset": ls, "hi_offset": ls}})


def test_own_commits_replace_the_statistics_stale_committed_offset() -> None:
    v = Vitals()
    v.on_stats(_eos_stats(committed=10, ls=20, lag=10))
    assert v.lag == {("jobs", 0): 10}  # nothing committed by the worker yet: as reported
    v.note_committed({("jobs", 0): 20})
    v.on_stats(_eos_stats(committed=10, ls=20, lag=10))
    assert v.lag == {("jobs", 0): 0}
    v.note_committed({("jobs", 0): 17})  # (a rewind's commit would not go back; the max counts)
    v.on_stats(_eos_stats(committed=18, ls=25, lag=7))
    assert v.lag == {("jobs", 0): 7}


def test_own_commits_give_a_lag_where_the_group_never_committed() -> None:
    v = Vitals()
    v.on_stats(_eos_stats(committed=-1001, ls=20, lag=-1))
    assert v.lag == {}
    v.note_committed({("jobs", 0): 15})
    v.on_stats(_eos_stats(committed=-1001, ls=20, lag=-1))
    assert v.lag == {("jobs", 0): 5}


def test_a_revoke_forgets_only_the_revoked_partitions_own_commits() -> None:
    # Cooperative rebalancing takes some partitions and leaves the others: a kept partition's
    # own commit still counts (without it the statistics' stale committed offset would).
    v = Vitals()
    v.note_committed({("jobs", 0): 500, ("jobs", 1): 500})
    v.rebalanced("revoked", 1)
    v.forget({("jobs", 1)})
    assert v.own_commits == {("jobs", 0): 500}
    v.on_stats(_eos_stats(committed=100, ls=510, lag=410))
    assert v.lag == {("jobs", 0): 10}
