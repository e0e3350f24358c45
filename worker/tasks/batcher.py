"""Dynamic batching per engine profile: pure CPU bookkeeping, no I/O, no clock of its own.

Rules (each unit-tested in tests/unit/tasks/test_batcher.py):
- fill: a profile's batch is due once ``min(max_batch_size, profile max)`` jobs are queued;
- delay: ... or once its oldest job has waited ``max_delay_s``;
- deadline: a job whose deadline has passed is returned as expired, never batched (unless
  ``expire_deadlines`` is off: replay asks what the model says now, not whether in time);
- padding: a due batch is padded up to the profile's next static size, unless that would waste
  more than ``max_pad_fraction`` of it; then the largest full static size is taken instead and
  the rest waits for the next call;
- fairness: a batch takes jobs round-robin across source partitions, so a hot partition cannot
  starve a quiet one;
- budget: with ``weight`` and ``max_weight``, a batch's jobs weigh at most ``max_weight``
  together (a heavier job goes alone; the next job that does not fit waits, none is skipped),
  and a profile is also due once its queued jobs weigh that much. Generation weighs a job by
  its images: one-image jobs fill a batch that jobs of the most images would fill two at a
  time.
The loop asks ``schedule(now, limit=free slots)`` each step; several batches may be in flight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from engines.profiles import Profile, profile_for


class Batchable(Protocol):
    @property
    def consumed_at(self) -> float: ...  # monotonic seconds

    @property
    def deadline_ms(self) -> int | None: ...  # epoch milliseconds

    @property
    def partition_key(self) -> Hashable: ...

    @property
    def item_shape(self) -> tuple[int, ...]: ...


T = TypeVar("T", bound=Batchable)


class NoProfileFits(ValueError):
    """No configured profile accepts the item's shape."""


@dataclass(slots=True)
class Batch(Generic[T]):
    profile: Profile
    items: list[T]
    padded_size: int


@dataclass(slots=True)
class Scheduled(Generic[T]):
    batches: list[Batch[T]] = field(default_factory=list)
    expired: list[T] = field(default_factory=list)


@dataclass(slots=True)
class _ProfileQueue(Generic[T]):
    profile: Profile
    by_partition: dict[Hashable, deque[T]] = field(default_factory=dict)
    # Partitions with queued items, in round-robin order (served from the left).
    order: deque[Hashable] = field(default_factory=deque)
    count: int = 0
    weight: int = 0  # of the queued items, under the batcher's ``weight``

    def oldest(self) -> float:
        return min(q[0].consumed_at for q in self.by_partition.values())


class DynamicBatcher(Generic[T]):
    def __init__(
        self,
        profiles: tuple[Profile, ...],
        *,
        max_batch_size: int,
        max_delay_s: float,
        max_pad_fraction: float = 0.5,
        expire_deadlines: bool = True,
        weight: Callable[[T], int] | None = None,
        max_weight: int | None = None,
    ) -> None:
        if not profiles:
            raise ValueError("at least one profile is required")
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if (weight is None) != (max_weight is None):
            raise ValueError("weight and max_weight go together")
        if max_weight is not None and max_weight < 1:
            raise ValueError("max_weight must be >= 1")
        # None: every job weighs nothing and no budget applies (moderation's hot path skips it)
        self._weigh = weight
        self.max_weight = max_weight
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_pad_fraction = max_pad_fraction
        self.expire_deadlines = expire_deadlines
        self._queues = {p.name: _ProfileQueue[T](p) for p in profiles}
        self.profiles = profiles
        # Item shape -> its profile: jobs of one kind share a few shapes, so the profile
        # search runs once per shape instead of once per job.
        self._fits: dict[tuple[int, ...], Profile | None] = {}

    def __len__(self) -> int:
        return sum(q.count for q in self._queues.values())

    def add(self, item: T) -> Profile:
        shape = item.item_shape
        try:
            profile = self._fits[shape]
        except KeyError:
            profile = self._fits[shape] = profile_for(self.profiles, shape)
        if profile is None:
            raise NoProfileFits(f"no engine profile accepts an input of shape {shape}")
        q = self._queues[profile.name]
        key = item.partition_key
        if key not in q.by_partition:
            q.by_partition[key] = deque()
            q.order.append(key)
        q.by_partition[key].append(item)
        q.count += 1
        if self._weigh is not None:
            q.weight += self._weigh(item)
        return profile

    def schedule(self, now: float, now_ms: int, *, limit: int, force: bool = False
                 ) -> Scheduled[T]:
        """Release up to ``limit`` due batches (oldest profile first) and any expired jobs met."""
        out: Scheduled[T] = Scheduled()
        ready = [q for q in self._queues.values() if q.count]
        ready.sort(key=lambda q: q.oldest())
        for q in ready:
            while q.count and len(out.batches) < limit:
                batch = self._take(q, now, now_ms, force, out.expired)
                if batch is None:
                    break
                out.batches.append(batch)
        return out

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop and return queued items matching ``predicate`` (e.g. of revoked partitions)."""
        dropped: list[T] = []
        for q in self._queues.values():
            for key in list(q.by_partition):
                kept = deque(i for i in q.by_partition[key] if not predicate(i))
                dropped.extend(i for i in q.by_partition[key] if predicate(i))
                if kept:
                    q.by_partition[key] = kept
                else:
                    del q.by_partition[key]
            q.order = deque(k for k in q.order if k in q.by_partition)
            q.count = sum(len(d) for d in q.by_partition.values())
            if self._weigh is not None:
                q.weight = sum(self._weigh(i) for d in q.by_partition.values() for i in d)
        return dropped

    def _take(self, q: _ProfileQueue[T], now: float, now_ms: int, force: bool,
              expired: list[T]) -> Batch[T] | None:
        cap = min(self.max_batch_size, q.profile.max_batch)
        full = q.count >= cap or (self.max_weight is not None and q.weight >= self.max_weight)
        if not (force or full or now - q.oldest() >= self.max_delay_s):
            return None
        n = min(q.count, cap)
        padded = q.profile.padded(n)
        if (padded - n) / padded > self.max_pad_fraction:
            largest = q.profile.largest_full(n)
            if largest:
                n, padded = largest, largest
        items = self._round_robin(q, n, now_ms if self.expire_deadlines else None, expired)
        if not items:
            return None
        return Batch(q.profile, items, q.profile.padded(len(items)))

    def _round_robin(self, q: _ProfileQueue[T], n: int, now_ms: int | None,
                     expired: list[T]) -> list[T]:
        """Up to ``n`` jobs across partitions; past-deadline ones go to ``expired`` (none when
        ``now_ms`` is None)."""
        if self.max_weight is not None:
            return self._round_robin_weighed(q, n, now_ms, expired)
        items: list[T] = []
        while len(items) < n and q.order:
            key = q.order.popleft()
            dq = q.by_partition[key]
            item = dq.popleft()
            q.count -= 1
            if dq:
                q.order.append(key)
            else:
                del q.by_partition[key]
            if now_ms is not None and item.deadline_ms is not None and now_ms > item.deadline_ms:
                expired.append(item)
            else:
                items.append(item)
        return items

    def _round_robin_weighed(self, q: _ProfileQueue[T], n: int, now_ms: int | None,
                             expired: list[T]) -> list[T]:
        """:meth:`_round_robin` within ``max_weight``; expired jobs weigh nothing in the batch.
        Apart so that batchers without a budget (moderation's, per job) skip its checks."""
        assert self._weigh is not None and self.max_weight is not None
        items: list[T] = []
        used = 0
        while len(items) < n and q.order:
            key = q.order[0]
            dq = q.by_partition[key]
            head = dq[0]
            w = self._weigh(head)
            expiring = (now_ms is not None and head.deadline_ms is not None
                        and now_ms > head.deadline_ms)
            if not expiring and items and used + w > self.max_weight:
                break  # the next job waits for the next batch; none is pulled ahead
            q.order.popleft()
            dq.popleft()
            q.count -= 1
            q.weight -= w
            if dq:
                q.order.append(key)
            else:
                del q.by_partition[key]
            if expiring:
                expired.append(head)
            else:
                items.append(head)
                used += w
        return items
