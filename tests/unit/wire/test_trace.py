from __future__ import annotations

from worker.wire.trace import trace_headers

TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_only_trace_context_headers_within_the_w3c_sizes_are_carried() -> None:
    headers = [("x-other", b"1"), ("traceparent", TP), ("tracestate", b"vendor=1"),
               ("tracestate", b"x" * 513), ("traceparent", None)]
    assert trace_headers(headers) == [("traceparent", TP), ("tracestate", b"vendor=1")]
    assert trace_headers(None) == [] and trace_headers([]) == []
