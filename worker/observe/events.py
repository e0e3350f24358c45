"""Warning and error log events counted by name, for ``trt_worker_errors_total{kind}``.

A structlog processor rather than a counter call beside each log line: every warning the code
already logs (commit_failed, partitions_lost, transactional_delivery_failed, ...) becomes a
series without touching those call sites, and info/debug lines pay one dict lookup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import MutableMapping
from typing import Any

COUNTS: Counter[str] = Counter()
_COUNTED = frozenset({"warning", "error", "critical"})
# Counted by their own series (trt_worker_dead_lettered_total): bad input, not a worker error.
_OWN_SERIES = frozenset({"job_dead_lettered"})


def count_events(_logger: Any, method: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
    if method in _COUNTED:
        name = str(event.get("event", "?"))
        if name not in _OWN_SERIES:
            COUNTS[name if len(name) <= 60 else "other"] += 1
    return event
