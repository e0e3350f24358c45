"""Watching worker processes (and Prometheus) over HTTP in the integration tests."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable


def get(url: str) -> tuple[int, str]:
    """Status and body; an error status keeps its body (Prometheus explains a bad query in
    it); status 0 while nothing listens yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``check()`` held; an AssertionError naming ``what`` past ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")
