"""The broker frozen (SIGSTOP) for 30 s under load, then resumed.

Runs on the separate ``local_kafka`` broker so the freeze never disturbs other tests. No job
is lost, the worker process survives the stall without a restart, and processing resumes within
10 s: a job produced after the stall began is answered (visible to a read_committed reader)
within 10 s of the resume. Exactly-once also shows no duplicate.

The 10 s count from when the broker serves the worker's group again. About half the time the
broker's own controller fences it at the resume (its heartbeat is 30 s late); it then gives up
the group coordinator and loads the group again, and the loaded group still lists the member
the worker was before the freeze, with a fresh session. librdkafka dropped that member id when
its session ran out during the freeze, so its rejoin waits for the old member to expire: one
session timeout after the load (6 s here; `docs/guarantees.md`, broker outages). That wait is
the broker's, and so is the load; the bound starts at the load when there is one
(``group_reloaded_s``). ``timeline`` lists what both logs say, in seconds from the resume.

Exactly-once once failed here intermittently (about every other run): after the resume the
transactional producer's librdkafka client had dropped every broker (the single node answered
metadata with no brokers while its own controller briefly fenced it) and never reconnected, so
each transaction timed out and the worker exited after its retries. The worker now treats a
transaction that timed out as a stuck client and resets it (worker.loop.commit.transactions); the
re-bootstrap trigger (worker.kafka.clients) shortens the same situation for every client.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.harness.faults import run_broker_stall
from worker.devkit.local_kafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STALL_S = 30.0
RECOVERY_BOUND_S = 10.0


# How many times the exactly-once case runs in a row: `.ci/run` sets 10, so each CI run shows
# the stall survived ten times on one broker (a flaky recovery would not hide behind a rerun);
# `make test` runs it once.
EO_REPEATS = int(os.environ.get("KTW_STALL_REPEATS", "1"))
CASES = [("at-least-once", 0)] + [("exactly-once", i) for i in range(EO_REPEATS)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "repeat"), CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_broker_stall_30s_loses_nothing_and_recovers_within_10s(
    local_kafka: LocalKafka, tmp_path: Path, mode: str, repeat: int
) -> None:
    f = run_broker_stall(local_kafka, tmp_path, mode=mode, stall_s=STALL_S)
    print("\nstall", json.dumps(f, sort_keys=True))
    # The reason leads the message: CI keeps the failure's first line, not the whole figure.
    assert f["worker_survived"] and f["exit_code"] == 0, (
        f"exit {f['exit_code']}, {f['phases_s']['terminate']} s after SIGTERM: "
        f"{f.get('exit_reason')}\n{f}")
    assert f["jobs_sent_during_stall"] > 0, f
    bound = RECOVERY_BOUND_S + (f["group_reloaded_s"] or 0.0)
    assert f["recovery_s"] is not None and f["recovery_s"] <= bound, (
        f"recovery {f['recovery_s']} s against {bound:.2f} s; seconds from the resume: "
        f"{f['timeline']}\n{f}")
    # A negative recovery means the broker answered during the "stall": the pause never held.
    assert f["recovery_s"] >= 0, f
    assert f["drained"], f
    assert f["results"]["missing"] == 0 and f["dlq"]["missing"] == 0, f
    assert f["offsets_committed_to_end"], f
    # The loop kept stepping through the stall (no liveness restart of a waiting worker) and
    # said it was not ready while the broker was away.
    assert f["health"]["live_throughout"], f["health"]
    assert f["health"]["ready_off_during_stall"], f["health"]
    if mode == "exactly-once":
        assert f["results"]["duplicates"] == 0 and f["dlq"]["duplicates"] == 0, f
