"""Compare maths: verdict transitions, score-shift statistics, the most changed jobs."""

from __future__ import annotations

import pytest

from worker.tools.replay.compare.maths import ResultView, compare, histogram, shift_stats, view_of


def _v(job: str, verdict: str | None, nsfw: float, status: str = "ok") -> ResultView:
    return ResultView(job, status, verdict, {"nsfw": nsfw, "sfw": 1 - nsfw}, "e")


def test_planted_changes_are_counted_exactly() -> None:
    old = {f"j{i}": _v(f"j{i}", "allow", 0.01) for i in range(10)}
    old["j0"] = _v("j0", "block", 0.9)
    old["j1"] = _v("j1", "block", 0.95)
    old["j2"] = _v("j2", "review", 0.3)
    old["j3"] = _v("j3", None, 0.0, status="expired")
    old["gone"] = _v("gone", "allow", 0.5)  # not replayed: ignored
    new = {f"j{i}": _v(f"j{i}", "allow", 0.01) for i in range(10)}
    new["j9"] = _v("j9", "allow", 0.05)  # score moved, verdict did not
    new["extra"] = _v("extra", "allow", 0.0)

    c = compare(new, old, top_n=3)
    assert (c.matched, c.only_new, c.verdict_changed) == (10, 1, 4)
    assert c.changes() == {"(expired)->allow": 1, "block->allow": 2, "review->allow": 1}
    assert c.transitions["allow"] == {"allow": 6}
    assert c.changed_by_label == {"(expired)": {"gained": 0, "lost": 1},
                                  "allow": {"gained": 4, "lost": 0},
                                  "block": {"gained": 0, "lost": 2},
                                  "review": {"gained": 0, "lost": 1}}
    nsfw = c.shifts["nsfw"]
    assert nsfw.n == 10 and nsfw.changed == 5
    assert nsfw.max_abs == pytest.approx(0.94)
    assert nsfw.median == pytest.approx(0.0)
    assert nsfw.mean == pytest.approx((-0.89 - 0.94 - 0.29 + 0.01 + 0.04) / 10)
    # Verdict changes first, largest shift first among them; the top is cut at top_n.
    assert [j.id for j in c.top] == ["j1", "j0", "j2"]
    assert c.top[0].shifts["nsfw"] == pytest.approx(-0.94)
    doc = c.to_json()
    assert doc["changes"] == c.changes() and doc["shifts"]["nsfw"]["changed"] == 5


def test_no_old_results() -> None:
    c = compare({"a": _v("a", "allow", 0.1)}, {})
    assert (c.matched, c.only_new, c.verdict_changed, c.top) == (0, 1, 0, [])
    assert c.shifts == {}


def test_histogram_is_symmetric_and_counts_everything() -> None:
    values = [-0.5, -0.1, 0.0, 0.0, 0.2, 0.25]
    edges, counts = histogram(values, bins=11)
    assert len(edges) == 12 and sum(counts) == len(values)
    assert edges[0] == pytest.approx(-edges[-1]) and edges[-1] >= 0.5
    assert counts[5] == 2, "the middle bin holds the zero shifts"
    edges, counts = histogram([0.0, 0.0])
    assert sum(counts) == 2 and edges[-1] > 0


def test_shift_stats_of_nothing() -> None:
    s = shift_stats("nsfw", [])
    assert (s.n, s.mean, s.max_abs, s.changed) == (0, None, None, 0)


def test_view_of() -> None:
    v = view_of({"id": "a", "status": "expired", "scores": {"nsfw": 1}, "engine_hash": "x"})
    assert v is not None and v.outcome == "(expired)" and v.scores == {"nsfw": 1.0}
    assert view_of({"id": "a"}) is None
    assert view_of({"status": "ok"}) is None
