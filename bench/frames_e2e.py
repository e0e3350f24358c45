"""CPU worker under live load: the default worker (`python -m worker run`, ONNX Runtime CPU)
against a local Kafka, fed by an open-loop producer process at fixed offered rates, one frame
class at a time (bench/frames.py's corpus of real photographs).

Per run: fresh topics and group, one worker process; a warm-up of jobs it must answer before
timing starts; then each offered rate in ascending order: the producer process sends a job
every 1/rate s on schedule (it never waits for answers: open loop) for ``--warmup-s`` +
``--steady-s``; latencies count the jobs scheduled in the steady window, from the scheduled
send time (so a producer that falls behind cannot hide queueing) to the result's arrival at
this script's reader (one host clock). The backlog (jobs scheduled minus answered) is sampled
every 0.5 s; a rate is *bounded* when, over the steady window, the backlog grows by no more
than 5% of the rate per second and ends under 2 s worth of jobs. The jobs left are drained
before the next rate; the first unbounded rate ends the run (higher ones cannot be bounded).
The sustained rate of a run is its highest bounded offered rate.

Latencies are HdrHistograms (``hdrhistogram``, microseconds, 3 significant digits), stored
encoded in the record so they pool across runs (decode and add): per run and rate, and pooled
per rate; each window's also per 5 s slice (``latency_by_slice``: where in time a tail sits),
beside what the worker's own histograms saw in the window (``worker_metrics``: collector
pauses, engine time per batch, hops; bench/worker_metrics.py). ``--repeats`` (>= 3 for
medians and spread) repeats the whole run.

``--procs N [--mps]`` runs N worker processes on the GPU (``run --gpus 1 --procs-per-gpu N``,
under a private MPS daemon with ``--mps``), all of them ready before the first drain.

``--code-root DIR`` runs the worker from another checkout (``git archive REV | tar -x -C DIR``,
its commit in ``DIR/COMMIT``) with this bench, broker and corpus: old and new code on the same
frames and load, e.g. alternating in one session.

python bench/frames_e2e.py --frames 1080p --quality 85 --rates 30,40,50 --repeats 3 \
    [--set moderation.jpeg_dct_scaling=true] [--label after] [--code-root .before]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import frames as frame_corpus
from bench import worker_metrics
from bench.common import RESULTS, environment, provenance, write
from bench.cpu_e2e import (
    REPO,
    WORKER_STOP_TIMEOUT_S,
    BenchFailed,
    Reader,
    create_topics,
    kill_worker,
    local_kafka_class,
    log_tail,
    produce_jobs,
    stop_worker,
    worker_env,
)

HIST_MAX_US = 600_000_000  # 10 minutes
SAMPLE_S = 0.5
GROWTH_BOUND = 0.05  # backlog growth per second, as a fraction of the offered rate
END_BOUND_S = 2.0  # backlog left at the end of the steady window, in seconds of jobs
WARMUP_JOBS = 24
SLICE_S = 5.0  # latency summaries per slice of the steady window: where in time a tail sits
SETTLE_S = 5.0  # after several worker processes are ready: their group's rebalance


def code_provenance(root: Path) -> dict[str, Any]:
    """The worker's commit and dirty flag: this checkout's, or what a staged checkout's COMMIT
    and DIRTY stamps say (``bench/device_kafka.sh stage``: a ``git archive``, so clean)."""
    if root.resolve() == REPO.resolve():
        here = provenance()
        return {"code_commit": here["commit"], "code_dirty": here["dirty"]}

    def stamp(name: str) -> str | None:
        path = root / name
        return path.read_text().strip() if path.is_file() else None

    dirty = stamp("DIRTY")
    return {"code_commit": stamp("COMMIT") or "unknown",
            "code_dirty": None if dirty is None else dirty == "1"}


def _histogram() -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, HIST_MAX_US, 3)


def hist_summary(h: Any) -> dict[str, Any]:
    if h.get_total_count() == 0:
        return {"n": 0}
    return {"n": h.get_total_count(),
            **{f"p{q:g}_ms": round(h.get_value_at_percentile(q) / 1e3, 2)
               for q in (50, 90, 99, 99.9)},
            "max_ms": round(h.get_max_value() / 1e3, 2)}


def scheduled_jobs(rate: float, seconds: float) -> int:
    """Jobs in a schedule of ``rate`` jobs/s for ``seconds``, rounded: the backlog drain asks
    for n jobs as n / 1e7 s at 1e7 jobs/s, and truncating 2999.9999999999995 sent one less."""
    return round(rate * seconds)


def producer_main(bootstrap: str, topic: str, frames: list[bytes], rate: float, seconds: float,
                  prefix: str, start_at: float, out: Any, share: tuple[int, int] = (0, 1)
                  ) -> None:
    """Open loop: job i is due at start_at + i / rate (wall clock) and sent then, never later
    because of answers. With ``share`` (k, n) this process sends the jobs i with i % n == k
    (n producer processes split one schedule). Reports (scheduled count, sent count, worst
    send lateness s)."""
    import confluent_kafka as ck
    import msgpack

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
                     "enable.idempotence": True, "queue.buffering.max.kbytes": 1 << 21,
                     "log_level": 3})
    n = scheduled_jobs(rate, seconds)
    mine = range(share[0], n, share[1])
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    late = 0.0
    sent = 0
    for i in mine:
        due = start_at + i / rate
        wait = due - time.time()
        if wait > 0:  # sleep, never spin: the worker needs the cores
            p.poll(0)
            time.sleep(wait)
        late = max(late, time.time() - due)
        job_id = f"{prefix}{i}"
        frame = frames[i % len(frames)]
        value = msgpack.packb({"v": 1, "id": job_id, "image": frame}, use_bin_type=True)
        try:
            p.produce(topic, key=job_id.encode(), value=value, on_delivery=delivered)
            sent += 1
        except BufferError:
            errors.append("local queue full")
        p.poll(0)
    left = p.flush(60)
    out.put({"scheduled": len(mine), "sent": sent, "undelivered": left, "errors": errors[:5],
             "n_errors": len(errors), "max_send_late_s": round(late, 4)})


def _spawn_producers(ctx: Any, q: Any, count: int, bootstrap: str, topic: str,
                     frames: list[bytes], rate: float, seconds: float, prefix: str,
                     start_at: float) -> list[Any]:
    """``count`` producer processes started, splitting one open-loop schedule between them."""
    procs = [ctx.Process(target=producer_main, daemon=True, name=f"producer-{k}",
                         args=(bootstrap, topic, frames, rate, seconds, prefix, start_at, q,
                               (k, count)))
             for k in range(count)]
    for proc in procs:
        proc.start()
    return procs


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    return statistics.linear_regression([t for t, _ in points], [b for _, b in points]).slope


def due_time(key: str, prefix: str, start_at: float, rate: float) -> float:
    """When the job keyed ``<prefix><i>`` of a schedule from ``start_at`` at ``rate`` was due
    (wall clock): job i is due at start_at + i / rate."""
    return start_at + int(key[len(prefix):]) / rate


def one_rate(bootstrap: str, topic: str, reader: Reader, frames: list[bytes], rate: float,
             args: argparse.Namespace, prefix: str, metrics_ports: Sequence[int] = ()
             ) -> dict[str, Any]:
    """One offered rate; ``metrics_ports``: the worker processes' /metrics, read at the steady
    window's start and end (bench/worker_metrics.py)."""
    seconds = args.warmup_s + args.steady_s
    start_at = time.time() + 1.0
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = _spawn_producers(ctx, q, args.producers, bootstrap, topic, frames, rate, seconds,
                             prefix, start_at)
    steady_from, steady_to = start_at + args.warmup_s, start_at + seconds
    n = scheduled_jobs(rate, seconds)
    backlog: list[tuple[float, float]] = []
    at_start: list[worker_metrics.Snapshot | None] | None = None
    at_end: list[worker_metrics.Snapshot | None] = []
    try:
        while time.time() < steady_to:
            time.sleep(SAMPLE_S)
            now = time.time()
            if at_start is None and now >= steady_from:
                at_start = [worker_metrics.scrape(port) for port in metrics_ports]
            due = min(n, max(0, int((now - start_at) * rate) + 1))
            with reader.lock:
                done = sum(1 for k in reader.results if k.startswith(prefix))
            if now >= steady_from:
                backlog.append((now - steady_from, due - done))
        at_end = [worker_metrics.scrape(port) for port in metrics_ports]
        reports = [q.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    report = {"producers": len(reports),
              **{k: sum(r[k] for r in reports) for k in ("scheduled", "sent", "undelivered",
                                                         "n_errors")},
              "errors": [e for r in reports for e in r["errors"]][:5],
              "max_send_late_s": max(r["max_send_late_s"] for r in reports)}
    bounded_growth = _slope(backlog) <= GROWTH_BOUND * rate
    bounded_end = bool(backlog) and backlog[-1][1] <= END_BOUND_S * rate
    # drain: wait for the rest (bounded), so the next rate starts on an empty queue
    _wait_answered(reader, prefix, n, args.drain_s)
    hist = _histogram()
    slices = [_histogram() for _ in range(slice_count(args.steady_s))]
    answered_steady = 0
    with reader.lock:
        results = {k: v for k, v in reader.results.items() if k.startswith(prefix)}
        dlq = {k: v for k, v in reader.dlq.items() if k.startswith(prefix)}
    for key, (arrival, _create) in results.items():
        due_s = due_time(key, prefix, start_at, rate)
        if steady_from <= due_s < steady_to:
            us = max(1, min(HIST_MAX_US, round((arrival - due_s) * 1e6)))
            hist.record_value(us)
            slices[min(len(slices) - 1, int((due_s - steady_from) / SLICE_S))].record_value(us)
        if steady_from <= arrival < steady_to:
            answered_steady += 1
    return {"offered_rate": rate, "schedule_start": start_at, "producer": report,
            "answered": len(results), "dead_lettered": len(dlq), "drained": len(results) >= n,
            "throughput_steady": round(answered_steady / args.steady_s, 2),
            "backlog_growth_per_s": round(_slope(backlog), 3),
            "backlog_end": backlog[-1][1] if backlog else None,
            "backlog_max": max((b for _, b in backlog), default=None),
            "bounded": bounded_growth and bounded_end and not dlq,
            "latency": hist_summary(hist), "latency_hdr": hist.encode().decode(),
            "latency_by_slice": {"slice_s": SLICE_S,
                                 "slices": [hist_summary(h) for h in slices]},
            **_seen_by_workers(at_start or [], at_end)}


def _seen_by_workers(at_start: list[worker_metrics.Snapshot | None],
                     at_end: list[worker_metrics.Snapshot | None]) -> dict[str, Any]:
    """What each worker process's histograms saw in the window: one process's as it is,
    several as ``per_process``."""
    deltas = [worker_metrics.delta(a, b) for a, b in zip(at_start, at_end, strict=False)]
    if not deltas:
        return {}
    return {"worker_metrics": deltas[0] if len(deltas) == 1 else {"per_process": deltas}}


def worker_command(procs: int, mps: bool) -> list[str]:
    """The worker's command line: one process, or ``procs`` on one GPU (under MPS)."""
    cmd = [sys.executable, "-m", "worker", "run"]
    if procs > 1 or mps:
        cmd += ["--gpus", "1", "--procs-per-gpu", str(procs)] + (["--mps"] if mps else [])
    return cmd


def slice_count(steady_s: float) -> int:
    """Slices of ``SLICE_S`` in the steady window (the last takes any remainder)."""
    return max(1, int(steady_s // SLICE_S))


def _wait_ready(ports: list[int], seconds: float, proc: Any, log_path: Path) -> None:
    """Until every worker process answers /readyz with 200 (warm, subscribed), then
    ``SETTLE_S`` for the group's rebalance among them; a process that never does fails the run."""
    deadline = time.monotonic() + seconds
    waiting = list(ports)
    while waiting:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchFailed(f"worker processes on ports {waiting} not ready; log {log_path}:"
                              f"\n{log_tail(log_path)}")
        waiting = [p for p in waiting if not worker_metrics.ready(p)]
        time.sleep(0.5)
    time.sleep(SETTLE_S)


def _wait_answered(reader: Reader, prefix: str, n: int, seconds: float) -> None:
    """Until ``n`` results with keys starting ``prefix`` have arrived, or ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with reader.lock:
            if sum(1 for k in reader.results if k.startswith(prefix)) >= n:
                return
        time.sleep(0.2)


def burst(bootstrap: str, topic: str, reader: Reader, frames: list[bytes],
          args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """A backlog drain, named as such: ``--burst-jobs`` jobs sent as fast as the producer
    processes can, while the worker answers; frames/s = jobs / (last answer - first send)."""
    n = args.burst_jobs
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 1.0
    fast = 1e7  # jobs/s: no sleeps, the producers' own pace
    procs = _spawn_producers(ctx, q, args.producers, bootstrap, topic, frames, fast, n / fast,
                             prefix, start_at)
    _wait_answered(reader, prefix, n, args.drain_s + 60)
    reports = []
    for proc in procs:
        with contextlib.suppress(queue.Empty):  # a producer that died reports nothing
            reports.append(q.get(timeout=30))
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    with reader.lock:
        arrivals = [v[0] for k, v in reader.results.items() if k.startswith(prefix)]
        dlq = {k: v for k, v in reader.dlq.items() if k.startswith(prefix)}
    span = (max(arrivals) - start_at) if arrivals else None
    return {"jobs": n, "scheduled": sum(r["scheduled"] for r in reports),
            "sent": sum(r["sent"] for r in reports),
            "answered": len(arrivals), "dead_lettered": len(dlq),
            "dlq_reasons": sorted(set(dlq.values()))[:5],
            "producer_errors": sum(r["n_errors"] for r in reports),
            "producer_undelivered": sum(r["undelivered"] for r in reports),
            "note": "jobs sent as fast as the producers can: where they are slower than the "
                    "worker this is their rate, not the worker's",
            "frames_per_s": round(len(arrivals) / span, 1) if span else None,
            "span_s": round(span, 2) if span else None}


def _delete_topics(bootstrap: str, names: list[str]) -> None:
    from worker.devkit.local_kafka.admin import delete_topics
    from worker.devkit.local_kafka.errors import LocalKafkaError

    try:
        delete_topics(bootstrap, names)
    except LocalKafkaError as exc:  # disk hygiene only: the run's figures stand
        print(f"  topics not deleted: {exc}", flush=True)


def one_run(bootstrap: str, frames: list[bytes], rates: list[float], args: argparse.Namespace,
            index: int, logs: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    topics = {"jobs": f"frames-e2e-jobs-{tag}", "results": f"frames-e2e-results-{tag}",
              "dlq": f"frames-e2e-dlq-{tag}"}
    create_topics(bootstrap, {topics["jobs"]: args.partitions, topics["results"]: 1,
                              topics["dlq"]: 1})
    reader = Reader(bootstrap, topics["results"], topics["dlq"])
    reader.start()
    if not reader.ready.wait(30) or reader.error:
        reader.halt.set()
        raise BenchFailed(reader.error or "results reader not ready after 30 s")
    env, _dropped = worker_env(bootstrap, topics, f"frames-e2e-{tag}", args.overrides,
                               root=args.code_root)
    from worker.devkit.local_kafka.config import free_port

    # Several processes (--procs) serve /metrics on this port and the ones after it
    # (worker/tools/gpus.py).
    metrics_port = free_port()
    env |= {"KTW_METRICS__PORT": str(metrics_port), "KTW_METRICS__HOST": "127.0.0.1"}
    log_path = logs / f"worker-{index + 1}.log"
    import subprocess

    proc: subprocess.Popen[bytes] | None = None
    steps: list[dict[str, Any]] = []
    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(worker_command(args.procs, args.mps),
                                    cwd=args.code_root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        produce_jobs(bootstrap, topics["jobs"], frames[0], WARMUP_JOBS, "w-")
        deadline = time.monotonic() + args.start_timeout
        while reader.answered() < WARMUP_JOBS:
            if proc.poll() is not None or reader.error or time.monotonic() > deadline:
                raise BenchFailed(f"warm-up not answered ({reader.answered()}/{WARMUP_JOBS}); "
                                  f"{reader.error or ''} log {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.1)
        if args.procs > 1:  # the warm-up may all have gone to the first process up
            _wait_ready([metrics_port + i for i in range(args.procs)], args.start_timeout,
                        proc, log_path)
        drain: dict[str, Any] | None = None
        if args.burst_jobs:
            drain = burst(bootstrap, topics["jobs"], reader, frames, args, "b-")
            print(f"  run {index + 1} backlog drain: {drain}", flush=True)
            if args.auto_rates and drain["frames_per_s"]:
                rates = sorted(round(f * drain["frames_per_s"], -1) for f in args.auto_rates)
        for k, rate in enumerate(rates):
            step = one_rate(bootstrap, topics["jobs"], reader, frames, rate, args, f"r{k}-",
                            [metrics_port + i for i in range(args.procs)])
            step["rate_index"] = k
            steps.append(step)
            lat = step["latency"]
            print(f"  run {index + 1} rate {rate:g}/s: {step['throughput_steady']}/s answered, "
                  f"backlog end {step['backlog_end']} growth {step['backlog_growth_per_s']}/s, "
                  f"p50 {lat.get('p50_ms')} p99 {lat.get('p99_ms')} ms, "
                  f"{'bounded' if step['bounded'] else 'UNBOUNDED'}", flush=True)
            if proc.poll() is not None:
                raise BenchFailed(f"worker exited with {proc.returncode}; log {log_path}:\n"
                                  f"{log_tail(log_path)}")
            if not step["bounded"] or not step["drained"]:
                break
        rc = stop_worker(proc, WORKER_STOP_TIMEOUT_S)
    finally:
        if proc is not None:
            kill_worker(proc)
        reader.halt.set()
        reader.join(15)
        _delete_topics(bootstrap, list(topics.values()))
    bounded = [s["offered_rate"] for s in steps if s["bounded"]]
    return {"run": index + 1, "backlog_drain": drain, "rates": rates, "steps": steps,
            "worker_exit_code": rc,
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            "sustained_rate": max(bounded) if bounded else None, "worker_log": str(log_path)}


def pooled(runs: list[dict[str, Any]], by_index: bool = False) -> dict[str, Any]:
    """Per offered rate (``by_index``: per position in each run's rates, for rates set from
    each run's own drain) the runs' throughputs and their latencies pooled."""
    from hdrh.histogram import HdrHistogram

    out: dict[str, Any] = {}
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for r in runs:
        for s in r["steps"]:
            by_rate.setdefault(s["rate_index"] if by_index else s["offered_rate"],
                               []).append(s)
    for rate, steps in sorted(by_rate.items()):
        h = _histogram()
        for s in steps:
            h.add(HdrHistogram.decode(s["latency_hdr"]))
        tp = [s["throughput_steady"] for s in steps]
        out[f"rate#{rate}" if by_index else f"{rate:g}"] = {
            "offered_rates": [s["offered_rate"] for s in steps],
            "runs": len(steps), "bounded_runs": sum(s["bounded"] for s in steps),
            "throughput_median": statistics.median(tp), "throughput_min": min(tp),
            "throughput_max": max(tp),
            "p99_ms_per_run": [s["latency"].get("p99_ms") for s in steps],
            "latency_pooled": hist_summary(h), "latency_pooled_hdr": h.encode().decode()}
    return out


def summarize(sides: list[str], frames: str, quality: int,
              results: Path = RESULTS) -> dict[str, Any]:
    """One record over earlier runs, per side (a ``--label``): every run's record named,
    sustained rates and drains per run with their medians, latencies pooled per rate index,
    and the provenance the runs share (machine, libraries, broker) with each side's code."""
    out: dict[str, Any] = {}
    shared: dict[str, Any] | None = None
    for side in sides:
        files = sorted(results.glob(f"frames-e2e-{frames}-q{quality}-{side}-2*.json"))
        if not files:
            raise BenchFailed(f"no records for side {side!r} in {results}")
        records = [json.loads(f.read_text()) for f in files]
        runs = [r for d in records for r in d["runs"]]
        sustained = [r["sustained_rate"] for r in runs]
        drains = [r["backlog_drain"]["frames_per_s"] for r in runs]
        per_rate = pooled(runs, by_index=True)
        for v in per_rate.values():
            del v["latency_pooled_hdr"]  # (in the runs' own records)
        for d in records:  # what must match for the sides to compare: not the time or code
            mine = {k: v for k, v in d["provenance"].items() if k not in ("machine",)}
            if shared is None:
                shared = mine
            elif mine != shared:
                raise BenchFailed(f"{side}: its runs' provenance differs from the first "
                                  f"side's: {sorted(set(mine.items()) ^ set(shared.items()))}")
        out[side] = {
            "records": [f.name for f in files],
            "code": sorted({(d["params"].get("code_commit"), d["params"].get("code_dirty"))
                            for d in records}),
            "worker_config_overrides": records[0]["params"]["worker_config_overrides"],
            "broker_config": records[0]["params"].get("broker_config", {}),
            "sustained_per_run": sustained, "sustained_median": statistics.median(sustained),
            "drain_fps_per_run": drains, "drain_fps_median": statistics.median(drains),
            "pooled_by_rate_index": per_rate}
    assert shared is not None
    return {"bench": "frames-e2e-summary", "env": environment(), "provenance": shared,
            "broker": {"kind": "Apache Kafka (KRaft, single node, worker.devkit LocalKafka)",
                       "version": shared.get("broker_version"),
                       "settings": "LocalKafka's defaults plus each side's broker_config"},
            "frames": frames, "quality": quality, "sides": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", default="1080p",
                    choices=[*frame_corpus.CLASSES, "mixed"],
                    help="frame class; mixed: 720p with a 4K still every 30th")
    ap.add_argument("--quality", type=int, default=85, choices=frame_corpus.QUALITIES)
    ap.add_argument("--rates", default="", help="offered rates, jobs/s, comma separated")
    ap.add_argument("--burst-jobs", type=int, default=0,
                    help="before the rates, a backlog drain of this many jobs (0: none)")
    ap.add_argument("--auto-rates", default="",
                    help="offered rates as fractions of the drain's frames/s (needs "
                         "--burst-jobs), e.g. 0.5,0.8,1.0: the first is the half-load point")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--steady-s", type=float, default=30.0)
    ap.add_argument("--drain-s", type=float, default=30.0)
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--retention-s", type=float, default=0,
                    help="broker log retention (0: the broker's default); topics are deleted "
                         "after each run either way")
    ap.add_argument("--producers", type=int, default=1,
                    help="producer processes splitting each rate's schedule")
    ap.add_argument("--procs", type=int, default=1,
                    help="worker processes on the GPU (`run --gpus 1 --procs-per-gpu N`)")
    ap.add_argument("--mps", action="store_true",
                    help="those processes under a private NVIDIA MPS daemon (`run --mps`)")
    ap.add_argument("--machine-note", default="2-core VM shared with ~7 other engineers "
                    "working at the same time: figures are noisy, low-side")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE", help="worker config override (repeatable)")
    ap.add_argument("--label", default="", help="added to the record's file name")
    ap.add_argument("--cache", type=Path, default=frame_corpus.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--code-root", type=Path, default=REPO,
                    help="checkout the worker runs from (default: this one)")
    ap.add_argument("--summarize", default="",
                    help="LABEL,LABEL,...: no run; one summary record over the records of "
                         "these labels for --frames and --quality (in --out)")
    args = ap.parse_args()
    if args.summarize:
        summary = summarize(args.summarize.split(","), args.frames, args.quality)
        summary["note"] = args.machine_note  # how the runs were made, in the summarizer's words
        name = f"frames-e2e-{args.frames}-summary" + (f"-{args.label}" if args.label else "")
        print("wrote", write(name, summary, args.out))
        return 0
    rates = sorted(float(r) for r in args.rates.split(",") if r)
    args.auto_rates = [float(f) for f in args.auto_rates.split(",") if f]
    if not rates and not (args.auto_rates and args.burst_jobs):
        ap.error("give --rates, or --burst-jobs with --auto-rates")
    args.overrides = dict(kv.split("=", 1) for kv in args.overrides)

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds the finally blocks: worker and broker stop

    signal.signal(signal.SIGTERM, on_term)
    manifest = frame_corpus.build(args.cache)
    if args.frames == "mixed":
        frames = frame_corpus.mixed_stream(240, args.quality, cache=args.cache)
    else:
        frames = frame_corpus.load(args.frames, args.quality, args.cache)
    logs = Path(tempfile.mkdtemp(prefix="ktw-frames-e2e-"))
    print(f"{len(frames)} {args.frames} q{args.quality} frames "
          f"{frame_corpus.stream_record(frames)}; rates {rates}; logs {logs}", flush=True)
    started = time.monotonic()
    name = f"frames-e2e-{args.frames}-q{args.quality}" + (f"-{args.label}" if args.label else "")
    path: Path | None = None
    broker: dict[str, str] = {}
    if args.retention_s:
        # HD frames at GPU rates write ~0.5-1 GB/s: without this a run fills the disk. Topics
        # are also deleted after each run.
        broker = {"log.retention.ms": str(int(args.retention_s * 1000)),
                  "log.retention.check.interval.ms": "5000",
                  "log.segment.bytes": str(256 << 20), "log.segment.delete.delay.ms": "1000",
                  "num.network.threads": "8", "num.io.threads": "16"}
    kafka = local_kafka_class()(extra_config=broker) if broker else local_kafka_class()()
    def make_record(broker_version: str | None, failure: str | None) -> dict[str, Any]:
        sustained = [r["sustained_rate"] for r in runs]
        known = [s for s in sustained if s is not None]
        record: dict[str, Any] = {
            "bench": "frames-e2e", "env": environment(),
            "provenance": {**provenance(), "broker": "local Kafka (KRaft, worker.devkit)",
                           "broker_version": broker_version,
                           "machine": args.machine_note},
            "params": {"frames": args.frames, "quality": args.quality, "rates": rates,
                       "repeats": args.repeats, "burst_jobs": args.burst_jobs,
                       "broker_config": broker,
                       "auto_rates": args.auto_rates, "warmup_s": args.warmup_s,
                       "steady_s": args.steady_s, "partitions": args.partitions,
                       "worker_config_overrides": args.overrides, "warmup_jobs": WARMUP_JOBS,
                       "producers": args.producers, "worker_processes": args.procs,
                       "mps": args.mps,
                       "code_root": str(args.code_root), **code_provenance(args.code_root),
                       "worker_command": "python " + " ".join(
                           worker_command(args.procs, args.mps)[1:]) + (
                           " with the overrides above" if args.overrides
                           else " (CPU default: onnxruntime)")},
            "frames": frame_corpus.stream_record(frames), "frames_manifest": manifest,
            "method": {"open_loop": "a producer process sends job i at start + i/rate",
                       "latency": "result arrival at the reader - scheduled send time, jobs "
                                  "scheduled in the steady window; HdrHistogram (us), encoded",
                       "bounded": f"backlog growth <= {GROWTH_BOUND} x rate per s over the "
                                  f"steady window and backlog at its end <= {END_BOUND_S} s of "
                                  "jobs, no dead letters",
                       "sustained_rate": "highest bounded offered rate of a run; rates above "
                                         "the first unbounded one are not tried"},
            "runs": runs,
            "sustained_rate": {"per_run": sustained,
                               "median": statistics.median(known) if known else None,
                               "min": min(known) if known else None,
                               "max": max(known) if known else None},
            "per_rate": pooled(runs, by_index=bool(args.auto_rates and args.burst_jobs)),
            "wall_s": round(time.monotonic() - started, 1),
        }
        record["failure"] = failure  # a run that failed: the runs before it stand
        return record

    runs: list[dict[str, Any]] = []
    failure: str | None = None
    broker_version = getattr(kafka, "version", None)
    try:
        bootstrap = kafka.start(timeout=180)
        try:
            for i in range(args.repeats):
                runs.append(one_run(bootstrap, frames, rates, args, i, logs))
                # After each run, into one file: a call cut off by its limit keeps those done.
                path = path or write(name, {}, args.out)
                path.write_text(json.dumps(make_record(broker_version, None), indent=2,
                                           sort_keys=True))
        finally:
            kafka.stop()
    except BenchFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        failure = str(exc)[-2000:]
    if not runs:
        return 1
    record = make_record(broker_version, failure)
    path = path or write(name, {}, args.out)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    sustained = record["sustained_rate"]["per_run"]
    for rate, s in record["per_rate"].items():
        print(f"rate {rate}/s: bounded {s['bounded_runs']}/{s['runs']}, throughput median "
              f"{s['throughput_median']} ({s['throughput_min']}-{s['throughput_max']}), pooled "
              f"{s['latency_pooled']}")
    print(f"sustained rate per run {sustained}; record {path}")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
