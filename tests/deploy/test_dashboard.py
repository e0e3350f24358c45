"""The Grafana dashboard (deploy/grafana/trt-worker-dashboard.json) uses only the metrics the
worker exports, each as its type allows, in PromQL that parses, and covers every one of them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.conftest import DEPLOY, missing, promql_parser

DASHBOARD = DEPLOY / "grafana" / "trt-worker-dashboard.json"

# The worker's metrics (worker/observe/collector.py), by type.
COUNTERS = {
    "trt_worker_records_consumed_total", "trt_worker_results_total",
    "trt_worker_dead_lettered_total", "trt_worker_expired_total", "trt_worker_errors_total",
    "trt_worker_pauses_total", "trt_worker_rebalances_total", "trt_worker_transactions_total",
}
HISTOGRAMS = {"trt_worker_batch_size", "trt_worker_batch_fill_ratio", "trt_worker_hop_seconds",
              "trt_worker_gc_pause_seconds", "trt_worker_engine_seconds"}
GAUGES = {
    "trt_worker_pending_records", "trt_worker_paused", "trt_worker_consumer_lag_records",
    "trt_worker_gpu_memory_used_bytes", "trt_worker_gpu_utilization_ratio", "trt_worker_info",
    "trt_worker_ready", "trt_worker_last_step_timestamp_seconds", "trt_worker_held_bytes",
    "trt_worker_gpu_memory_total_bytes",
}
ALLOWED = COUNTERS | HISTOGRAMS | GAUGES
SUFFIXES = ("_bucket", "_sum", "_count")
NAME = re.compile(r"\btrt_worker_[A-Za-z0-9_:]*")


def family(name: str) -> str:
    """The exported metric a series name belongs to (histogram series lose their suffix)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in HISTOGRAMS:
            return name.removesuffix(suffix)
    return name


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(d) for t in p.get("targets", [])]


def variable_queries(d: dict[str, Any]) -> list[str]:
    out = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def as_promql(expr: str) -> str:
    """Grafana's variables replaced by values PromQL accepts."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def test_structure(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "trt-worker"
    assert dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for p in panels(dashboard):
        assert {"h", "w", "x", "y"} <= p["gridPos"].keys()
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"], p["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= names


def test_only_the_workers_metrics(dashboard: dict[str, Any]) -> None:
    used = {n for e in exprs(dashboard) + variable_queries(dashboard) for n in NAME.findall(e)}
    unknown = {n for n in used if family(n) not in ALLOWED}
    assert not unknown, f"not exported by the worker: {sorted(unknown)}"
    # Histograms are series: _bucket, _sum and _count, never the bare name.
    assert not used & HISTOGRAMS


def test_every_metric_is_on_the_dashboard(dashboard: dict[str, Any]) -> None:
    used = {family(n) for e in exprs(dashboard) for n in NAME.findall(e)}
    assert used == ALLOWED, f"missing: {sorted(ALLOWED - used)}"


def test_required_panels(dashboard: dict[str, Any]) -> None:
    by_metric: dict[str, set[str]] = {}
    for p in panels(dashboard):
        for t in p.get("targets", []):
            for n in NAME.findall(t["expr"]):
                by_metric.setdefault(family(n), set()).add(p["title"])
    titles = " | ".join(p["title"] for p in panels(dashboard)).lower()
    for word in ("consumed", "lag", "p50 per hop", "p99 per hop", "batch fill",
                 "dead-lettered / s by reason", "gpu memory", "gpu utilisation", "readiness"):
        assert word in titles, word
    hop = [e for e in exprs(dashboard) if "trt_worker_hop_seconds_bucket" in e]
    assert any("histogram_quantile(0.5," in e for e in hop)
    assert any("histogram_quantile(0.99," in e for e in hop)
    assert all("by (le, hop)" in e for e in hop)
    assert any("sum by (reason)" in e for e in exprs(dashboard)
               if "trt_worker_dead_lettered_total" in e)
    assert "Readiness" in by_metric["trt_worker_ready"]


def check_promql(pp: Any, expressions: list[str]) -> None:
    """Each expression parses; its selectors name the worker's metrics; counter series (and
    histogram _bucket/_sum/_count) only under rate(), irate() or increase(), gauges never."""

    def selectors(node: Any, under_rate: bool, out: list[tuple[str | None, bool]]) -> None:
        if isinstance(node, pp.VectorSelector):
            out.append((node.name, under_rate))
            return
        if isinstance(node, pp.Call):
            rated = node.func.name in {"rate", "irate", "increase"}
            for arg in node.args:
                selectors(arg, rated, out)
            return
        for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                selectors(child, under_rate, out)

    for expr in expressions:
        try:
            ast = pp.parse(as_promql(expr))
        except ValueError as exc:
            raise AssertionError(f"PromQL syntax: {exc}: {expr}") from exc
        found: list[tuple[str | None, bool]] = []
        selectors(ast, False, found)
        assert found, expr
        for name, rated in found:
            assert name is not None and family(name) in ALLOWED, (name, expr)
            is_counter = name in COUNTERS or name.endswith(SUFFIXES)
            assert rated == is_counter, f"{name}: counters under rate()/increase() only: {expr}"


@pytest.fixture(scope="module")
def pp() -> Any:
    parser = promql_parser()
    if parser is None:
        missing("promql-parser (deploy/tools/python)")
    return parser


def test_promql_parses_and_counters_are_rated(pp: Any, dashboard: dict[str, Any]) -> None:
    check_promql(pp, exprs(dashboard))


@pytest.mark.parametrize("expr", [
    'sum(rate(trt_worker_results_total{job=~"$job"}[$__rate_interval])',   # unbalanced
    "sum(trt_worker_results_total)",                                        # counter, not rated
    "rate(trt_worker_ready[5m])",                                           # gauge, rated
    "sum(rate(trt_worker_batches_total[5m]))",                              # not exported
    "histogram_quantile(0.5, sum by (le) (trt_worker_hop_seconds_bucket))", # bucket, not rated
])
def test_the_promql_check_catches(pp: Any, expr: str) -> None:
    with pytest.raises(AssertionError):
        check_promql(pp, [expr])
