"""``lag``: per partition, a group's committed offset, the log's bounds and the lag.

The lag is what the group still has to read: high watermark minus committed offset. A partition
without a commit (or whose commit fell below the log start: its records expired) has all its
retained records ahead of the group, ``high - low``, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.config import WorkerConfig
from worker.kafka.admin import Admin

NO_COMMIT = "no commit"
EXPIRED = "commit below log start (records expired)"
BEYOND = "commit beyond the end (topic recreated?)"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: int
    committed: int | None  # None: the group never committed on this partition
    low: int  # log start: the first retained offset
    high: int  # high watermark: the offset the next record gets
    lag: int
    note: str = ""


def partition_lag(partition: int, committed: int | None, low: int, high: int) -> PartitionLag:
    if committed is None:
        return PartitionLag(partition, None, low, high, high - low, NO_COMMIT)
    if committed < low:
        return PartitionLag(partition, committed, low, high, high - low, EXPIRED)
    if committed > high:
        return PartitionLag(partition, committed, low, high, 0, BEYOND)
    return PartitionLag(partition, committed, low, high, high - committed)


@dataclass(frozen=True, slots=True)
class LagReport:
    group: str
    topic: str
    partitions: list[PartitionLag]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def without_commit(self) -> int:
        return sum(p.committed is None for p in self.partitions)

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "topic": self.topic, "total_lag": self.total,
                "partitions_without_commit": self.without_commit,
                "partitions": [{"partition": p.partition, "committed": p.committed,
                                "low": p.low, "high": p.high, "lag": p.lag,
                                "note": p.note or None} for p in self.partitions]}


def read_lag(cfg: WorkerConfig, group: str, topic: str) -> LagReport:
    admin = Admin(cfg)
    parts = admin.partitions(topic)
    committed = admin.committed(group, topic, parts)
    marks = admin.watermarks(topic, parts)
    return LagReport(group, topic, [partition_lag(p, committed[p], *marks[p]) for p in parts])
