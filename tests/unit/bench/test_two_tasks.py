"""The two-task bench's variants: a yield and whether moderation's streams are urgent."""

from __future__ import annotations

import pytest

from bench.generation.two_tasks import parse_variants


def test_variants_name_a_yield_and_a_priority_each() -> None:
    assert parse_variants("0:off,0:on,5:on", "5") == [(0.0, False), (0.0, True), (5.0, True)]


def test_without_variants_each_yield_runs_with_the_default_priority() -> None:
    assert parse_variants(None, "0,5") == [(0.0, True), (5.0, True)]


def test_a_variant_without_on_or_off_is_refused() -> None:
    with pytest.raises(ValueError, match="YIELD_MS:on"):
        parse_variants("5", "5")
