"""OpenTelemetry spans from the loop's hop times, children of the job's traceparent."""

from __future__ import annotations

import time

import pytest

from worker.config import load_config
from worker.observe.spans import make_spans
from worker.tasks.protocol import Answer
from worker.wire.records import SourceRecord, SourceRef

otel = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter",
                           reason="the OpenTelemetry SDK (extra `otel`) is not installed")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def _answer(headers: list[tuple[str, str | bytes | None]] | None) -> Answer:
    rec = SourceRecord("jobs", 1, 42, b"job-1", b"v", headers, 0)
    a = Answer(SourceRef("jobs", 1, 42), rec, 0, "job-1", "ok", b"job-1", b"r", [])
    t = time.monotonic()
    a.consumed_at, a.batched_at, a.done_at = t - 0.030, t - 0.020, t - 0.005
    return a


def test_off_without_an_endpoint() -> None:
    assert make_spans(load_config(None)) is None


def test_job_spans_are_children_of_the_traceparent_with_the_hop_times() -> None:
    exporter = otel.InMemorySpanExporter()
    spans = make_spans(load_config(None), exporter=exporter)
    assert spans is not None
    spans.jobs([_answer([("traceparent", f"00-{TRACE_ID}-{PARENT}-01".encode())]),
                _answer(None)])
    spans.batch(0.015, 6, "b8")
    spans.close()
    done = {(s.name, s.context.trace_id): s for s in exporter.get_finished_spans()}
    traced = int(TRACE_ID, 16)
    job = done[("job", traced)]
    assert job.parent is not None and job.parent.span_id == int(PARENT, 16)
    assert job.attributes["messaging.kafka.offset"] == 42
    for name, ms in (("queue", 10), ("engine", 15)):
        child = done[(name, traced)]
        assert child.parent.span_id == job.context.span_id
        assert abs((child.end_time - child.start_time) / 1e6 - ms) < 1.0
    assert done[("output", traced)].end_time == job.end_time
    # A job without a traceparent starts its own trace; the batch span stands alone.
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["batch", "engine", "engine", "job", "job", "output", "output", "queue",
                     "queue"]
    batch = next(s for s in exporter.get_finished_spans() if s.name == "batch")
    assert batch.attributes["batch.size"] == 6
