from __future__ import annotations

import pytest

from engines.profiles import RangeProfile, StaticProfile, profile_for

ITEM = (224, 224, 3)


def test_static_padding_picks_the_next_offered_size() -> None:
    p = StaticProfile("s", ITEM, (1, 8, 32, 128))
    assert [p.padded(n) for n in (1, 2, 8, 9, 32, 33, 128)] == [1, 8, 8, 32, 32, 128, 128]
    assert [p.largest_full(n) for n in (0, 1, 7, 8, 31, 200)] == [0, 1, 1, 8, 8, 128]
    with pytest.raises(ValueError):
        p.padded(129)


def test_range_never_pads_above_min() -> None:
    p = RangeProfile("r", ITEM, ITEM, ITEM, 4, 8, 64)
    assert [p.padded(n) for n in (1, 4, 9, 64)] == [4, 4, 9, 64]
    assert p.largest_full(3) == 0 and p.largest_full(100) == 64


@pytest.mark.parametrize("sizes", [(), (0, 8), (8, 1), (1, 1)])
def test_static_sizes_validated(sizes: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        StaticProfile("s", ITEM, sizes)


def test_range_validated() -> None:
    with pytest.raises(ValueError):
        RangeProfile("r", ITEM, ITEM, ITEM, 8, 4, 64)
    with pytest.raises(ValueError):
        RangeProfile("r", (16,), (8,), (32,), 1, 1, 1)


def test_profile_for_picks_the_first_that_fits() -> None:
    short = RangeProfile("short", (1,), (16,), (16,), 1, 8, 64)
    long = RangeProfile("long", (17,), (64,), (128,), 1, 8, 32)
    profiles = (short, long)
    assert profile_for(profiles, (10,)) is short
    assert profile_for(profiles, (100,)) is long
    assert profile_for(profiles, (129,)) is None
    assert profile_for((StaticProfile("img", ITEM, (8,)),), (224, 224, 1)) is None
