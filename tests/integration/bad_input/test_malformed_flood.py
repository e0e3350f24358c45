"""Malformed-input flood: 10,000 bad jobs of 18 classes mixed with good ones.

Every bad job is in the DLQ with its reason and its original bytes and headers, every good job
is answered ``ok``, the worker never crashes (alive to the end, clean exit). Exactly-once also
proves the DLQ path is transactional: one DLQ record per bad job for a read_committed reader.
The corpus's classes are checked one by one against the intake in
tests/unit/test_malformed_corpus.py; the codec is fuzzed in tests/unit/test_intake_fuzz.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.faults import run_flood

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_ten_thousand_bad_jobs_zero_crashes_all_dead_lettered_all_good_answered(
    kafka_bootstrap: str, tmp_path: Path, mode: str
) -> None:
    f = run_flood(kafka_bootstrap, tmp_path, mode=mode, n_bad=10_000, n_good=300)
    print("\nflood", json.dumps(f, sort_keys=True))
    assert len(f["classes"]) >= 12
    assert f["drained"], f
    assert f["worker_survived"] and f["exit_code"] == 0, f
    assert f["dlq"]["missing"] == 0 and f["dlq"]["unexpected"] == 0, f
    assert f["dlq_wrong_reason"] == {} and f["dlq_altered"] == 0, f
    assert f["results"]["missing"] == 0 and f["results_not_ok"] == 0, f
    assert f["offsets_committed_to_end"], f
    if mode == "exactly-once":
        assert f["dlq"]["duplicates"] == 0 and f["results"]["duplicates"] == 0, f
