"""The syntax of ``--from`` / ``--to`` bounds (pure: no Kafka here).

A bound is one of:

- ``earliest`` / ``latest``: the partition's first retained offset / its end when the replay
  starts (the last stable offset: records of open transactions are not waited for);
- an offset: a bare integer below 10**12, or ``offset:N`` to be explicit;
- a time: epoch milliseconds (a bare integer of 10**12 or more, i.e. after 2001-09-09, or
  ``ts:N``), an ISO-8601 time with a zone (``2024-05-01T12:00:00Z``, ``...+02:00``), or ``now``.

The range is half-open, ``[from, to)``, for offsets and times alike: ``--from 10 --to 20``
replays offsets 10..19, and consecutive time windows never overlap. Offset bounds apply to
every selected partition; time bounds are resolved per partition with Kafka's
offsets_for_times (the first offset whose timestamp is at or after the time).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from worker.tools.replay.exceptions import BadRange

# Epoch milliseconds at or above this (2001-09-09) are times; bare integers below are offsets.
TIMESTAMP_MIN_MS = 10**12
_INT = re.compile(r"^[0-9]+$")

Kind = Literal["earliest", "latest", "offset", "time"]


@dataclass(frozen=True, slots=True)
class Bound:
    kind: Kind
    value: int = 0  # the offset, or epoch milliseconds for a time
    text: str = ""  # as the user wrote it, for messages

    def describe(self) -> str:
        if self.kind == "time":
            iso = iso_ms(self.value)
            return f"{self.text} ({iso})" if self.text and self.text != iso else iso
        if self.kind == "offset":
            return f"offset {self.value}"
        return self.kind


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time with millisecond precision."""
    return datetime.fromtimestamp(ms / 1e3, tz=UTC).isoformat(timespec="milliseconds")


def parse_bound(text: str, *, option: str = "bound") -> Bound:
    """Parse one ``--from``/``--to`` value; raise :class:`BadRange` naming the option."""
    raw = text.strip()
    low = raw.lower()
    if low in ("earliest", "latest"):
        return Bound(low, 0, raw)  # type: ignore[arg-type]  # narrowed by the test above
    if low == "now":
        return Bound("time", int(time.time() * 1e3), raw)
    if low.startswith("offset:"):
        return Bound("offset", _integer(raw[7:], option, raw), raw)
    if low.startswith("ts:"):
        return Bound("time", _integer(raw[3:], option, raw), raw)
    if _INT.match(raw):
        n = int(raw)
        return Bound("time" if n >= TIMESTAMP_MIN_MS else "offset", n, raw)
    return Bound("time", _iso(raw, option), raw)


def _integer(digits: str, option: str, raw: str) -> int:
    if not _INT.match(digits.strip()):
        raise BadRange(f"{option} {raw!r}: expected a non-negative integer after the prefix")
    return int(digits.strip())


def _iso(raw: str, option: str) -> int:
    try:
        when = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise BadRange(
            f"{option} {raw!r} is not an offset, an epoch-ms timestamp, an ISO-8601 time, "
            "'earliest', 'latest' or 'now'"
        ) from exc
    if when.tzinfo is None:
        raise BadRange(
            f"{option} {raw!r} has no time zone; add one (e.g. {raw}Z for UTC or {raw}+02:00)"
        )
    ms = int(when.timestamp() * 1e3)
    if ms < 0:
        raise BadRange(f"{option} {raw!r} is before 1970")
    return ms


def check_order(start: Bound, end: Bound) -> None:
    """Checks that need no broker: bounds of one kind in order, no empty-by-definition range."""
    if start.kind == "latest":
        raise BadRange("--from latest selects nothing: the range ends at the topic's end")
    if end.kind == "earliest":
        raise BadRange("--to earliest selects nothing: the end bound is exclusive")
    if start.kind == end.kind and start.kind in ("offset", "time"):
        if end.value < start.value:
            raise BadRange(
                f"--to ({end.describe()}) is before --from ({start.describe()})"
            )
        if end.value == start.value:
            raise BadRange(
                f"--to equals --from ({start.describe()}): the range [from, to) is empty"
            )


def parse_partitions(text: str | None) -> tuple[int, ...] | None:
    """``"0,2"`` -> (0, 2); None or empty -> None (all partitions)."""
    if text is None or not text.strip():
        return None
    out: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not _INT.match(item):
            raise BadRange(f"--partitions {text!r}: {item!r} is not a partition number")
        if int(item) not in out:
            out.append(int(item))
    return tuple(sorted(out))
