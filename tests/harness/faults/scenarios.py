"""The fault scenarios: kill -9 under load, a broker stall, scaling 1 -> 3 -> 1, a malformed
flood. The suite runs them short, bench/faults/ long; each returns its figures."""

from __future__ import annotations

import collections
import functools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.faults.content import content_audit, job_keys, note_job
from tests.harness.faults.corpus import FLOOD_LIMITS, good_job, malformed_corpus
from tests.harness.faults.fleet import Fleet, exit_reason, log_events, stopped_totals
from tests.harness.faults.timeline import around_resume, formatted, group_reloaded_s
from tests.harness.faults.watch import (
    Audit,
    Feeder,
    HealthWatch,
    OutputWatch,
    TopicWatcher,
    key_counts,
    read_all,
    scan,
)
from tests.harness.workers import (
    committed,
    end_offsets,
    fresh_topics,
    produce_records,
    worker_config,
)
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.config import free_port
from worker.devkit.local_kafka.process import file_size
from worker.kafka.headers import read_headers


def _offsets_behind(bootstrap: str, topics: Any, partitions: int) -> dict[int, int]:
    """Per jobs partition, how far the group's committed offset is behind its end (only the
    partitions that are behind)."""
    done = committed(bootstrap, topics.group, topics.jobs, partitions)
    ends = end_offsets(bootstrap, topics.jobs, partitions)
    return {p: end - max(done.get(p, 0), 0) for p, end in ends.items()
            if done.get(p) != end}


def _commit_figures(bootstrap: str, topics: Any, partitions: int) -> dict[str, Any]:
    time.sleep(0.5)  # a moment for the last commit
    behind = _offsets_behind(bootstrap, topics, partitions)
    return {"offsets_committed_to_end": not behind,
            "offsets_behind": {str(p): n for p, n in sorted(behind.items())}}


def wait_committed_to_end(bootstrap: str, topics: Any, partitions: int, timeout: float,
                          alive: Callable[[], bool]) -> dict[int, int]:
    """Until the group committed every jobs partition to its end (while the workers live);
    returns what is still behind. Every output being there does not mean this: the outputs
    of a worker killed before its commit are there, and its restarted self re-reads that
    tail (repeating those outputs) before it commits past it. A SIGTERM before then would
    leave the tail to the next owner, which is correct but would end the scenario behind."""
    deadline = time.monotonic() + timeout
    behind = _offsets_behind(bootstrap, topics, partitions)
    while behind and time.monotonic() < deadline and alive():
        time.sleep(0.5)
        behind = _offsets_behind(bootstrap, topics, partitions)
    return behind


def _audit_outputs(bootstrap: str, topics: Any, good: set[str], bad: set[str],
                   partitions: int) -> dict[str, Any]:
    """Every good job's result and every bad one's DLQ record, once each, each naming its job
    (:func:`content_audit`), and the offsets committed to the end."""
    results = read_all(bootstrap, topics.results, isolation="read_committed")
    dlq = read_all(bootstrap, topics.dlq, isolation="read_committed")
    raw = scan(bootstrap, topics.results, lambda m: None, isolation="read_uncommitted",
               idle_s=2.0)
    jobs: dict[tuple[int, int], str | None] = {}
    scan(bootstrap, topics.jobs, functools.partial(note_job, jobs), idle_s=2.0)
    res_audit = Audit(good, key_counts(results))
    dlq_audit = Audit(bad, key_counts(dlq))
    return {
        **content_audit(jobs, results, dlq, topics.jobs),
        "results": res_audit.summary(),
        "dlq": dlq_audit.summary(),
        # Records a read_uncommitted reader sees beyond the committed ones: outputs of aborted
        # transactions (exactly-once) -- evidence that kills interrupted open transactions.
        "aborted_result_records": raw - len(results),
        "missing_sample": sorted(res_audit.missing | dlq_audit.missing)[:10],
        "duplicate_sample": sorted(k for k, n in (res_audit.counts + dlq_audit.counts).items()
                                   if n > 1)[:10],
        **_commit_figures(bootstrap, topics, partitions),
    }


def run_kill9(bootstrap: str, log_dir: Path, *, mode: str, kills: int, seed: int = 1,
              instances: int = 3, partitions: int = 6, rate_per_s: float = 10.0,
              max_delay_s: float = 2.5, drain_timeout_s: float = 180.0, bad_every: int = 7,
              batch_delay_ms: int = 100, backlog: int = 500,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Under a steady feed, kill -9 a worker ``kills`` times at a random point after it got its
    partitions, restarting it at once with the same instance id (static membership).

    Every ``bad_every``-th job is malformed and dead-lettered at once, while the good jobs
    before it wait up to ``batch_delay_ms`` in the batcher: outputs finish out of offset order
    all the time, which is what exactly-once must survive a kill in the middle of. A
    ``backlog`` produced up front keeps the workers busy (consumption runs ahead of inference,
    so dead-lettered records overtake the jobs before them). ``env``: more worker settings
    (every scenario takes it)."""
    rng = random.Random(seed)
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="k-",
                    bad_every=bad_every, burst=backlog)
    outputs = OutputWatch(bootstrap, topics)
    names = [f"w{i}" for i in range(instances)]
    delays: list[float] = []
    started = time.monotonic()
    # The crash-loop breaker off. After each death it isolates the partition's next records
    # one by one, so with a kill every few seconds the kills land in isolation: under
    # exactly-once almost never inside the normal, open transactions this drill is about, and
    # under at-least-once three kills in a row can land on one isolated good record, which
    # the breaker then rightly dead-letters as poison. The breaker under kills is
    # tests/integration/faults/test_poison.py's, in both modes.
    with Fleet(cfg, log_dir, **{"KTW_KAFKA__STATIC_MEMBERSHIP": "true",
                                "KTW_BATCH__MAX_BATCH_SIZE": "8",
                                "KTW_BATCH__MAX_DELAY_MS": str(batch_delay_ms),
                                "KTW_PROCESSING__POISON_MAX_ATTEMPTS": "0",
                                **(env or {})}) as fleet:
        fleet.own(feeder, outputs)
        for name in names:
            fleet.start(name)
        for name in names:
            assert fleet.wait_assigned(name, 90), f"{name} never got partitions"
        feeder.start()
        outputs.start()
        for k in range(kills):
            target = names[k % instances]
            assert fleet.wait_assigned(target, 90), f"{target} never got partitions back"
            delay = rng.uniform(0.1, max_delay_s)
            time.sleep(delay)
            delays.append(delay)
            fleet.kill9(target)
            fleet.start(target)
        kill_phase_s = time.monotonic() - started
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        drained = outputs.wait_for(good, bad, drain_timeout_s, fleet.all_alive)
        drain_s = time.monotonic() - started - kill_phase_s
        outputs.stop()
        at_drain = _offsets_behind(bootstrap, topics, partitions)
        # The last one restarted may still be starting: a SIGTERM before it installed its
        # handler ends it by the signal (exit -15), and before it consumed, it leaves its
        # predecessor's uncommitted tail behind.
        for name in names:
            assert fleet.wait_assigned(name, 90), f"{name} never got partitions back"
        t_catch_up = time.monotonic()
        behind = wait_committed_to_end(bootstrap, topics, partitions, drain_timeout_s,
                                       fleet.all_alive)
        catch_up_s = time.monotonic() - t_catch_up
        codes = [fleet.terminate(name) for name in names]
    figures: dict[str, Any] = {
        "mode": mode, "kills": kills, "instances": instances, "partitions": partitions,
        "rate_per_s": rate_per_s, "fed_per_s": feeder.fed_per_s(), "seed": seed,
        "bad_every": bad_every,
        "batch_delay_ms": batch_delay_ms, "backlog": backlog, "jobs_good": len(good),
        "jobs_bad": len(bad),
        "kill_delay_s": {"min": round(min(delays), 2), "max": round(max(delays), 2)},
        "kill_phase_s": round(kill_phase_s, 1), "drain_s": round(drain_s, 1),
        "drained": drained, "final_exit_codes": codes,
        "commit_catch_up_s": round(catch_up_s, 1),
        "behind_at_drain": {str(p): n for p, n in sorted(at_drain.items())},
        "behind_before_stop": {str(p): n for p, n in sorted(behind.items())},
    }
    figures.update(_audit_outputs(bootstrap, topics, good, bad, partitions))
    return figures


def stall_after(broker: Any, watcher: TopicWatcher, *, results: int, stall_s: float,
                timeout: float = 60.0, failed: Callable[[], object] = lambda: None
                ) -> tuple[float, float]:
    """Once ``results`` results are seen (steady processing), freeze the broker for ``stall_s``
    and resume it; returns when the pause began and ended (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while len(watcher.seen()) < results:
        assert time.monotonic() < deadline and not failed(), (
            failed() or "no steady processing before the stall")
        time.sleep(0.1)
    t_pause = time.monotonic()
    broker.pause()
    try:
        time.sleep(stall_s)
    finally:
        broker.resume()
    return t_pause, time.monotonic()


def run_broker_stall(broker: LocalKafka, log_dir: Path, *, mode: str, stall_s: float = 30.0,
                     rate_per_s: float = 10.0, partitions: int = 3, after_s: float = 10.0,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """Freeze the broker (SIGSTOP) for ``stall_s`` under a steady feed, then resume it.

    Recovery time: from resume() until a result is visible (read_committed) for a job produced
    after the stall began; such a job can only be answered once the worker consumed, processed,
    produced and (exactly-once) committed again after the resume.
    """
    bootstrap = broker.bootstrap_servers
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="st-", bad_every=20)
    outputs = OutputWatch(bootstrap, topics)
    watcher = outputs.results
    port = free_port()
    health = HealthWatch(port)
    broker_log_from = file_size(broker.log_path)
    with Fleet(cfg, log_dir, **{"KTW_BATCH__MAX_BATCH_SIZE": "8", "KTW_METRICS__PORT": str(port),
                                "KTW_METRICS__HOST": "127.0.0.1", **(env or {})}) as fleet:
        fleet.own(feeder, outputs, health)
        proc = fleet.start("s0")
        health.start()
        assert fleet.wait_assigned("s0", 90), "worker never got partitions"
        feeder.start()
        outputs.start()
        t_feed = time.monotonic()
        t_pause, t_resume = stall_after(broker, watcher, results=30, stall_s=stall_s)
        resume_wall = time.time() - (time.monotonic() - t_resume)
        recovery_s: float | None = None
        while time.monotonic() < t_resume + 60:
            fresh = [watcher.first_seen[k] for k in list(watcher.first_seen)
                     if feeder.sent_at.get(k, 0.0) >= t_pause]
            if fresh:
                recovery_s = min(fresh) - t_resume
                break
            time.sleep(0.05)
        time.sleep(max(0.0, t_resume + after_s - time.monotonic()))
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        backlog = {k for k in good if feeder.sent_at[k] < t_resume}
        t_drain = time.monotonic()
        drained = outputs.wait_for(good, bad, 150, fleet.all_alive)
        last_backlog = max(watcher.first_seen.get(k, float("inf")) for k in backlog)
        backlog_s = None if last_backlog == float("inf") else last_backlog - t_resume
        outputs.stop()
        survived = proc.proc.poll() is None
        tail = None
        if not drained:  # keep what the worker was doing for the failure message
            proc.dump_stacks()
            tail = proc.log_tail()
        t_stop = time.monotonic()
        code = fleet.terminate("s0")
        log_text = proc.log_text()
        events = log_events(log_text)
        timeline = around_resume(log_text, broker.log_path, cfg.kafka.group_id, resume_wall,
                                 broker_log_from=broker_log_from)
        phases = {"steady": t_pause - t_feed, "stall": t_resume - t_pause,
                  "feed_after": t_drain - t_resume, "drain_wait": t_stop - t_drain,
                  "terminate": time.monotonic() - t_stop}
    figures: dict[str, Any] = {
        "mode": mode, "stall_s": stall_s, "rate_per_s": rate_per_s,
        "fed_per_s": feeder.fed_per_s(), "partitions": partitions,
        "jobs_good": len(good), "jobs_bad": len(bad),
        "jobs_sent_during_stall": sum(1 for k in good if t_pause <= feeder.sent_at[k] < t_resume),
        "recovery_s": None if recovery_s is None else round(recovery_s, 2),
        "backlog_drained_s": None if backlog_s is None else round(backlog_s, 2),
        "drained": drained, "worker_survived": survived, "exit_code": code,
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "health": health.figures(t_pause, t_resume),
        "worker_events": {k: events[k] for k in ("partitions_lost", "partitions_revoked",
                                                 "transaction_abort", "rewound", "txn_retry",
                                                 "producer_reset", "commit_failed",
                                                 "consumer_error", "worker_failed",
                                                 "kafka_unavailable")},
        # Seconds from the resume: the worker's way back and the broker's own recovery.
        "timeline": formatted(timeline),
        "group_reloaded_s": group_reloaded_s(timeline),
    }
    if tail is not None or code != 0:
        figures["worker_log_tail"] = tail or proc.log_tail()
        figures["exit_reason"] = exit_reason(log_text)
    figures.update(_audit_outputs(bootstrap, topics, good, bad, partitions))
    return figures


def run_scaling(bootstrap: str, log_dir: Path, *, mode: str, rate_per_s: float = 10.0,
                partitions: int = 6, phase_s: float = 15.0, backlog: int = 300,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """1 -> 3 -> 1 workers (dynamic membership, cooperative-sticky) under a steady feed on top
    of a ``backlog`` (the lag an autoscaler reacts to); the two extra workers leave with
    SIGTERM (revoke, commit, leave group). Revocations land while jobs are queued and in
    flight."""
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="sc-", bad_every=7,
                    burst=backlog)
    outputs = OutputWatch(bootstrap, topics)
    watcher = outputs.results
    marks: dict[str, float] = {}
    with Fleet(cfg, log_dir, **{"KTW_BATCH__MAX_BATCH_SIZE": "8", **(env or {})}) as fleet:
        fleet.own(feeder, outputs)
        t0 = time.monotonic()
        fleet.start("a0")
        assert fleet.wait_assigned("a0", 90)
        feeder.start()
        outputs.start()
        deadline = time.monotonic() + 60
        while len(watcher.seen()) < 30:
            assert time.monotonic() < deadline, "no processing with one worker"
            time.sleep(0.2)
        marks["scale_out"] = time.monotonic() - t0
        fleet.start("a1")
        fleet.start("a2")
        assert fleet.wait_assigned("a1", 90) and fleet.wait_assigned("a2", 90)
        time.sleep(phase_s)
        marks["scale_in"] = time.monotonic() - t0
        codes = {"a1": fleet.terminate("a1"), "a2": fleet.terminate("a2")}
        time.sleep(phase_s / 2)
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        drained = outputs.wait_for(good, bad, 120, fleet.all_alive)
        marks["drained"] = time.monotonic() - t0
        outputs.stop()
        behind = wait_committed_to_end(bootstrap, topics, partitions, 60, fleet.all_alive)
        marks["committed"] = time.monotonic() - t0
        codes["a0"] = fleet.terminate("a0")
        per_worker = {name: stopped_totals(p.log_text()) for name, p in fleet.procs.items()}
        revokes = {name: log_events(p.log_text())["partitions_revoked"]
                   for name, p in fleet.procs.items()}
    figures: dict[str, Any] = {
        "mode": mode, "rate_per_s": rate_per_s, "fed_per_s": feeder.fed_per_s(),
        "partitions": partitions, "phase_s": phase_s,
        "backlog": backlog, "jobs_good": len(good), "jobs_bad": len(bad), "drained": drained,
        "exit_codes": codes,
        "marks_s": {k: round(v, 1) for k, v in marks.items()},
        "results_per_worker": {n: t.get("results", 0) for n, t in per_worker.items()},
        "aborts_per_worker": {n: t.get("txn_aborts", 0) for n, t in per_worker.items()},
        "revokes_per_worker": revokes,
        "behind_before_stop": {str(p): n for p, n in sorted(behind.items())},
    }
    figures.update(_audit_outputs(bootstrap, topics, good, bad, partitions))
    return figures


def run_flood(bootstrap: str, log_dir: Path, *, mode: str, n_bad: int = 10_000,
              n_good: int = 300, partitions: int = 3, seed: int = 6,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """``n_bad`` malformed jobs (every corpus class) mixed with ``n_good`` good ones, produced
    up front, then one worker process drains them all."""
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode}, limits=FLOOD_LIMITS)
    corpus = malformed_corpus(n_bad, seed)
    by_key = {b.key: b for b in corpus}
    good = [f"good-{i:05d}" for i in range(n_good)]
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = []
    every = max(1, len(corpus) // max(1, n_good))
    gi = 0
    for i, b in enumerate(corpus):
        if i % every == 0 and gi < n_good:
            records.append((good[gi].encode(), good_job(good[gi]), None))
            gi += 1
        records.append((b.key.encode(), b.value, [("origin", b"flood")]))
    records.extend((k.encode(), good_job(k), None) for k in good[gi:])
    produce_records(bootstrap, topics.jobs, records)
    limits = {f"KTW_LIMITS__{k.upper()}": str(v) for k, v in FLOOD_LIMITS.items()}
    limits.update(env or {})
    with Fleet(cfg, log_dir, KTW_BATCH__MAX_BATCH_SIZE="16", **limits) as fleet:
        t0 = time.monotonic()
        proc = fleet.start("f0")
        outputs = OutputWatch(bootstrap, topics)
        fleet.own(outputs)
        outputs.start()
        drained = outputs.wait_for(set(good), set(by_key), 600, fleet.all_alive)
        elapsed = time.monotonic() - t0
        outputs.stop()
        survived = proc.proc.poll() is None
        code = fleet.terminate("f0")
        events = log_events(proc.log_text())
        error_lines = proc.log_text().count('"level": "error"')
    dlq = read_all(bootstrap, topics.dlq)
    results = read_all(bootstrap, topics.results)
    jobs = job_keys(read_all(bootstrap, topics.jobs, idle_s=2.0))
    wrong_reason: collections.Counter[str] = collections.Counter()
    altered = 0
    for m in dlq:
        b = by_key.get(m.key().decode())
        if b is None:
            continue
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in (read_headers(m)[0] or [])}
        if h.get("ktw.dlq.error.reason") != b.reason or not h.get("ktw.dlq.error.message"):
            wrong_reason[f"{b.klass}:{h.get('ktw.dlq.error.reason')}"] += 1
        if m.value() != b.value or h.get("origin") != "flood":
            altered += 1
    from worker.wire.moderation_codec import decode_result

    not_ok = sum(1 for m in results if decode_result(m.value())["status"] != "ok")
    figures: dict[str, Any] = {
        "mode": mode, "bad_jobs": len(corpus), "good_jobs": len(good),
        "classes": dict(collections.Counter(b.klass for b in corpus)),
        "drained": drained, "elapsed_s": round(elapsed, 1),
        "worker_survived": survived, "exit_code": code,
        "worker_error_lines": error_lines,
        "dead_lettered_logged": events["job_dead_lettered"],
        "dlq": Audit(set(by_key), key_counts(dlq)).summary(),
        "results": Audit(set(good), key_counts(results)).summary(),
        "dlq_wrong_reason": dict(wrong_reason), "dlq_altered": altered,
        "results_not_ok": not_ok,
        **content_audit(jobs, results, dlq, topics.jobs),
    }
    figures.update(_commit_figures(bootstrap, topics, partitions))
    return figures
