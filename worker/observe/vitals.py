"""What the loop reports about itself beyond its counters: heartbeat, warm-up, rebalances,
batches, consumer lag. Written by the loop's thread only; read by the metrics and health
endpoints from theirs (plain attribute reads: a scrape sees a value a step old at worst).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any

import structlog

from worker.observe.buckets import LATENCY_BOUNDS, RATIO_BOUNDS, SIZE_BOUNDS, Buckets

log = structlog.get_logger("worker")


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), so a start-up report includes the
    interpreter and the imports before any worker code ran; None where /proc has no answer."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # Field 22, after the parenthesised command name (which may hold spaces).
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


class Vitals:
    def __init__(self) -> None:
        self.started = time.monotonic()
        # Where start-up went, in seconds (the worker_started line carries it).
        self.startup: dict[str, float | None] = {}
        self.beat = self.started  # the loop's last step
        self.warm = False  # engines built and warmed up: the task can answer
        self.subscribed = False
        self.stopping = False
        self.lost = False  # partitions lost (broker contact gone) and not assigned since
        self.waiting: str | None = None  # why start-up waits (a topic missing or refused)
        self.rebalances: Counter[str] = Counter()
        self.batch_size: dict[str, Buckets] = {}  # per profile
        self.batch_fill: dict[str, Buckets] = {}
        self.engine_seconds: dict[str, Buckets] = {}
        self.lag: dict[tuple[str, int], int] = {}  # (topic, partition) -> records behind
        # Positions the worker committed inside transactions (exactly-once). The consumer's
        # statistics never see those commits: they keep the committed offset fetched at
        # assignment, so their consumer_lag grew with every record answered (or stayed
        # unknown, -1, for a group that had never committed).
        self.own_commits: dict[tuple[str, int], int] = {}
        # From the last statistics: is the consumer connected to its group coordinator (None:
        # no coordinator known), and when that sample arrived (monotonic).
        self.coordinator_up: bool | None = None
        self.stats_at: float | None = None

    def alive(self) -> None:
        """The loop is alive but waiting in a call (the liveness heartbeat)."""
        self.beat = time.monotonic()

    def rebalanced(self, event: str, n_partitions: int) -> None:
        self.rebalances[event] += 1
        if event == "lost":
            self.lost = True
        elif event == "assigned":
            self.lost = False
        if event != "assigned":  # revoked or lost: their lag is another member's now
            self.lag.clear()

    def note_committed(self, positions: dict[tuple[str, int], int]) -> None:
        """The committer committed these positions itself (in a transaction), or learnt them
        from the group coordinator at a rewind."""
        self.own_commits.update(positions)

    def forget(self, keys: set[tuple[str, int]]) -> None:
        """These partitions were revoked or lost (only those: under cooperative rebalancing
        the others stay, and their own commits still count)."""
        for key in keys:
            self.own_commits.pop(key, None)

    def batch_done(self, took_s: float, size: int, profile: str, capacity: int) -> None:
        if profile not in self.batch_size:
            self.batch_size[profile] = Buckets(SIZE_BOUNDS)
            self.batch_fill[profile] = Buckets(RATIO_BOUNDS)
            self.engine_seconds[profile] = Buckets(LATENCY_BOUNDS)
        self.batch_size[profile].observe(size)
        self.batch_fill[profile].observe(size / capacity if capacity > 0 else 1.0)
        self.engine_seconds[profile].observe(took_s)

    def on_stats(self, stats_json: str) -> None:
        """librdkafka's statistics callback (served from consume()): per-partition lag of the
        partitions this member fetches (``consumer_lag``: high watermark, or the last stable
        offset, minus the committed offset; -1 while either is unknown), or, where the worker
        committed a partition itself, that end offset minus its own commit."""
        try:
            stats = json.loads(stats_json)
        except ValueError:
            log.warning("statistics_unreadable", size=len(stats_json))
            return
        coordinators = [b.get("state") for name, b in (stats.get("brokers") or {}).items()
                        if name.startswith("GroupCoordinator")]
        self.coordinator_up = ("UP" in coordinators) if coordinators else None
        self.stats_at = time.monotonic()
        lag: dict[tuple[str, int], int] = {}
        for topic, t in (stats.get("topics") or {}).items():
            for pid, p in (t.get("partitions") or {}).items():
                if pid == "-1" or not p.get("desired"):
                    continue
                key = (topic, int(pid))
                own = self.own_commits.get(key)
                value = p.get("consumer_lag", -1) if own is None else _lag_after(p, own)
                if value >= 0:
                    lag[key] = value
        self.lag = lag


def _lag_after(p: dict[str, Any], own: int) -> int:
    """Records behind the end of partition statistics ``p`` when ``own`` was committed. The
    statistics' committed offset counts too: it is the newer one right after an assignment."""
    end = p.get("ls_offset", -1)
    if end < 0:
        end = p.get("hi_offset", -1)
    committed = max(own, p.get("committed_offset", -1))
    return max(0, end - committed) if end >= 0 and committed >= 0 else -1
