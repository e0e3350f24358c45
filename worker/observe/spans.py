"""OpenTelemetry spans, only when ``tracing.otlp_endpoint`` is set (nothing imported otherwise).

Per job a ``job`` span (consumed -> result produced) with ``queue``, ``engine`` and ``output``
children, a child of the job's W3C ``traceparent`` when it has one; per engine batch a
``batch`` span. The loop already timestamps each hop (worker.loop.hops), so spans are made
after the fact with those times: no span is open across the loop's steps, and exporting runs on
the SDK's own thread (BatchSpanProcessor).
"""

from __future__ import annotations

import time
from typing import Any

from worker.config import WorkerConfig
from worker.exceptions import ConfigError
from worker.tasks.protocol import Answer


class JobObserver:
    """What the loop tells about jobs and batches as they finish; this one does nothing (no
    tracing). :class:`JobSpans` makes spans of it."""

    def jobs(self, answers: list[Answer]) -> None:
        """Answers about to be produced, with their hop times."""

    def batch(self, took_s: float, size: int, profile: str) -> None:
        """An engine batch finished."""

    def close(self) -> None:
        """The worker stopped."""


class JobSpans(JobObserver):
    def __init__(self, tracer: Any, provider: Any) -> None:
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer, self._provider = tracer, provider
        self._in_context = set_span_in_context
        self._extract = TraceContextTextMapPropagator().extract

    def _parent(self, headers: Any) -> Any:
        carrier = {k: (v.decode("latin-1") if isinstance(v, bytes) else v)
                   for k, v in headers or () if k in ("traceparent", "tracestate")}
        return self._extract(carrier) if carrier else None

    def jobs(self, answers: list[Answer]) -> None:
        offset = time.time_ns() - time.monotonic_ns()  # monotonic seconds -> epoch ns

        def ns(t: float) -> int:
            return int(t * 1e9) + offset

        now, start = ns(time.monotonic()), self._tracer.start_span
        for a in answers:
            if not a.done_at:
                continue
            job = start("job", context=self._parent(a.record.headers),
                        start_time=ns(a.consumed_at),
                        attributes={"job.id": a.job_id or "", "messaging.destination.name":
                                    a.ref.topic, "messaging.kafka.partition": a.ref.partition,
                                    "messaging.kafka.offset": a.ref.offset,
                                    "job.status": str(a.status)})
            ctx = self._in_context(job)
            for name, t0, t1 in (("queue", a.consumed_at, a.batched_at),
                                 ("engine", a.batched_at, a.done_at)):
                start(name, context=ctx, start_time=ns(t0)).end(end_time=ns(t1))
            start("output", context=ctx, start_time=ns(a.done_at)).end(end_time=now)
            job.end(end_time=now)

    def batch(self, took_s: float, size: int, profile: str) -> None:
        end = time.time_ns()
        self._tracer.start_span("batch", start_time=end - int(took_s * 1e9), attributes={
            "batch.size": size, "batch.profile": profile}).end(end_time=end)

    def close(self) -> None:
        self._provider.shutdown()  # flushes what is queued


def make_spans(cfg: WorkerConfig, exporter: Any = None) -> JobSpans | None:
    """Spans to ``tracing.otlp_endpoint`` (OTLP/HTTP), or to ``exporter`` (tests); None when
    tracing is off."""
    if exporter is None and not cfg.tracing.otlp_endpoint:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError("tracing.otlp_endpoint is set but the OpenTelemetry SDK is not "
                          "installed: pip install 'kafka-trt-worker[otel]'") from exc
    if exporter is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError("tracing.otlp_endpoint needs the OTLP exporter: pip install "
                              "'kafka-trt-worker[otel]'") from exc
        exporter = OTLPSpanExporter(endpoint=cfg.tracing.otlp_endpoint)
    provider = TracerProvider(resource=Resource.create({
        "service.name": cfg.tracing.service_name,
        "service.instance.id": cfg.kafka.instance_id}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return JobSpans(provider.get_tracer("kafka-trt-worker"), provider)
