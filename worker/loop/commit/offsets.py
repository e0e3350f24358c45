"""Per-partition offset tracking for out-of-order completion.

Records are consumed in offset order per partition but finish in any order (different batch
times, DLQ vs results). The offset to commit for a partition is the lowest offset still
unfinished, or one past the highest finished when none is: never the last offset seen.

Under exactly-once the loop finishes a record when its output enters the open transaction,
always in offset order (see worker.loop.commit.ordered.OrderedRelease), and after an aborted
transaction
:meth:`OffsetTracker.rewind` gives the position to seek back to: the last committed one, or the
first offset consumed when nothing was committed yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from worker.wire.records import SourceRef, TopicPartitionKey


class _PartitionOffsets:
    __slots__ = ("base", "bytes", "committed", "next_offset", "open", "order")

    def __init__(self) -> None:
        self.order: deque[int] = deque()  # begun, ascending; head may already be finished
        self.open: dict[int, int] = {}  # begun and not yet finished -> the record's bytes
        self.bytes = 0  # of the open records: what backpressure bounds besides their count
        self.next_offset: int | None = None  # one past the highest offset finished in order
        self.committed: int | None = None
        self.base: int | None = None  # first offset ever begun (the group's start position)

    def begin(self, offset: int, size: int) -> bool:
        if self.base is None:
            self.base = offset
        rewound = bool(self.order) and offset <= self.order[-1]
        if rewound:
            # A rewind (seek, or re-delivery after an error): older bookkeeping is void.
            self.order.clear()
            self.open.clear()
            self.bytes = 0
        self.order.append(offset)
        self.open[offset] = size
        self.bytes += size
        return rewound

    def rewind(self, committed: int | None = None) -> int | None:
        if committed is not None:
            self.committed = committed
        target = self.committed if self.committed is not None else self.base
        self.order.clear()
        self.open.clear()
        self.bytes = 0
        self.next_offset = target
        return target

    def finish(self, offset: int) -> bool:
        if not self.drop(offset):
            return False
        self.advance()
        return True

    def drop(self, offset: int) -> bool:
        """Take a record out of the open ones (the head is advanced by :meth:`advance`)."""
        size = self.open.pop(offset, None)
        if size is None:
            return False
        self.bytes -= size
        return True

    def advance(self) -> None:
        """Past the finished head of the order (after one or more finishes)."""
        order, open_ = self.order, self.open
        while order and order[0] not in open_:
            self.next_offset = order.popleft() + 1

    def position(self) -> int | None:
        """Offset a commit should carry now: the lowest unfinished, else one past the last."""
        return self.order[0] if self.order else self.next_offset

    def uncommitted(self) -> int:
        """Offsets consumed past the committed position (the first consumed, before any
        commit): what a restart would repeat."""
        end = self.order[-1] + 1 if self.order else self.next_offset
        start = self.committed if self.committed is not None else self.base
        if end is None or start is None:
            return 0
        return max(0, end - start)


class OffsetTracker:
    """Bookkeeping only: the consumer layer decides when to commit what it returns."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartitionKey, _PartitionOffsets] = {}

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> bool:
        """Track a consumed record of ``size`` bytes; True if it went backwards (an unexpected
        re-delivery)."""
        part = self._parts.get((topic, partition))
        if part is None:  # (setdefault would build a throwaway _PartitionOffsets per record)
            part = self._parts[(topic, partition)] = _PartitionOffsets()
        return part.begin(offset, size)

    def start(self, key: TopicPartitionKey, committed: int) -> None:
        """A partition's committed position, known before its first record (the crash-loop
        breaker read it at assignment and wrote its mark there): :meth:`position` has it from
        now on, so a partition that never consumes a record can still be released at it."""
        if key not in self._parts:
            part = self._parts[key] = _PartitionOffsets()
            part.committed = part.next_offset = committed

    def partitions(self) -> list[TopicPartitionKey]:
        return list(self._parts)

    def position(self, key: TopicPartitionKey) -> int | None:
        """The lowest unfinished offset of a partition (or one past the last finished)."""
        part = self._parts.get(key)
        return part.position() if part is not None else None

    def is_open(self, key: TopicPartitionKey, offset: int) -> bool:
        part = self._parts.get(key)
        return part is not None and offset in part.open

    def rewind(self, key: TopicPartitionKey, committed: int | None = None) -> int | None:
        """Forget every begun record of a partition and return the offset to seek to: the last
        committed position (``committed`` when the caller asked the coordinator: it replaces
        the cached one), else the first offset consumed (None if the partition is unknown).
        """
        part = self._parts.get(key)
        return part.rewind(committed) if part is not None else None

    def finish(self, topic: str, partition: int, offset: int) -> bool:
        """Mark one record finished; False if its partition is no longer tracked (revoked)."""
        part = self._parts.get((topic, partition))
        return part is not None and part.finish(offset)

    def finish_many(self, refs: Iterable[SourceRef]) -> None:
        """:meth:`finish` for many records at once (a batch of delivery reports): two calls
        less per record, and each partition's head advanced once."""
        parts = self._parts
        key: TopicPartitionKey | None = None
        part: _PartitionOffsets | None = None
        touched: list[_PartitionOffsets] = []
        for ref in refs:
            if (ref.topic, ref.partition) != key:
                key = (ref.topic, ref.partition)
                part = parts.get(key)
                if part is not None and part not in touched:
                    touched.append(part)
            if part is not None:
                part.drop(ref.offset)
        for part in touched:
            part.advance()

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        """Per partition, the offsets consumed past its committed position."""
        return {key: part.uncommitted() for key, part in self._parts.items()}

    def held_bytes(self) -> int:
        """Bytes of the records begun and not finished, over every partition."""
        return sum(p.bytes for p in self._parts.values())

    def pending(self, partitions: Iterable[TopicPartitionKey] | None = None) -> int:
        keys = self._parts.keys() if partitions is None else partitions
        return sum(len(self._parts[k].open) for k in keys if k in self._parts)

    def committable(
        self, partitions: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, int]:
        """Positions that advanced since the last :meth:`mark_committed`."""
        keys = list(self._parts.keys() if partitions is None else partitions)
        out: dict[TopicPartitionKey, int] = {}
        for key in keys:
            part = self._parts.get(key)
            if part is None:
                continue
            pos = part.position()
            if pos is not None and pos != part.committed:
                out[key] = pos
        return out

    def mark_committed(self, positions: dict[TopicPartitionKey, int]) -> None:
        for key, pos in positions.items():
            part = self._parts.get(key)
            if part is not None:
                part.committed = pos

    def drop(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """Forget partitions (revoked or lost); late completions for them are ignored."""
        for key in partitions:
            self._parts.pop(key, None)
