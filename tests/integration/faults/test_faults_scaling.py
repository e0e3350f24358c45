"""Scaling 1 -> 3 -> 1 workers under load: cooperative-sticky rebalances move
partitions while jobs flow; no job is lost, and under exactly-once none is answered twice
(read_committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.faults import run_scaling

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_scale_one_to_three_to_one_under_load(kafka_bootstrap: str, tmp_path: Path,
                                              mode: str) -> None:
    f = run_scaling(kafka_bootstrap, tmp_path, mode=mode)
    print("\nscaling", json.dumps(f, sort_keys=True))
    assert f["exit_codes"] == {"a1": 0, "a2": 0, "a0": 0}, f
    # The scale-out was real: each added worker answered jobs; the first one saw revocations.
    assert all(f["results_per_worker"][n] > 0 for n in ("a1", "a2")), f
    assert f["revokes_per_worker"]["a0"] >= 2, f
    assert f["drained"], f
    assert f["results"]["missing"] == 0 and f["dlq"]["missing"] == 0, f
    assert f["results"]["unexpected"] == 0, f
    assert f["offsets_committed_to_end"], f
    if mode == "exactly-once":
        assert f["results"]["duplicates"] == 0 and f["dlq"]["duplicates"] == 0, f
