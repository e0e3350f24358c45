"""W3C trace context (``traceparent``, ``tracestate``) carried from a job onto its outputs.

Results copy them from the job's headers; inline DLQ records already copy every original
header (worker.wire.dlq), records dead-lettered by reference get these two. The cost for a job
without headers is one truth test. Values longer than the W3C limits allow (traceparent is 55
characters, tracestate at most 512) are not carried: a by-reference DLQ record stays small.
"""

from __future__ import annotations

from worker.wire.records import Headers

TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
MAX_VALUE = 512


def trace_headers(headers: Headers | None) -> Headers:
    """The job's trace-context headers, in their order ([] when it has none)."""
    if not headers:
        return []
    return [(k, v) for k, v in headers
            if k in TRACE_HEADERS and v is not None and len(v) <= MAX_VALUE]
