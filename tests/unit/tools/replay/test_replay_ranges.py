"""--from/--to syntax and the checks that need no broker."""

from __future__ import annotations

import time

import pytest

from worker.exceptions import WorkerError
from worker.tools.replay import BadRange, ReplayError
from worker.tools.replay.ranges import (
    TIMESTAMP_MIN_MS,
    Bound,
    check_order,
    iso_ms,
    parse_bound,
    parse_partitions,
)


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("0", "offset", 0),
        ("42", "offset", 42),
        (str(TIMESTAMP_MIN_MS - 1), "offset", TIMESTAMP_MIN_MS - 1),
        (str(TIMESTAMP_MIN_MS), "time", TIMESTAMP_MIN_MS),
        ("1700000000000", "time", 1_700_000_000_000),
        ("offset:1700000000000", "offset", 1_700_000_000_000),
        ("ts:5", "time", 5),
        ("2023-11-14T22:13:20Z", "time", 1_700_000_000_000),
        ("2023-11-14T23:13:20.250+01:00", "time", 1_700_000_000_250),
        ("EARLIEST", "earliest", 0),
        (" latest ", "latest", 0),
    ],
)
def test_parse_bound(text: str, kind: str, value: int) -> None:
    b = parse_bound(text)
    assert (b.kind, b.value) == (kind, value)


def test_now_is_the_current_time() -> None:
    before = int(time.time() * 1e3)
    b = parse_bound("now")
    assert b.kind == "time" and before <= b.value <= int(time.time() * 1e3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2023-11-14T22:13:20", "has no time zone"),
        ("yesterday", "is not an offset, an epoch-ms timestamp"),
        ("-5", "is not an offset"),
        ("offset:x", "expected a non-negative integer"),
        ("ts:", "expected a non-negative integer"),
        ("1960-01-01T00:00:00Z", "before 1970"),
    ],
)
def test_bad_bounds_name_the_option(text: str, message: str) -> None:
    with pytest.raises(BadRange) as info:
        parse_bound(text, option="--from")
    assert message in str(info.value) and "--from" in str(info.value)


def test_errors_are_worker_errors() -> None:
    assert issubclass(BadRange, ReplayError) and issubclass(ReplayError, WorkerError)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        ("9", "3", "--to (offset 3) is before --from (offset 9)"),
        ("2024-01-02T00:00:00Z", "2024-01-01T00:00:00Z", "is before --from"),
        ("7", "7", "is empty"),
        ("latest", "latest", "--from latest selects nothing"),
        ("earliest", "earliest", "--to earliest selects nothing"),
    ],
)
def test_check_order_refuses(start: str, end: str, message: str) -> None:
    with pytest.raises(BadRange) as info:
        check_order(parse_bound(start), parse_bound(end))
    assert message in str(info.value)


@pytest.mark.parametrize(("start", "end"), [
    ("3", "9"), ("earliest", "latest"), ("5", "2024-01-01T00:00:00Z"),
    ("2024-01-01T00:00:00Z", "3"), ("ts:1", "ts:2"),
])
def test_check_order_accepts(start: str, end: str) -> None:
    check_order(parse_bound(start), parse_bound(end))  # mixed kinds are checked per partition


def test_describe_and_iso() -> None:
    assert iso_ms(1_700_000_000_000) == "2023-11-14T22:13:20.000+00:00"
    assert Bound("offset", 4).describe() == "offset 4"
    assert parse_bound("1700000000000").describe() == (
        "1700000000000 (2023-11-14T22:13:20.000+00:00)")


@pytest.mark.parametrize(("text", "want"), [
    (None, None), ("", None), ("0", (0,)), ("2,0", (0, 2)), (" 1, 1 ,3", (1, 3)),
])
def test_parse_partitions(text: str | None, want: tuple[int, ...] | None) -> None:
    assert parse_partitions(text) == want


@pytest.mark.parametrize("text", ["a", "0,,1", "1;2", "-1"])
def test_parse_partitions_refuses(text: str) -> None:
    with pytest.raises(BadRange, match="--partitions"):
        parse_partitions(text)
