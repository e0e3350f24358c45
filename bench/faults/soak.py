"""Soak: steady load for a long time (default an hour), sampling the worker's RSS and open file
descriptors; growth must stay under 5%.

    python -m bench.faults.soak [--minutes 60] [--rate 20] [--mode at-least-once]
    python -m bench.faults.soak --minutes 10 --stuck-dlq --uncommitted-limit 1000

``--stuck-dlq``: the DLQ topic is deleted once the worker is assigned and created again at the
end, so every bad job (one in 50) is a dead letter that cannot go out while the good ones
around it are answered: the stuck-output case. The worker's own gauges (pending records, held
bytes, held partitions, from its /metrics) are sampled with RSS; the run holds when memory and
the records consumed past the committed positions stay flat once the partitions are held at
``--uncommitted-limit``, and
every job is answered after the DLQ is back.

Growth = (median of the last window - median of the first window after warm-up) / first; the
windows are --window-s long (default: a tenth of the run after warm-up, at least 60 s). Also
reported: the least-squares RSS slope after warm-up (MB/hour), end-to-end latency per window,
and whether every job was answered.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.faults._run import broker, finish, log_dir
from tests.harness.faults import Audit, Feeder, Fleet, TopicWatcher, key_counts, read_all
from tests.harness.workers import fresh_topics, worker_config
from worker.devkit.local_kafka.admin import create_topics, delete_topics
from worker.devkit.local_kafka.config import free_port

GROWTH_BOUND_PCT = 5.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


GAUGES = ("pending_records", "uncommitted_records", "held_bytes", "held_partitions",
          "outputs_blocked")


def _gauges(port: int) -> dict[str, float | None]:
    """The worker's own gauges from its /metrics (None where it did not answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return dict.fromkeys(GAUGES)
    out: dict[str, float | None] = dict.fromkeys(GAUGES)
    for line in text.splitlines():
        for g in GAUGES:
            if line.startswith(f"trt_worker_{g} "):
                out[g] = float(line.split()[1])
    return out


def _slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in points) / den * 3600


def _median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=20.0, help="jobs per second")
    p.add_argument("--mode", default="at-least-once",
                   choices=["at-least-once", "exactly-once"])
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=None,
                   help="excluded from the growth figure (default: min(120, 20%% of the run))")
    p.add_argument("--window-s", type=float, default=None)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--stuck-dlq", action="store_true")
    p.add_argument("--uncommitted-limit", type=int, default=None,
                   help="batch.max_uncommitted_per_partition (default: the worker's)")
    a = p.parse_args()
    total_s = a.minutes * 60
    warmup = a.warmup_s if a.warmup_s is not None else min(120.0, 0.2 * total_s)
    window = a.window_s if a.window_s is not None else max(60.0, 0.1 * (total_s - warmup))
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    with broker() as (bootstrap, _):
        topics = fresh_topics(bootstrap, a.partitions)
        cfg = worker_config(bootstrap, topics, processing={"guarantee": a.mode})
        feeder = Feeder(bootstrap, topics.jobs, rate_per_s=a.rate, prefix="soak-", bad_every=50)
        watcher = TopicWatcher(bootstrap, topics.results)
        env = {"KTW_BATCH__MAX_BATCH_SIZE": "16"}
        port = free_port()
        env |= {"KTW_METRICS__PORT": str(port), "KTW_METRICS__HOST": "127.0.0.1"}
        if a.uncommitted_limit is not None:
            env["KTW_BATCH__MAX_UNCOMMITTED_PER_PARTITION"] = str(a.uncommitted_limit)
        with Fleet(cfg, log_dir("soak"), **env) as fleet:
            proc = fleet.start("soak0")
            assert fleet.wait_assigned("soak0", 120), proc.log_text()[-2000:]
            pid = proc.proc.pid
            if a.stuck_dlq:
                delete_topics(bootstrap, [topics.dlq])
            feeder.start()
            watcher.start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < total_s and proc.proc.poll() is None:
                t = time.monotonic() - t0
                seen = len(watcher.seen())
                samples.append({"t": round(t, 1), "rss_mb": round(_rss_mb(pid), 1),
                                "fds": _fds(pid), "threads": _threads(pid),
                                "sent": len(feeder.good), "answered": seen,
                                **_gauges(port)})
                print(f"t={t:7.0f}s rss={samples[-1]['rss_mb']:.1f}MB fds={samples[-1]['fds']} "
                      f"threads={samples[-1]['threads']} answered={seen}/{len(feeder.good)}",
                      flush=True)
                time.sleep(a.sample_s)
            survived = proc.proc.poll() is None
            feeder.stop()
            if a.stuck_dlq:  # back: the held dead letters go out, the partitions move on
                create_topics(bootstrap, [topics.dlq], partitions=1)
            good = set(feeder.good)
            drained = watcher.wait_for(good, 300)
            latency = {k: watcher.first_seen[k] - feeder.sent_at[k]
                       for k in good if k in watcher.first_seen}
            watcher.stop()
            code = fleet.terminate("soak0") if survived else proc.proc.returncode
        audit = Audit(good, key_counts(read_all(bootstrap, topics.results)))

    def window_of(lo: float, hi: float, key: str) -> list[float]:
        return [s[key] for s in samples if lo <= s["t"] < hi and s.get(key) is not None]

    end = samples[-1]["t"] if samples else 0.0
    first_rss = window_of(warmup, warmup + window, "rss_mb")
    last_rss = window_of(end - window, end + 1, "rss_mb")
    first_fds = window_of(warmup, warmup + window, "fds")
    last_fds = window_of(end - window, end + 1, "fds")
    rss0, rss1 = statistics.median(first_rss), statistics.median(last_rss)
    fd0, fd1 = statistics.median(first_fds), statistics.median(last_fds)
    rss_growth = (rss1 - rss0) / rss0 * 100
    fd_growth = (fd1 - fd0) / fd0 * 100
    slope = _slope_per_hour([(s["t"], s["rss_mb"]) for s in samples if s["t"] >= warmup])
    lat_windows = {}
    for name, lo, hi in (("first", warmup, warmup + window), ("last", end - window, end + 1)):
        lats = sorted(latency[k] for k in latency
                      if lo <= feeder.sent_at[k] - t0 < hi)
        if lats:
            lat_windows[name] = {"median_ms": round(statistics.median(lats) * 1e3, 1),
                                 "p99_ms": round(lats[int(0.99 * (len(lats) - 1))] * 1e3, 1)}
    run = {
        "mode": a.mode, "minutes": a.minutes, "rate_per_s": a.rate, "warmup_s": warmup,
        "window_s": window, "samples": len(samples), "worker_survived": survived,
        "exit_code": code, "drained": drained, "results": audit.summary(),
        "rss_mb": {"first_window_median": rss0, "last_window_median": rss1,
                   "max": max(s["rss_mb"] for s in samples), "growth_pct": round(rss_growth, 2),
                   "slope_mb_per_hour": round(slope, 2)},
        "fds": {"first_window_median": fd0, "last_window_median": fd1,
                "max": max(s["fds"] for s in samples), "growth_pct": round(fd_growth, 2)},
        "threads": {"first": samples[0]["threads"], "last": samples[-1]["threads"]},
        "stuck_dlq": a.stuck_dlq, "uncommitted_limit": a.uncommitted_limit,
        "gauges": {g: {"first_window_median": _median_or_none(window_of(
                           warmup, warmup + window, g)),
                       "last_window_median": _median_or_none(window_of(end - window, end + 1, g)),
                       "max": max((s[g] for s in samples if s.get(g) is not None), default=None)}
                   for g in GAUGES},
        "latency": lat_windows,
        "series": samples[:: max(1, len(samples) // 200)],
    }
    run["ok"] = (survived and code == 0 and drained and audit.missing == set()
                 and rss_growth < GROWTH_BOUND_PCT and fd_growth < GROWTH_BOUND_PCT)
    if a.stuck_dlq:  # held: what waits stops growing once the partitions are paused
        pend = run["gauges"]["uncommitted_records"]
        run["pending_flat"] = (pend["first_window_median"] is not None
                               and pend["last_window_median"] is not None
                               and pend["last_window_median"] <= pend["first_window_median"]
                               * (1 + GROWTH_BOUND_PCT / 100) + 1)
        run["ok"] = run["ok"] and run["pending_flat"]
    print(f"RSS {rss0:.1f} -> {rss1:.1f} MB ({rss_growth:+.2f}%, slope {slope:+.1f} MB/h), "
          f"fds {fd0:.0f} -> {fd1:.0f} ({fd_growth:+.2f}%), latency {lat_windows}, "
          f"results {audit.summary()}")
    finish("faults-soak", vars(a), [run], started, bool(run["ok"]))


if __name__ == "__main__":
    main()
