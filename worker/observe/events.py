"""Warning and error log events counted by name, for ``trt_worker_errors_total{kind}``.

A structlog processor rather than a counter call beside each log line: every warning the code
already logs (commit_failed, partitions_lost, transactional_delivery_failed, ...) becomes a
series without touching those call sites, and info/debug lines pay one dict lookup.

Records of plain ``logging`` loggers reach the formatter without passing structlog's chain:
librdkafka's own lines (through confluent-kafka's ``logger``) and the engines' warnings. They are
counted by :func:`count_foreign_events`, under a kind of few values: librdkafka's facility
(``librdkafka_FAIL``, ``librdkafka_GETPID``, ...), else the message's leading ``name:``, else
the logger's name.
"""

from __future__ import annotations

import logging
import re
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


_NAME = re.compile(r"[a-z][a-z0-9_]{2,59}")
_FACILITY = re.compile(r"[A-Z][A-Z0-9_]{0,31}")


def count_foreign_events(_logger: Any, method: str, event: MutableMapping[str, Any]
                         ) -> MutableMapping[str, Any]:
    """``count_events`` for a stdlib record (structlog's ``foreign_pre_chain``)."""
    if method in _COUNTED:
        COUNTS[foreign_kind(event.get("_record"), str(event.get("event", "")))] += 1
    return event


def foreign_kind(record: logging.LogRecord | None, message: str) -> str:
    if record is not None and record.name == "librdkafka":
        # confluent-kafka's lines read "FAIL [client#producer-1] [thrd:...]: text".
        facility = message.split(" ", 1)[0]
        return f"librdkafka_{facility if _FACILITY.fullmatch(facility) else 'other'}"
    head = message.split(":", 1)[0]
    if _NAME.fullmatch(head):
        return head
    return record.name[:60] if record is not None else "other"
