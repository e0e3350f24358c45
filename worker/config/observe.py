"""The ``[metrics]`` and ``[tracing]`` sections: the metrics/health port and trace export."""

from __future__ import annotations

from pydantic import Field

from worker.config.base import Section


class MetricsSettings(Section):
    # One HTTP port serves /metrics (Prometheus), /healthz and /readyz; 0 turns it off.
    port: int = Field(9464, ge=0, le=65_535)
    # Every interface by default, so Prometheus and the kubelet reach it in any setup. In a
    # pod, bind the pod's own address (KTW_METRICS__HOST from the downward API's
    # status.podIP): not the host's interfaces under hostNetwork, not a sidecar's loopback.
    # An IPv6 address (with a ':') is served over IPv6.
    host: str = "0.0.0.0"
    # /healthz fails once the loop has not stepped for this long (a step returns within
    # batch.poll_timeout_ms, a rebalance's flush within commit.drain_timeout_s).
    heartbeat_timeout_s: float = Field(60.0, gt=0)
    # /readyz fails while records produced this long ago are still unacknowledged (a broker
    # that stopped answering), besides a lost assignment, a fatal error or engines not warm.
    delivery_stall_s: float = Field(15.0, gt=0)
    # How often librdkafka reports statistics. Consumer lag per partition comes from them, and
    # so does the rejoin watch's view of the group-coordinator connection
    # (worker/loop/group/rejoin.py): a consumer stuck after an outage is replaced up to one
    # interval later than it could be. 0 turns both off.
    statistics_interval_ms: int = Field(1_000, ge=0)


class TracingSettings(Section):
    # With an OTLP/HTTP endpoint (e.g. http://otel-collector:4318/v1/traces) and the
    # OpenTelemetry SDK installed (extra `otel`), one span per batch and per job stage is
    # exported, children of the job's W3C traceparent. The traceparent header is carried onto
    # results and DLQ records either way.
    otlp_endpoint: str | None = None
    service_name: str = "trt-worker"
