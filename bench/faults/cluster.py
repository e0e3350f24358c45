"""Cluster-level faults on a 3-node KRaft cluster under load, with recovery times.

    python -m bench.faults.cluster [--faults leader,group_coordinator,transaction_coordinator,
        cut_off] [--down-s 20] [--repeats 1] [--instances 2] [--modes ...]

Always on a LocalKafkaCluster of its own (it kills and freezes its nodes). Per fault, fresh
topics (RF 3, min ISR 2) and a fresh group of ``--instances`` workers under a steady feed; the
node that leads the results partition, coordinates the group, or coordinates the first worker's
transactional id is killed with SIGKILL and restarted after ``--down-s``, or (cut_off) the
results leader is frozen with SIGSTOP for ``--down-s`` and resumed. The transaction coordinator
fault runs under exactly-once only. Checks: exactly-once output is every job once, in offset
order per jobs partition, each result carrying its own job's source offset; at-least-once loses
nothing. Recovery: from the fault to the first result of a job produced after it (overall and
per jobs partition). Worker logs are kept in the folder printed at start.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.faults._run import add_modes, finish, log_dir, model_env, modes
from tests.harness.cluster_faults import FAULTS, run_cluster_fault, verdict
from worker.devkit.local_kafka import LocalKafkaCluster, LocalKafkaError


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of " +
                   ", ".join(FAULTS))
    p.add_argument("--down-s", type=float, default=20.0,
                   help="seconds a killed node stays down / a cut-off node stays frozen")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--rate", type=float, default=10.0, help="jobs per second fed")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--after-s", type=float, default=15.0,
                   help="feed this long after the first post-fault result")
    p.add_argument("--dynamic-membership", action="store_true",
                   help="workers join without group.instance.id (static membership otherwise)")
    add_modes(p)
    a = p.parse_args()
    faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise SystemExit(f"unknown fault(s): {sorted(unknown)}")
    started = time.monotonic()
    runs = []
    with LocalKafkaCluster(brokers=3) as cluster:
        for mode in modes(a.modes):
            for fault in faults:
                if fault == "transaction_coordinator" and mode != "exactly-once":
                    continue  # at-least-once has no transactions
                for i in range(a.repeats):
                    try:
                        f = run_cluster_fault(
                            cluster, log_dir(f"cluster-{fault}-{mode}-{i}"), fault=fault,
                            mode=mode, down_s=a.down_s, rate_per_s=a.rate,
                            partitions=a.partitions, instances=a.instances,
                            after_s=a.after_s, static_membership=not a.dynamic_membership,
                            env=model_env(a.model))
                    except (AssertionError, LocalKafkaError) as exc:
                        # One drill failing outright is a finding; the others still run.
                        runs.append({"fault": fault, "mode": mode, "ok": False,
                                     "error": str(exc)[-3000:]})
                        print(f"{mode} {fault} #{i}: FAILED {str(exc)[:300]}", flush=True)
                        continue
                    f["problems"] = verdict(f)
                    f["ok"] = not f["problems"]
                    runs.append(f)
                    print(f"{mode} {fault} #{i}: node {f['target_node']} "
                          f"({', '.join(f['target_roles'])}), back after "
                          f"{f['node_back_s']} s, recovery {f['recovery_s']} s (all partitions "
                          f"{f['recovery_all_partitions_s']} s), missing "
                          f"{f['results']['missing']}, duplicates {f['results']['duplicates']},"
                          f" ok={f['ok']} {f['problems']}", flush=True)
    for fault in faults:
        recs = [r["recovery_all_partitions_s"] for r in runs
                if r["fault"] == fault and r.get("recovery_all_partitions_s") is not None]
        if recs:
            print(f"{fault}: recovery (all partitions) median {statistics.median(recs):.2f} s, "
                  f"max {max(recs):.2f} s")
    finish("faults-cluster", vars(a), runs, started, all(r["ok"] for r in runs))


if __name__ == "__main__":
    main()
