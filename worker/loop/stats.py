"""Counters the loop keeps, logged as one structured line every ``every_s`` seconds."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stats:
    every_s: float = 10.0
    consumed: int = 0
    results: int = 0
    dead_lettered: int = 0
    expired: int = 0
    pauses: int = 0
    dead_by_reason: Counter[str] = field(default_factory=Counter)
    _last_log: float = field(default_factory=time.monotonic)
    _last_consumed: int = 0

    def totals(self) -> dict[str, int]:
        return {
            "consumed": self.consumed,
            "results": self.results,
            "dead_lettered": self.dead_lettered,
            "expired": self.expired,
            "pauses": self.pauses,
        }

    def due(self) -> bool:
        """True once ``every_s`` has passed since the last line (checked every step: cheap)."""
        return time.monotonic() - self._last_log >= self.every_s

    def log_line(self, log: Any, **extra: Any) -> None:
        now = time.monotonic()
        elapsed = now - self._last_log
        rate = (self.consumed - self._last_consumed) / elapsed
        self._last_log, self._last_consumed = now, self.consumed
        log.info("worker_stats", rate_per_s=round(rate, 1), **self.totals(), **extra)
