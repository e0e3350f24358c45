"""Partitions paused in librdkafka because what is consumed past their committed position would
otherwise grow without bound.

Backpressure (:mod:`worker.loop.backpressure`) counts open records, so it never sees a
partition whose head is stuck (one output that cannot be delivered: a DLQ whose WRITE was
revoked) while the records behind it are answered: the committed position stays put, the
offset bookkeeping grows one entry per record, and a restart repeats everything consumed
since. Two bounds here:

- per partition, ``batch.max_uncommitted_per_partition`` offsets consumed past the committed
  position: that partition is paused until it is back under half the limit. The limit is
  also the most a restart repeats of it;
- for the whole worker, held back by backpressure and holding a quarter more than a high
  watermark (records or bytes): the keepalive consume, which serves librdkafka's callbacks,
  admits one record each time, so with outputs stuck the held records grew without limit.
  Every assigned partition is paused until backpressure lets go. A working engine never gets
  there: the keepalive admits two records a second, a quarter of 512 takes a minute.

Pausing in librdkafka drops its prefetched records (they are fetched again on resume), which
is why backpressure itself does not pause; these bounds engage only when something is stuck.
Readiness reports a held partition (:meth:`PartitionHold.reason`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import confluent_kafka as ck
import structlog

from worker.wire.records import TopicPartitionKey

log = structlog.get_logger("worker")
# Pauses are asserted again this often: a committer that resumes its partitions after its own
# wait (exactly-once's outage or hold) must not release a partition held here.
REASSERT_S = 1.0


class PartitionHold:
    def __init__(self, pause: Callable[[list[ck.TopicPartition]], None],
                 resume: Callable[[list[ck.TopicPartition]], None], *,
                 max_uncommitted: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._pause, self._resume, self._clock = pause, resume, clock
        self.max_uncommitted = max_uncommitted
        self.held: dict[TopicPartitionKey, str] = {}  # partition -> why
        self._asserted_at = 0.0
        self.holds = 0  # partitions put on hold, in all

    def update(self, uncommitted: dict[TopicPartitionKey, int],
               owned: Iterable[TopicPartitionKey], *, overfull: bool) -> None:
        """Hold the partitions over the limit (all of them when ``overfull``), release those
        back under half of it."""
        owned = set(owned)
        limit, held = self.max_uncommitted, self.held
        want: dict[TopicPartitionKey, str] = {}
        for key in owned:
            span = uncommitted.get(key, 0)
            if span >= limit or (key in held and span > limit // 2
                                 and held[key].startswith("uncommitted")):
                want[key] = f"uncommitted records past the committed position: {span}"
            elif overfull:
                want[key] = "held back with a quarter over the high watermark held"
        release = [k for k in held if k not in want]
        new = [k for k in want if k not in held]
        self.held = want
        now = self._clock()
        if release:
            still = [k for k in release if k in owned]
            if still:
                self._resume(_tps(still))
            log.info("partitions_released", partitions=_names(release))
        if new:
            self.holds += len(new)
            self._pause(_tps(new))
            self._asserted_at = now
            log.warning("partitions_held", partitions=_names(new),
                        reasons=sorted({want[k] for k in new}),
                        max_uncommitted=limit)
        elif want and now - self._asserted_at >= REASSERT_S:
            self._pause(_tps(want))
            self._asserted_at = now

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        for key in keys:
            self.held.pop(key, None)

    def reason(self) -> str | None:
        if not self.held:
            return None
        key, why = next(iter(sorted(self.held.items())))
        more = f" (and {len(self.held) - 1} more)" if len(self.held) > 1 else ""
        return f"partition {key[0]}[{key[1]}] paused: {why}{more}"


def _tps(keys: Iterable[TopicPartitionKey]) -> list[ck.TopicPartition]:
    return [ck.TopicPartition(t, p) for t, p in sorted(keys)]


def _names(keys: Iterable[TopicPartitionKey]) -> list[str]:
    return [f"{t}[{p}]" for t, p in sorted(keys)]
