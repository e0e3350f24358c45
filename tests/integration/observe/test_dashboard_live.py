"""The Grafana dashboard's queries return data from a real run.

tests/deploy/test_dashboard.py checks deploy/grafana/trt-worker-dashboard.json statically: its
PromQL parses and names only the worker's metrics. A query can pass that and still show "No
data" in Grafana: a label the worker does not set, a series that never appears, a variable in
an exact matcher. So here a real Prometheus server scrapes two real `trt-worker run` processes
(one at-least-once, one exactly-once) every second while they answer real jobs (good ones,
corrupt ones, an expired one) through the real broker, and every panel's query, as Grafana
sends it with one worker picked as $instance, must come back with series for each worker.
No Grafana server: only its variables are stood in for.

Prometheus is $PROMETHEUS_BIN if set, else deploy/tools/bin/prometheus (the pinned build of
deploy/tools/install_prometheus.sh, `make dashboard-check`), else one on PATH. Without one the
module skips, unless DASHBOARD_CHECK_REQUIRE_PROMETHEUS=1 (set by `make dashboard-check`): then
it fails.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import test_dashboard as static
from tests.harness.faults import good_job, small_images
from tests.harness.workers import (
    Topics,
    WorkerProcess,
    fresh_topics,
    produce_records,
    read_topic,
    worker_config,
    worker_env,
)
from tests.integration.observe.http_support import get, until
from worker.devkit.local_kafka.config import free_port
from worker.tools.produce import encode_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
LOCAL_PROMETHEUS = REPO / "deploy" / "tools" / "bin" / "prometheus"
REQUIRE_ENV = "DASHBOARD_CHECK_REQUIRE_PROMETHEUS"
JOB = "trt-worker"  # the scrape job, named as in deploy/compose/prometheus.yml
# Both: the transactions panel counts only under exactly-once, and the lag comes from the
# consumer's statistics under at-least-once and from the worker's own commits under exactly-once
# (this check found that lag missing there: worker.observe.vitals).
GUARANTEES = ("at-least-once", "exactly-once")

# (panel, guarantee) that shows no data on this run, and why; every other panel must show data
# for each worker. An entry whose panel shows data fails as stale.
NO_GPU = ("a CPU worker (onnxruntime) never initialises CUDA, and worker.observe.gpu exports "
          "GPU series only where torch has")
EMPTY_HERE = {(title, g): NO_GPU for title in ("GPU memory used", "GPU utilisation")
              for g in GUARANTEES}
# (guarantee, label, value) of series that are NaN by design (0/0 quantiles and means). None
# now: the exactly-once delivery hop was one until it got samples (its transaction's commit).
NAN_BY_DESIGN: set[tuple[str, str, str]] = set()

# Two waves of jobs, each answered and scraped before the next: a labelled series (a DLQ
# reason, a hop's histogram) first appears already counting the first wave, and only the
# second makes its rate, and so every quantile and mean over it, more than 0 or NaN.
WAVES = 2
GOOD_PER_WAVE = 6
SCRAPE_S = 1


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(static.DASHBOARD.read_text())
    return data


def _panel_params() -> list[Any]:
    """One parameter per target of each panel and guarantee, named by the panel's title."""
    out = []
    for p in static.panels(_dashboard()):
        targets = p.get("targets", [])
        for i, t in enumerate(targets):
            name = p["title"] + (f" #{i + 1}" if len(targets) > 1 else "")
            for g in GUARANTEES:
                out.append(pytest.param(p["title"], g, t["expr"], id=f"{name} [{g}]"))
    return out


def _answers(url: str) -> Callable[[], bool]:
    return lambda: get(url)[0] == 200


@dataclass
class Worker:
    """One `trt-worker run` process, its topics and its scrape target."""

    instance: str  # 127.0.0.1:<metrics port>, Prometheus's instance label for it
    topics: Topics
    proc: WorkerProcess


@dataclass
class Live:
    """A Prometheus server scraping the workers (by guarantee) once they answered every job."""

    prometheus: str  # http://127.0.0.1:<port>
    workers: dict[str, Worker]

    def api(self, path: str, **params: str) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        status, body = get(f"{self.prometheus}/api/v1/{path}" + (f"?{query}" if query else ""))
        try:
            out: dict[str, Any] = json.loads(body)
        except ValueError:
            raise AssertionError(f"{path} {params}: HTTP {status}: {body[:300]!r}") from None
        return out

    def query(self, promql: str) -> dict[str, Any]:
        return self.api("query", query=promql)

    def value(self, promql: str) -> float | None:
        """The value of a one-series instant query, None while it has no series."""
        result = self.query(promql)["data"]["result"]
        return float(result[0]["value"][1]) if result else None


def grafana_query(expr: str, instance: str) -> str:
    """``expr`` as Grafana sends it with one ``instance`` picked and every other variable at its
    "All" value. A multi-value variable goes in regex-escaped, inside a PromQL string (so an
    exact matcher on it finds nothing, as in Grafana); then as_promql turns $job into .* and
    $__rate_interval into 1m (Grafana's floor for it, 4 x its default 15 s scrape interval;
    here it spans the whole run)."""
    picked = re.escape(instance).replace("\\", "\\\\")
    return static.as_promql(re.sub(r"\$\{instance\}|\$instance\b", lambda _: picked, expr))


# --- the run ------------------------------------------------------------------------------------


def _wave(n: int) -> tuple[list[tuple[bytes, bytes, None]], int, int]:
    """One wave's records, the results they make and the DLQ records they make."""
    records: list[tuple[bytes, bytes, None]] = [
        (f"w{n}-job-{i}".encode(), good_job(f"w{n}-job-{i}"), None)
        for i in range(GOOD_PER_WAVE)]
    # Answered with status "expired" (trt_worker_expired_total): its deadline is long past.
    records.append((f"w{n}-late".encode(),
                    encode_job(f"w{n}-late", small_images()[0], deadline_ms=1), None))
    # Dead-lettered, for the panels by reason: no msgpack at all (not_msgpack), and a
    # well-formed job whose image is no image (bad_image).
    records.append((f"w{n}-garbage".encode(), b"\xc1 not msgpack", None))
    records.append((f"w{n}-not-an-image".encode(),
                    encode_job(f"w{n}-not-an-image", b"GIF89a and no more" * 8), None))
    return records, GOOD_PER_WAVE + 1, 2


def _answered(bootstrap: str, topics: Topics, results: int, dead: int) -> tuple[int, int]:
    got = read_topic(bootstrap, topics.results, until=lambda m: len(m) >= results, timeout=60)
    dlq = read_topic(bootstrap, topics.dlq, until=lambda m: len(m) >= dead, timeout=60)
    return len(got), len(dlq)


def _scraped(live: Live, instance: str, results: int) -> None:
    """Until Prometheus has scraped ``results`` results from ``instance``, then three scrapes
    more: the rates span the wave, the lag is back at 0, the last transaction is in."""
    selector = f'trt_worker_results_total{{job="{JOB}", instance="{instance}"}}'
    until(lambda: live.value(selector) == results, 30, f"{instance}: {results} results scraped")
    seen = time.time()
    until(lambda: (live.value(f"timestamp({selector})") or 0) > seen + 3 * SCRAPE_S, 30,
           f"{instance}: three scrapes more")


def _send_and_wait(live: Live, bootstrap: str) -> None:
    results = dead = 0
    for n in range(WAVES):
        records, more_results, more_dead = _wave(n)
        results, dead = results + more_results, dead + more_dead
        for w in live.workers.values():
            produce_records(bootstrap, w.topics.jobs, records)
        for w in live.workers.values():
            answered = _answered(bootstrap, w.topics, results, dead)
            assert answered == (results, dead), w.proc.log_tail()
        for w in live.workers.values():
            _scraped(live, w.instance, results)


def _start_worker(bootstrap: str, guarantee: str, port: int, tmp: Path) -> Worker:
    topics = fresh_topics(bootstrap, partitions=2)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": guarantee})
    env = worker_env(cfg, KTW_METRICS__PORT=str(port), KTW_METRICS__HOST="127.0.0.1",
                     KTW_METRICS__STATISTICS_INTERVAL_MS="500", KTW_BATCH__MAX_BATCH_SIZE="4",
                     # Every batch over this budget logs the error batch_over_budget (and does
                     # nothing else): "Errors / s by kind" gets a real series, which a clean
                     # run, logging no warning at all, would not give it.
                     KTW_PROCESSING__MAX_BATCH_MS="1")
    return Worker(f"127.0.0.1:{port}", topics, WorkerProcess(env, tmp / f"{guarantee}.log"))


def _stop_workers(workers: dict[str, Worker]) -> dict[str, int | None]:
    """SIGTERM to all, then each one's exit code (None: killed after 60 s)."""
    for w in workers.values():
        if w.proc.proc.poll() is None:
            w.proc.terminate()
    codes: dict[str, int | None] = {}
    for g, w in workers.items():
        try:
            codes[g] = w.proc.wait(60)
        except subprocess.TimeoutExpired:
            w.proc.kill9()
            codes[g] = None
    return codes


def _stop_prometheus(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _start_prometheus(binary: str, tmp: Path, port: int, instances: list[str]
                      ) -> subprocess.Popen[bytes]:
    # JSON is YAML. scrape_timeout may not exceed the interval.
    (tmp / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": instances}]}],
    }))
    with open(tmp / "prometheus.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The Prometheus server to run, or skip (fail under `make dashboard-check`). Session-
    scoped and asked for before the broker: a skip starts no broker."""
    explicit = os.environ.get("PROMETHEUS_BIN")
    if explicit:
        found = explicit if os.access(explicit, os.X_OK) else None
    elif LOCAL_PROMETHEUS.is_file() and os.access(LOCAL_PROMETHEUS, os.X_OK):
        found = str(LOCAL_PROMETHEUS)
    else:
        found = shutil.which("prometheus")
    if found is None:
        where = f"PROMETHEUS_BIN={explicit}" if explicit else f"{LOCAL_PROMETHEUS} or PATH"
        message = (f"no Prometheus server ({where}): run `make dashboard-check` "
                   "(deploy/tools/install_prometheus.sh builds the pinned one)")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{message} ({REQUIRE_ENV}=1: the check may not be skipped)")
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def live(prometheus_binary: str, kafka_bootstrap: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("dashboard-live")
    workers: dict[str, Worker] = {}
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        # Prometheus first, scraping the ports before the workers listen on them: it sees
        # every counter from its start (the first assignment counts as a rebalance event).
        ports = {g: free_port() for g in GUARANTEES}
        port = free_port()
        prometheus = _start_prometheus(prometheus_binary, tmp, port,
                                       [f"127.0.0.1:{p}" for p in ports.values()])
        live = Live(f"http://127.0.0.1:{port}", workers)
        until(_answers(f"{live.prometheus}/-/ready"), 30, "Prometheus ready")
        for g in GUARANTEES:
            workers[g] = _start_worker(kafka_bootstrap, g, ports[g], tmp)
        for w in workers.values():
            until(_answers(f"http://{w.instance}/readyz"), 90, f"worker {w.instance} ready")
        _send_and_wait(live, kafka_bootstrap)
        yield live
    finally:
        if prometheus is not None:
            _stop_prometheus(prometheus)
        codes = _stop_workers(workers)
    for g, code in codes.items():
        assert code == 0, f"{g} worker exited {code}:\n{workers[g].proc.log_tail()}"


# --- the checks ---------------------------------------------------------------------------------


def test_prometheus_scrapes_each_worker(live: Live) -> None:
    targets = live.api("targets", state="active")["data"]["activeTargets"]
    for w in live.workers.values():
        ours = [t for t in targets if t["labels"]["instance"] == w.instance]
        assert len(ours) == 1, targets
        t = ours[0]
        assert (t["labels"]["job"], t["health"], t["lastError"]) == (JOB, "up", ""), t


@pytest.mark.parametrize("query", static.variable_queries(_dashboard()))
def test_the_variables_list_each_worker(live: Live, query: str) -> None:
    """Grafana's label_values(selector, label) is Prometheus's label values API."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert m, f"not label_values(selector, label): {query}"
    selector, label = static.as_promql(m[1]), m[2]
    body = live.api(f"label/{label}/values", **{"match[]": selector})
    assert body["status"] == "success", body
    want = {JOB} if label == "job" else {w.instance for w in live.workers.values()}
    assert want <= set(body["data"]), (query, body)


@pytest.mark.parametrize(("panel", "guarantee", "expr"), _panel_params())
def test_the_panel_has_data(live: Live, panel: str, guarantee: str, expr: str) -> None:
    promql = grafana_query(expr, live.workers[guarantee].instance)
    body = live.query(promql)
    assert body["status"] == "success", f"{panel}: {promql}: {body}"
    series = body["data"]["result"]
    empty_here = EMPTY_HERE.get((panel, guarantee))
    if empty_here:
        assert not series, f"{panel}: shows data, so EMPTY_HERE ({empty_here}) is stale: {series}"
        return
    assert series, f"{panel} [{guarantee}]: no data: {promql}"
    # NaN (0/0: a quantile or mean over a rate of 0) is drawn as nothing either.
    nan = [s["metric"] for s in series if math.isnan(float(s["value"][1]))
           and not NAN_BY_DESIGN & {(guarantee, k, v) for k, v in s["metric"].items()}]
    assert not nan, f"{panel} [{guarantee}]: NaN, no rate over the run, for {nan}: {promql}"


def test_every_metric_the_workers_export_is_on_the_dashboard(live: Live) -> None:
    """The static test's metric lists are kept by hand; what real workers export is not."""
    names = live.api("label/__name__/values", **{"match[]": f'{{job="{JOB}"}}'})["data"]
    exported = {static.family(n) for n in names if n.startswith("trt_worker_")}
    used = {static.family(n) for e in static.exprs(_dashboard())
            for n in static.NAME.findall(e)}
    assert exported and not exported - used, sorted(exported - used)
