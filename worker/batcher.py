"""A FIFO batcher: pure CPU bookkeeping, no I/O, no clock of its own.

A batch is released when it is full or when its oldest job has waited ``max_delay_s``. Issue 3
replaces this with per-profile batching (padding, deadlines, fairness); the loop depends only
on ``add`` / ``take`` / ``remove`` / ``__len__``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Timed(Protocol):
    @property
    def consumed_at(self) -> float: ...


T = TypeVar("T", bound=Timed)


class FifoBatcher(Generic[T]):
    def __init__(self, max_size: int, max_delay_s: float) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        self.max_size = max_size
        self.max_delay_s = max_delay_s
        self._queue: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T) -> None:
        self._queue.append(item)

    def take(self, now: float, *, force: bool = False) -> list[T] | None:
        """The next batch if one is due at ``now`` (monotonic seconds), else None."""
        if not self._queue:
            return None
        due = (
            force
            or len(self._queue) >= self.max_size
            or now - self._queue[0].consumed_at >= self.max_delay_s
        )
        if not due:
            return None
        n = min(self.max_size, len(self._queue))
        return [self._queue.popleft() for _ in range(n)]

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop and return queued items matching ``predicate`` (e.g. of revoked partitions)."""
        kept: deque[T] = deque()
        dropped: list[T] = []
        for item in self._queue:
            (dropped if predicate(item) else kept).append(item)
        self._queue = kept
        return dropped
