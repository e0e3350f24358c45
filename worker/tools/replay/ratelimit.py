"""A token bucket for ``--rate``: at most ``rate`` jobs per second, bursts of one second."""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._clock = clock
        self._capacity = max(1.0, rate or 0.0)
        self._tokens = 1.0  # start gently: no burst before the first second has passed
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        if self.rate is not None:
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def available(self, want: int) -> int:
        """How many of ``want`` jobs may start now (without taking them)."""
        if self.rate is None:
            return want
        self._refill()
        return min(want, int(self._tokens))

    def take(self, n: int) -> None:
        if self.rate is not None:
            self._refill()
            self._tokens -= n

    def wait_s(self) -> float:
        """Seconds until one more token is available (0 if one is)."""
        if self.rate is None:
            return 0.0
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.rate)
