"""Per-partition progress of a replay: what is handled, what is in flight, the watermark.

A record is *handled* when its result is acknowledged by the broker, or when it was counted
as rejected (or its DLQ record acknowledged, with ``--dlq-topic``). Each handled record has a
*kind*: ``result:<status>``, ``rejected:<reason>`` or ``dlq:<reason>``.

``next`` is the watermark: every offset below it is handled. Handled offsets at or above it
(completion is out of order across batches) are kept in ``done`` with their kind, so a
checkpoint names exactly what was handled; the kinds of offsets below ``next`` are folded
into ``counts``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class PartitionLedger:
    start: int
    end: int  # exclusive
    next: int
    done: dict[int, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    open: set[int] = field(default_factory=set)  # consumed, not yet handled (never saved)

    @classmethod
    def fresh(cls, start: int, end: int) -> PartitionLedger:
        return cls(start=start, end=end, next=start)

    @property
    def finished(self) -> bool:
        return self.next >= self.end

    def is_done(self, offset: int) -> bool:
        return offset < self.next or offset in self.done

    def begin(self, offset: int) -> None:
        self.open.add(offset)

    def handle(self, offset: int, kind: str) -> None:
        """Record ``offset`` as handled with ``kind`` (idempotent: the first kind stays)."""
        self.open.discard(offset)
        if offset >= self.next and offset not in self.done:
            self.done[offset] = kind

    def advance(self, position: int | None) -> int:
        """Move the watermark: to the lowest in-flight offset, else to the consumer's
        ``position`` (one past the last record it returned; it skips gaps such as transaction
        markers). Fold what falls below into ``counts``; return the new watermark."""
        if self.open:
            target = min(self.open)
        elif position is not None and position >= 0:
            target = position
        else:
            target = self.next
        target = min(max(target, self.next), self.end)
        # Handled offsets right at the watermark move it on even without a position.
        while target in self.done and target < self.end:
            target += 1
        if target > self.next:
            for off in [o for o in self.done if o < target]:
                self.counts[self.done.pop(off)] += 1
            self.next = target
        return self.next

    def totals(self) -> Counter[str]:
        out = Counter(self.counts)
        out.update(self.done.values())
        return out

    def remaining(self) -> int:
        return self.end - self.next - len(self.done)
