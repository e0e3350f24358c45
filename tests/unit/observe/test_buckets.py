from __future__ import annotations

from worker.observe.buckets import Buckets


def test_cumulative_counts_use_le_bounds_and_end_with_inf() -> None:
    b = Buckets((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        b.observe(v)
    # 0.1 and 1.0 are "less or equal": they land in their own bound's bucket.
    assert b.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert b.count == 5
    assert abs(b.sum - 8.65) < 1e-9
