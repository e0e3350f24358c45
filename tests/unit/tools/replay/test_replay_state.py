"""The state file: round trip, atomic replacement, refusal to resume another replay."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from worker.tools.replay import ReplayError, StateMismatch
from worker.tools.replay.ledger import PartitionLedger
from worker.tools.replay.state import ReplayState, load_state, save_state


def _state() -> ReplayState:
    return ReplayState(
        replay_id="abc123", topic="jobs", to_topic="replay", dlq_topic=None,
        bounds={"from": "earliest", "to": "2024-01-01T00:00:00Z"}, engine="ort-1", model="m",
        partitions={
            0: PartitionLedger(start=0, end=10, next=4, done={6: "result:ok"},
                               counts=Counter({"result:ok": 3, "rejected:schema": 1})),
            2: PartitionLedger.fresh(5, 7),
        },
        scan_from={"replay": {0: 17, 1: 3}}, output_start={"replay": {0: 11, 1: 3}},
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    save_state(path, _state())
    back = load_state(path)
    assert back is not None
    assert back.partitions[0].done == {6: "result:ok"}
    assert back.partitions[0].counts == Counter({"result:ok": 3, "rejected:schema": 1})
    assert (back.partitions[2].start, back.partitions[2].end, back.partitions[2].next) == (5, 7, 5)
    assert back.scan_from == {"replay": {0: 17, 1: 3}}
    assert back.output_start == {"replay": {0: 11, 1: 3}}
    assert back.totals() == Counter({"result:ok": 4, "rejected:schema": 1})
    assert (back.replay_id, back.engine, back.bounds) == ("abc123", "ort-1", _state().bounds)
    assert not back.partitions[0].open, "in-flight work is never saved"


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert load_state(tmp_path / "nope.json") is None


def test_failed_write_keeps_the_old_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    path = tmp_path / "state.json"
    save_state(path, _state())
    old = path.read_bytes()
    newer = _state()
    newer.partitions[0].next = 9

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(ReplayError, match="disk full"):
        save_state(path, newer)
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"], "no temp file left behind"


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"format": 99}),
                                  json.dumps({"format": 1, "replay_id": "x"})])
def test_bad_files_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(StateMismatch):
        load_state(path)


def test_resume_with_other_arguments_is_refused() -> None:
    s = _state()
    s.check_matches(topic="jobs", to_topic="replay", dlq_topic=None, bounds=s.bounds,
                    partitions=None)
    s.check_matches(topic="jobs", to_topic="replay", dlq_topic=None, bounds=s.bounds,
                    partitions=[2, 0])
    with pytest.raises(StateMismatch) as info:
        s.check_matches(topic="jobs2", to_topic="replay", dlq_topic="dlq",
                        bounds={"from": "5", "to": s.bounds["to"]}, partitions=[0])
    text = str(info.value)
    for part in ("--topic 'jobs2'", "--dlq-topic 'dlq'", "--from '5'", "--partitions [0]"):
        assert part in text
    assert "--to-topic" not in text and "--to '" not in text
