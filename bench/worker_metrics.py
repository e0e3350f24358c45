"""What a worker's own histograms saw during a bench window: its /metrics read at the window's
start and end (prometheus_client's parser), and per histogram series the observations, their
sum and the bucket the largest of them fell in. A latency tail the producer side measures can
then be set against the collector's pauses, the batches' engine time and the hops of a job's
trip in the same window. Also whether a worker is ready (/readyz), from the same endpoint.
"""

from __future__ import annotations

import math
import urllib.request
from typing import Any

# The worker's histograms a window is read for (worker/observe/collector.py).
HISTOGRAMS = ("trt_worker_gc_pause_seconds", "trt_worker_engine_seconds",
              "trt_worker_hop_seconds", "trt_worker_batch_size")

# histogram -> series ("label=value,...") -> (sorted (bucket bound, cumulative count), sum)
Snapshot = dict[str, dict[str, tuple[list[tuple[float, float]], float]]]


def _get(port: int, path: str, timeout: float = 2.0) -> str | None:
    """The body of a local worker's ``path`` if it answered 200 (an HTTPError, a refused
    connection and a timeout are all OSErrors)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return str(r.read().decode())
    except OSError:
        return None


def ready(port: int) -> bool:
    """Whether the worker serving on ``port`` answers /readyz with 200 (warm, subscribed)."""
    return _get(port, "/readyz") is not None


def scrape(port: int) -> Snapshot | None:
    """The histograms of the worker serving /metrics on ``port``; None if it did not answer."""
    text = _get(port, "/metrics")
    return None if text is None else parse(text)


def parse(text: str) -> Snapshot:
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, dict[str, list[tuple[float, float]]]] = {}
    sums: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in HISTOGRAMS:
            continue
        for s in family.samples:
            series = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            series = series or "-"
            if s.name.endswith("_bucket"):
                buckets.setdefault(family.name, {}).setdefault(series, []).append(
                    (float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                sums.setdefault(family.name, {})[series] = s.value
    return {name: {key: (sorted(b), sums.get(name, {}).get(key, 0.0))
                   for key, b in series.items()}
            for name, series in buckets.items()}


def delta(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """Per histogram and series, what was observed between the two snapshots: ``n``, ``sum``,
    and the upper bounds of the buckets the median (``p50_le``), the 99th percentile
    (``p99_le``) and the largest new observation (``max_le``) fell in."""
    if before is None or after is None:
        return {"error": "the worker's /metrics did not answer"}
    out: dict[str, Any] = {}
    for name, series in after.items():
        for key, (now, now_sum) in series.items():
            was_b, was_sum = before.get(name, {}).get(key, ([], 0.0))
            was = dict(was_b)
            gains = [(le, cum - was.get(le, 0.0)) for le, cum in now]
            n = gains[-1][1] if gains else 0.0  # the +Inf bucket: every observation
            if n <= 0:
                continue
            out.setdefault(name.removeprefix("trt_worker_"), {})[key] = {
                "n": int(n), "sum": round(now_sum - was_sum, 6),
                "p50_le": _bound(gains, 0.5 * n), "p99_le": _bound(gains, 0.99 * n),
                "max_le": _bound(gains, n)}
    return out


def _bound(gains: list[tuple[float, float]], rank: float) -> float | str:
    """The upper bound of the first cumulative bucket holding ``rank`` observations (the one the
    observation of that rank fell in); "+Inf" past the last finite bound."""
    le = next(le for le, g in gains if g >= rank)
    return le if math.isfinite(le) else "+Inf"
