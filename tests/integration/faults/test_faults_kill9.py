"""kill -9 at random points under load: 20 kills per guarantee.

Three worker processes with static membership share six partitions while a feeder produces a
steady stream (every 20th job malformed, so the DLQ path is exercised too). One worker at a
time is killed with SIGKILL at a random point after it got its partitions, and restarted at
once with the same instance id (as a StatefulSet would). At the end:

- at-least-once: every job has at least one result and every bad job a DLQ record;
- exactly-once: a read_committed reader sees exactly one result per job and one DLQ record per
  bad job, although a read_uncommitted reader sees the aborted outputs of killed transactions.

The 200-kill version is ``python -m bench.faults.kill9``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.faults import run_kill9

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KILLS = 20


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_kill9_twenty_times_under_load(kafka_bootstrap: str, tmp_path: Path, mode: str) -> None:
    f = run_kill9(kafka_bootstrap, tmp_path, mode=mode, kills=KILLS, seed=KILLS)
    print("\nkill9", json.dumps(f, sort_keys=True))
    assert f["drained"], f
    assert f["final_exit_codes"] == [0, 0, 0], f
    assert f["results"]["missing"] == 0 and f["dlq"]["missing"] == 0, f
    assert f["results"]["unexpected"] == 0 and f["dlq"]["unexpected"] == 0, f
    assert f["offsets_committed_to_end"], f
    if mode == "exactly-once":
        assert f["results"]["duplicates"] == 0 and f["dlq"]["duplicates"] == 0, f
        # The kills did land inside open transactions (their outputs were aborted).
        assert f["aborted_result_records"] > 0, f
