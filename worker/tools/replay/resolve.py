"""Bounds -> per-partition offset ranges, validated against the topic before anything is read.

Errors (all :class:`BadRange`, raised before the replay consumes a record): unknown topic,
unknown partition, end before start, a time before the topic's first message (its data would
be missing, e.g. removed by retention: use ``earliest``), an offset outside what the
partition holds, a range that selects nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.kafka.admin import Admin, Found
from worker.tools.replay.exceptions import BadRange, UnknownPartition
from worker.tools.replay.kafka import topic_ends, topic_partitions
from worker.tools.replay.ranges import Bound, check_order, iso_ms


@dataclass(frozen=True, slots=True)
class PartitionRange:
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def select_partitions(admin: Admin, topic: str, wanted: Sequence[int] | None) -> list[int]:
    existing = topic_partitions(admin, topic)
    if wanted is None:
        return existing
    missing = sorted(set(wanted) - set(existing))
    if missing:
        raise UnknownPartition(
            f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
            f"(it has {len(existing)}: {', '.join(map(str, existing))})"
        )
    return sorted(wanted)


def resolve_range(admin: Admin, topic: str, partitions: Sequence[int] | None,
                  start: Bound, end: Bound) -> dict[int, PartitionRange]:
    """The offsets ``[start, end)`` to replay per selected partition."""
    parts = select_partitions(admin, topic, partitions)
    check_order(start, end)
    marks = topic_ends(admin, topic, parts)
    if all(low >= high for low, high in marks.values()):
        raise BadRange(f"topic {topic!r} holds no records in partitions "
                       f"{', '.join(map(str, parts))}")
    times = [(opt, b) for opt, b in (("--from", start), ("--to", end)) if b.kind == "time"]
    if times:
        _check_first_message(admin, topic, marks, times)
    out: dict[int, PartitionRange] = {}
    for p in parts:
        s = _offset(admin, topic, p, marks[p], start, "--from")
        e = _offset(admin, topic, p, marks[p], end, "--to")
        if e < s:
            raise BadRange(f"partition {p}: --to ({end.describe()}) resolves to offset {e}, "
                           f"before --from ({start.describe()}) at offset {s}")
        out[p] = PartitionRange(s, e)
    if sum(r.size for r in out.values()) == 0:
        raise BadRange(f"the range [{start.describe()}, {end.describe()}) selects no records "
                       f"of {topic!r}")
    return out


def _check_first_message(admin: Admin, topic: str, marks: dict[int, tuple[int, int]],
                         bounds: list[tuple[str, Bound]]) -> None:
    with_data = [p for p, (low, high) in marks.items() if low < high]
    firsts = [f.timestamp for f in admin.offsets_for_time(topic, with_data, 0).values()
              if f.offset >= 0 and f.timestamp >= 0]
    if not firsts:
        return  # records without timestamps: nothing to compare with
    first = min(firsts)
    early = [f"{opt} {b.describe()}" for opt, b in bounds if b.value < first]
    if early:
        raise BadRange(
            f"{' and '.join(early)}: before the first message of {topic!r} "
            f"({iso_ms(first)}, epoch ms "
            f"{first}); older records are not there (never written, or removed by retention). "
            "Use --from earliest to start at the first retained record."
        )


def _offset(admin: Admin, topic: str, p: int, mark: tuple[int, int], b: Bound,
            option: str) -> int:
    low, high = mark
    if b.kind == "earliest":
        return low
    if b.kind == "latest":
        return high
    if b.kind == "offset":
        if b.value < low:
            raise BadRange(f"{option} offset {b.value} is before partition {p}'s first retained "
                           f"offset {low} (use --from earliest)")
        if b.value > high:
            raise BadRange(f"{option} offset {b.value} is past partition {p}'s end {high} "
                           "(use --to latest, or pick partitions with --partitions)")
        return b.value
    found: Found = admin.offsets_for_time(topic, [p], b.value)[p]
    return high if found.offset < 0 else min(max(found.offset, low), high)
