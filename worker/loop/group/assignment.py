"""The partitions this member owns, and an epoch per partition.

An epoch moves on whenever a partition's work in progress becomes void (revoked, lost, or
rewound after an aborted transaction): an answer carries its partition's epoch at intake, and
one whose epoch is old is stale and discarded.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.wire.records import TopicPartitionKey


class Assignment:
    def __init__(self) -> None:
        self.owned: set[TopicPartitionKey] = set()
        self.epochs: dict[TopicPartitionKey, int] = {}
        self.stale_discarded = 0

    def __contains__(self, key: TopicPartitionKey) -> bool:
        return key in self.owned

    def is_current(self, key: TopicPartitionKey, epoch: int) -> bool:
        if self.epochs.get(key, 0) == epoch:
            return True
        self.stale_discarded += 1
        return False

    def bump(self, keys: Iterable[TopicPartitionKey]) -> None:
        for key in keys:
            self.epochs[key] = self.epochs.get(key, 0) + 1
