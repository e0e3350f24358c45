"""The metadata every offset commit carries: how many processes died at a partition's
committed position (the crash-loop breaker, :mod:`worker.loop.poison`).

The count lives in Kafka, in the commit's metadata string, because nothing else survives the
crash and follows the partition to its next owner: a synchronous consumer commit under
at-least-once, ``send_offsets_to_transaction`` under exactly-once (both store the metadata:
tested against Apache Kafka 4.x in ``tests/integration/faults/test_poison.py``).

- ``ktw.attempts=1`` on every normal commit: a process is working from this position. A
  process that dies leaves it behind, so its death is counted whatever it was doing; a
  position that moves on writes 1 again, which is how progress resets the count.
- ``ktw.attempts=k`` (k >= 2) on every commit of a partition being isolated (its *sticky*
  mark), whatever its position: k processes died since the partition last made normal
  progress.
- ``""`` when a partition is released cleanly (revoke, shutdown): nobody is working there, and
  clean rebalances must never add up to a count. But a count this process read and has not
  resolved (it never finished the record at that position) is handed over as it was (*kept*):
  a suspect revoked before its turn must not lose its deaths.

Each mark names the process that wrote it (``;by=<token>``, random per process). A partition
this very process lost (a session timeout in a broker stall) and is given back finds its own
mark: that was no death, so its own attempt is taken off the count (a normal mark reads 0 then;
without this, every partition lost in a stall came back suspect and was isolated record by
record, and repeated stalls could add up to a poison verdict on an innocent record).

Foreign metadata (another tool's commit, a reset) reads as 0: no attempts.
"""

from __future__ import annotations

import re
import secrets

import confluent_kafka as ck

from worker.wire.records import TopicPartitionKey

PREFIX = "ktw.attempts="
_PARSE = re.compile(r"ktw\.attempts=(\d{1,6})(?:;by=([0-9a-f]{1,32}))?")
# This process's token in its marks.
WRITER = secrets.token_hex(6)


def marker(attempts: int) -> str:
    return f"{PREFIX}{attempts};by={WRITER}"


def attempts_in(metadata: str | None) -> int:
    """The deaths a committed offset's metadata records (0: none, or not ours). A mark this
    process wrote counts one less: its own attempt there did not end in a death."""
    if not metadata:
        return 0
    m = _PARSE.fullmatch(metadata)
    if m is None:
        return 0
    k = int(m.group(1))
    return k - 1 if m.group(2) == WRITER else k


class CommitMarks:
    """What each partition's next commit writes as its metadata. ``default``: the mark of a
    normal commit (``""`` with the breaker off, so commits are what they always were)."""

    __slots__ = ("default", "kept", "sticky")

    def __init__(self, default: str = "") -> None:
        self.default = default
        self.sticky: dict[TopicPartitionKey, str] = {}  # partitions being isolated
        # The count read at assignment, handed over by a release at that same position.
        self.kept: dict[TopicPartitionKey, tuple[int, str]] = {}

    def metadata(self, key: TopicPartitionKey) -> str:
        return self.sticky.get(key, self.default) if self.sticky else self.default

    def offsets(self, positions: dict[TopicPartitionKey, int],
                released: frozenset[TopicPartitionKey] | set[TopicPartitionKey] = frozenset(),
                ) -> list[ck.TopicPartition]:
        """The commit of ``positions``; ``released`` partitions are given up cleanly (no mark).
        Once per commit, never per record."""
        meta = self.metadata
        return [ck.TopicPartition(t, p, o, metadata=self._released((t, p), o)
                                  if (t, p) in released else meta((t, p)))
                for (t, p), o in positions.items()]

    def _released(self, key: TopicPartitionKey, offset: int) -> str:
        kept = self.kept.get(key)
        return kept[1] if kept is not None and kept[0] == offset else ""
