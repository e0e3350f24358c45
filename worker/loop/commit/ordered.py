"""Ordered release of outputs for exactly-once processing.

Jobs of one partition finish out of order: a malformed record is dead-lettered at once while the
record before it is still computing, two batches in flight finish in either order, an expired
job is answered before older ones. Under at-least-once that is harmless: outputs go out as they
finish and the committed offset is the lowest unfinished one, so a crash can only repeat work.

Under exactly-once it is not: a transaction commits its outputs *and* the consumer positions
atomically, and the committed position of a partition is the lowest unfinished offset. An output
of a record above that position, committed in the same transaction, would be produced a second
time after a restart (the record is below nothing committed, so it is consumed again). So the
loop releases outputs into the transaction strictly in offset order per partition: an output
waits here until every lower offset of its partition has been released. Every committed
transaction then holds, per partition, exactly the outputs of the offsets between the previous
committed position and the new one: no gap (nothing skipped after a restart) and no overlap
(nothing repeated).

Memory: held outputs belong to jobs the tracker still counts as pending, so the backpressure
watermarks bound them.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.loop.commit.offsets import OffsetTracker
from worker.loop.output import Output
from worker.wire.records import TopicPartitionKey


class OrderedRelease:
    """Per-partition reorder buffer in front of the offset tracker.

    :meth:`complete` stores a finished record's output and returns the outputs that may now be
    produced, in offset order; each returned output's offset is marked finished in the tracker
    (under exactly-once a record is finished once its output is in the open transaction).
    """

    def __init__(self, tracker: OffsetTracker) -> None:
        self._tracker = tracker
        self._held: dict[TopicPartitionKey, dict[int, Output]] = {}

    def __len__(self) -> int:
        return sum(len(h) for h in self._held.values())

    def complete(self, output: Output) -> list[Output]:
        ref = output.ref
        key = (ref.topic, ref.partition)
        if not self._tracker.is_open(key, ref.offset):
            return []  # stale: its partition was dropped or rewound since it was consumed
        held = self._held.setdefault(key, {})
        held[ref.offset] = output
        released: list[Output] = []
        while (pos := self._tracker.position(key)) is not None and pos in held:
            out = held.pop(pos)
            if not self._tracker.finish(ref.topic, ref.partition, pos):
                break  # not begun (a stale output): never release it
            released.append(out)
        if not held:
            del self._held[key]
        return released

    def drop(self, keys: Iterable[TopicPartitionKey]) -> int:
        """Forget held outputs of these partitions (revoked, lost or rewound)."""
        return sum(len(self._held.pop(k, {})) for k in keys)

    def clear(self) -> int:
        n = len(self)
        self._held.clear()
        return n
