"""Cluster-level fault drills on a 3-node LocalKafkaCluster, after Kafka's own transactions
system test: under a steady feed, hard-kill and restart the node that leads the results
partition, the group's coordinator or the worker's transaction coordinator, or cut the results
leader off (SIGSTOP for a while, then SIGCONT). The results partition is placed on a node that
coordinates neither the group nor the transactions, so each fault hits one role (plus, with
three jobs partitions on three nodes, the leadership of some jobs partition). Then audit
against the jobs topic itself:

- every result belongs to its job: its ``id`` is the record key and its ``source`` the job's
  own topic, partition and offset (a result copied onto the wrong job is caught);
- exactly-once: per jobs partition, the source offsets of the results, in the order a
  read_committed reader sees them, are the good jobs' offsets of that partition, each once,
  ascending; every bad job has one DLQ record naming its partition and offset;
- at-least-once: no job without a result (repeats allowed).

Recovery time: from the fault to the first result (read_committed) of a job produced after the
fault, overall and per jobs partition (the slowest partition says when the whole group was
served again). The suite runs one short drill (tests/integration/faults/test_cluster_faults.py),
bench/faults/cluster.py every fault kind, longer.
"""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as ck

from tests.harness.faults import Feeder, Fleet, OutputWatch, exit_reason, log_events, read_all
from tests.harness.faults.scenarios import wait_committed_to_end
from tests.harness.workers import Topics, worker_config
from worker.devkit.local_kafka import LocalKafkaCluster, LocalKafkaError
from worker.kafka.headers import read_headers
from worker.wire.moderation_codec import decode_result

FAULTS = ("leader", "group_coordinator", "transaction_coordinator", "cut_off")
KILLS = ("leader", "group_coordinator", "transaction_coordinator")
EVENTS = ("partitions_lost", "partitions_revoked", "transaction_abort", "rewound", "txn_retry",
          "producer_reset", "commit_failed", "consumer_error", "worker_failed")


def cluster_topics(cluster: LocalKafkaCluster, partitions: int = 3,
                   tag: str | None = None, results_leader: int | None = None) -> Topics:
    """Fresh jobs (``partitions``), results and DLQ (one partition each) topics, replicated on
    the cluster's default (3 nodes: RF 3, min ISR 2), and a fresh group name; the results and
    DLQ partitions led by ``results_leader`` when given."""
    t = _names(tag)
    cluster.create_topics([t.jobs], partitions=partitions)
    cluster.create_topics([t.results, t.dlq], partitions=1, leader=results_leader)
    return t


def _names(tag: str | None = None) -> Topics:
    tag = tag or uuid.uuid4().hex[:8]
    return Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")


def coordinators(cluster: LocalKafkaCluster, group: str, transactional_ids: list[str],
                 timeout: float = 60.0) -> tuple[int, list[int]]:
    """(group coordinator, transaction coordinator of each id), known before the group or the
    ids were ever used: the first use of either creates its internal topic, which takes a
    moment to get leaders."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group_node = cluster.group_coordinator(group)
            if transactional_ids:
                try:
                    cluster.transaction_coordinator(transactional_ids[0])
                except LocalKafkaError:  # no __transaction_state yet: a producer creates it
                    warm = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                        "transactional.id": f"warm-{uuid.uuid4().hex[:8]}"})
                    warm.init_transactions(max(1.0, deadline - time.monotonic()))
            return group_node, [cluster.transaction_coordinator(t) for t in transactional_ids]
        except (LocalKafkaError, ck.KafkaException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def node_roles(cluster: LocalKafkaCluster, topics: Topics, partitions: int,
               transactional_ids: list[str]) -> dict[int, list[str]]:
    """What each node does for this drill right now: leaderships, coordinators."""
    roles: dict[int, list[str]] = collections.defaultdict(list)
    roles[cluster.leader(topics.results, 0)].append("results leader")
    roles[cluster.leader(topics.dlq, 0)].append("dlq leader")
    for p in range(partitions):
        roles[cluster.leader(topics.jobs, p)].append(f"jobs[{p}] leader")
    roles[cluster.group_coordinator(topics.group)].append("group coordinator")
    for txid in transactional_ids:
        roles[cluster.transaction_coordinator(txid)].append(f"transaction coordinator of {txid}")
    return dict(roles)


def _target(cluster: LocalKafkaCluster, fault: str, topics: Topics,
            transactional_ids: list[str]) -> int:
    if fault in ("leader", "cut_off"):
        # Every output goes through this one partition: its leader is the node whose loss
        # stops the whole worker, not one partition of its input.
        return cluster.leader(topics.results, 0)
    if fault == "group_coordinator":
        return cluster.group_coordinator(topics.group)
    if fault == "transaction_coordinator":
        if not transactional_ids:
            raise ValueError("the transaction coordinator fault needs exactly-once")
        return cluster.transaction_coordinator(transactional_ids[0])
    raise ValueError(f"unknown fault {fault!r} (known: {FAULTS})")


def audit_outputs(bootstrap: str, topics: Topics, good: set[str], bad: set[str]
                  ) -> dict[str, Any]:
    """Results and DLQ records against the jobs topic (see the module's docstring)."""
    jobs = read_all(bootstrap, topics.jobs)
    where: dict[str, tuple[int, int]] = {}
    for m in jobs:
        job_key = m.key()
        if job_key is not None:
            where.setdefault(job_key.decode(), (m.partition() or 0, m.offset() or 0))
    results = read_all(bootstrap, topics.results)
    dlq = read_all(bootstrap, topics.dlq)
    raw = read_all(bootstrap, topics.results, isolation="read_uncommitted", idle_s=2.0)
    wrong: list[str] = []
    seen: dict[int, list[int]] = collections.defaultdict(list)
    counts: collections.Counter[str] = collections.Counter()
    for m in results:
        key = (m.key() or b"").decode()
        counts[key] += 1
        r = decode_result(m.value() or b"")
        src = r.get("source") or {}
        at = where.get(key)
        if (r.get("id") != key or at is None or src.get("topic") != topics.jobs
                or (src.get("partition"), src.get("offset")) != at):
            wrong.append(f"{key}: id {r.get('id')!r} source {src} job at {at}")
        else:
            seen[at[0]].append(at[1])
    expected: dict[int, list[int]] = collections.defaultdict(list)
    for key in good:
        if key in where:
            expected[where[key][0]].append(where[key][1])
    not_in_order = {str(p): len(seen.get(p, [])) for p in sorted(set(expected) | set(seen))
                    if seen.get(p, []) != sorted(expected.get(p, []))}
    dlq_counts: collections.Counter[str] = collections.Counter()
    dlq_wrong: list[str] = []
    for m in dlq:
        key = (m.key() or b"").decode()
        dlq_counts[key] += 1
        h = dict(read_headers(m)[0] or [])
        at = where.get(key)
        named = (h.get("ktw.dlq.source.partition"), h.get("ktw.dlq.source.offset"))
        if at is None or named != (str(at[0]).encode(), str(at[1]).encode()):
            dlq_wrong.append(f"{key}: names {named}, job at {at}")
    answered = set(counts)
    return {
        "jobs_in_topic": len(where), "jobs_not_in_topic": len((good | bad) - set(where)),
        "results": {"expected": len(good), "answered": len(answered & good),
                    "missing": len(good - answered),
                    "duplicates": sum(n - 1 for n in counts.values() if n > 1),
                    "unexpected": len(answered - good)},
        "dlq": {"expected": len(bad), "answered": len(set(dlq_counts) & bad),
                "missing": len(bad - set(dlq_counts)),
                "duplicates": sum(n - 1 for n in dlq_counts.values() if n > 1),
                "unexpected": len(set(dlq_counts) - bad)},
        "results_not_their_job": len(wrong), "not_their_job_sample": wrong[:5],
        "dlq_not_their_job": len(dlq_wrong), "dlq_not_their_job_sample": dlq_wrong[:5],
        # Partitions whose results are not exactly the good jobs' offsets once each in
        # ascending order (value: how many results that partition had).
        "partitions_not_exactly_in_order": not_in_order,
        "aborted_result_records": len(raw) - len(results),
        "missing_sample": sorted((good - answered) | (bad - set(dlq_counts)))[:10],
        "_where": where,
    }


def _recovery(t_fault: float, sent_at: dict[str, float], first_seen: dict[str, float],
              where: dict[str, tuple[int, int]]) -> tuple[float | None, dict[str, float | None]]:
    """(first result of a job sent after the fault, the same per jobs partition), seconds
    after the fault."""
    per: dict[int, float] = {}
    for key, sent in sent_at.items():
        if sent < t_fault or key not in first_seen or key not in where:
            continue
        p = where[key][0]
        per[p] = min(per.get(p, float("inf")), first_seen[key] - t_fault)
    parts = sorted({p for p, _ in where.values()})
    by_partition = {str(p): (round(per[p], 2) if p in per else None) for p in parts}
    return (round(min(per.values()), 2) if per else None), by_partition


def run_cluster_fault(cluster: LocalKafkaCluster, log_dir: Path, *, fault: str, mode: str,
                      down_s: float = 10.0, rate_per_s: float = 10.0, partitions: int = 3,
                      instances: int = 1, steady_results: int = 30, after_s: float = 10.0,
                      recovery_timeout_s: float = 120.0, drain_timeout_s: float = 180.0,
                      bad_every: int = 20, static_membership: bool = True,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fault under a steady feed: ``fault`` in FAULTS; a killed node restarts after
    ``down_s``, a cut-off one resumes after ``down_s``. Returns the figures and the audit."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r} (known: {FAULTS})")
    cluster.wait_in_sync(180)
    bootstrap = cluster.bootstrap_servers
    names = [f"c{i}" for i in range(instances)]
    planned = _names()
    prefix = worker_config(bootstrap, planned).kafka.transactional_id_prefix
    txids = ([f"{prefix}.{planned.group}.{n}" for n in names]
             if mode == "exactly-once" else [])
    # The results partition is led by a node that coordinates neither the group nor the first
    # worker's transactions, so each fault hits one role (and some jobs partition leaderships:
    # three partitions over three nodes).
    group_node, txn_nodes = coordinators(cluster, planned.group, txids)
    busy = {group_node, *txn_nodes[:1]}
    results_leader = next(n for n in sorted(cluster.nodes) if n not in busy)
    topics = cluster_topics(cluster, partitions, planned.group.removeprefix("group-"),
                            results_leader)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    marks: dict[str, float] = {}
    with Fleet(cfg, log_dir, **{"KTW_KAFKA__STATIC_MEMBERSHIP": str(static_membership).lower(),
                                "KTW_BATCH__MAX_BATCH_SIZE": "8", **(env or {})}) as fleet:
        t0 = time.monotonic()
        for name in names:
            fleet.start(name)
        for name in names:
            assert fleet.wait_assigned(name, 120), f"{name} never got partitions"
        # Made only now: their clients connect at creation and are closed only by a thread
        # that ran, so a worker failing to start leaves none behind.
        feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s,
                        prefix=f"{fault[:4]}-", bad_every=bad_every)
        outputs = OutputWatch(bootstrap, topics)
        watcher = outputs.results
        fleet.own(feeder, outputs)
        feeder.start()
        outputs.start()
        deadline = time.monotonic() + 120
        while len(watcher.seen()) < steady_results:
            assert time.monotonic() < deadline and fleet.all_alive(), (
                "no steady processing before the fault")
            time.sleep(0.1)
        roles = node_roles(cluster, topics, partitions, txids)
        target = _target(cluster, fault, topics, txids)
        t_fault = time.monotonic()
        marks["fault"] = t_fault - t0
        try:
            if fault == "cut_off":
                cluster.pause(target)
                time.sleep(down_s)
                cluster.resume(target)
            else:
                cluster.kill9(target)
                time.sleep(down_s)
                cluster.restart(target)
        finally:
            node = cluster.node(target)
            if node.paused:
                cluster.resume(target)
            elif not node.is_running():
                cluster.restart(target)
        t_back = time.monotonic()
        marks["back"] = t_back - t0
        # Feed on until a job produced after the fault has its result, then a while longer
        # so every partition shows its own recovery.
        deadline = t_back + recovery_timeout_s
        while time.monotonic() < deadline and fleet.all_alive():
            if any(feeder.sent_at.get(k, 0.0) >= t_fault for k in list(watcher.first_seen)):
                break
            time.sleep(0.1)
        time.sleep(after_s)
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        t_drain = time.monotonic()
        drained = outputs.wait_for(good, bad, drain_timeout_s, fleet.all_alive)
        marks["drained"] = time.monotonic() - t0
        outputs.stop()
        first_seen = dict(watcher.first_seen)
        behind = wait_committed_to_end(bootstrap, topics, partitions, 90, fleet.all_alive)
        survived = {n: p.proc.poll() is None for n, p in fleet.procs.items()}
        tails = {}
        if not drained:
            for n, p in fleet.procs.items():
                p.dump_stacks()
                tails[n] = p.log_tail(40)
        codes: list[int | None] = []
        hung: dict[str, str] = {}
        for n in names:
            try:
                codes.append(fleet.terminate(n))
            except AssertionError as exc:  # did not exit after SIGTERM: killed, recorded
                codes.append(None)
                hung[n] = str(exc)[-3000:]
        events: collections.Counter[str] = collections.Counter()
        for p in fleet.every:
            events.update(log_events(p.log_text()))
        reasons = {n: exit_reason(p.log_text()) for n, p in fleet.procs.items()
                   if p.proc.returncode not in (0, None) and n not in hung}
    t_sync = time.monotonic()
    cluster.wait_in_sync(180)
    resync_s = time.monotonic() - t_sync
    audit = audit_outputs(bootstrap, topics, good, bad)
    where = audit.pop("_where")
    recovery, by_partition = _recovery(t_fault, feeder.sent_at, first_seen, where)
    recovered = [v for v in by_partition.values() if v is not None]
    figures: dict[str, Any] = {
        "fault": fault, "mode": mode, "target_node": target,
        "target_roles": roles.get(target, []),
        "roles": {str(n): r for n, r in sorted(roles.items())},
        "down_s": down_s, "rate_per_s": rate_per_s, "partitions": partitions,
        "instances": instances, "static_membership": static_membership,
        "jobs_good": len(good), "jobs_bad": len(bad),
        "jobs_sent_while_down": sum(1 for k in good | bad
                                    if t_fault <= feeder.sent_at[k] < t_back),
        "node_back_s": round(t_back - t_fault, 2),
        "recovery_s": recovery,
        "recovery_by_partition_s": by_partition,
        "recovery_all_partitions_s": (max(recovered) if len(recovered) == len(by_partition)
                                      else None),
        "drained": drained, "drain_s": round(time.monotonic() - t_drain, 1),
        "offsets_committed_to_end": not behind,
        "behind_before_stop": {str(p): n for p, n in sorted(behind.items())},
        "workers_survived": survived, "exit_codes": codes,
        "cluster_resync_s": round(resync_s, 1),
        "marks_s": {k: round(v, 1) for k, v in marks.items()},
        "worker_events": {k: events[k] for k in EVENTS},
    }
    if reasons:
        figures["exit_reasons"] = reasons
    if hung:
        figures["hung_at_sigterm"] = hung
    if tails:
        figures["worker_log_tails"] = tails
    figures.update(audit)
    return figures


def verdict(f: dict[str, Any]) -> list[str]:
    """What is wrong with one drill's figures ([] when it passed its guarantee)."""
    wrong = []
    if not f["drained"]:
        wrong.append("not drained")
    if f["recovery_s"] is None:
        wrong.append("no recovery")
    if f.get("hung_at_sigterm"):
        wrong.append(f"workers hung at SIGTERM: {sorted(f['hung_at_sigterm'])}")
    if any(c != 0 for c in f["exit_codes"]):
        wrong.append(f"exit codes {f['exit_codes']}")
    if f["results"]["missing"] or f["dlq"]["missing"]:
        wrong.append(f"missing {f['results']['missing']} results, {f['dlq']['missing']} DLQ")
    if f["results_not_their_job"] or f["dlq_not_their_job"]:
        wrong.append("outputs not belonging to their job")
    if f["results"]["unexpected"] or f["dlq"]["unexpected"]:
        wrong.append("unexpected outputs")
    if not f["offsets_committed_to_end"]:
        wrong.append(f"offsets behind {f['behind_before_stop']}")
    if f["mode"] == "exactly-once":
        if f["results"]["duplicates"] or f["dlq"]["duplicates"]:
            wrong.append(f"duplicates {f['results']['duplicates']} "
                         f"(DLQ {f['dlq']['duplicates']})")
        if f["partitions_not_exactly_in_order"]:
            wrong.append(f"not exactly once in order: {f['partitions_not_exactly_in_order']}")
    return wrong
