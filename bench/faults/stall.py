"""Freeze the broker (SIGSTOP) under load, repeatedly, and measure recovery.

    python -m bench.faults.stall [--repeats 5] [--stall-s 30] [--static-membership] [--modes ...]

Always on a broker of its own (a LocalKafka), since it freezes it. Recovery time: from the
resume until a result is visible (read_committed) for a job produced after the stall began.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.faults._run import add_modes, audit_ok, broker, finish, log_dir, model_env, modes
from tests.harness.faults import run_broker_stall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stall-s", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=1000.0, help="jobs per second fed")
    p.add_argument("--bound-s", type=float, default=10.0, help="recovery bound to check")
    p.add_argument("--static-membership", action="store_true",
                   help="workers join with group.instance.id (KIP-345)")
    add_modes(p)
    a = p.parse_args()
    started = time.monotonic()
    runs = []
    with broker(local_only=True) as (_, kafka):
        assert kafka is not None
        for mode in modes(a.modes):
            for i in range(a.repeats):
                env: dict[str, str] = ({"KTW_KAFKA__STATIC_MEMBERSHIP": "true"}
                                       if a.static_membership else {})
                env.update(model_env(a.model))
                f = run_broker_stall(
                    kafka, log_dir(f"stall-{mode}-{i}"), mode=mode, stall_s=a.stall_s,
                    rate_per_s=a.rate, env=env)
                rec = f["recovery_s"]
                f["ok"] = (audit_ok(f, mode) and f["worker_survived"] and f["exit_code"] == 0
                           and f["drained"]
                           and rec is not None and rec <= a.bound_s
                           and f["results"]["missing"] == 0 and f["dlq"]["missing"] == 0
                           and (mode == "at-least-once" or f["results"]["duplicates"] == 0)
                           and f["health"]["live_throughout"])
                runs.append(f)
                print(f"{mode} #{i}: recovery {rec} s, backlog drained in "
                      f"{f['backlog_drained_s']} s, missing {f['results']['missing']}, "
                      f"duplicates {f['results']['duplicates']}, ok={f['ok']}", flush=True)
    for mode in modes(a.modes):
        recs = [r["recovery_s"] for r in runs if r["mode"] == mode and r["recovery_s"] is not None]
        if recs:
            print(f"{mode}: recovery median {statistics.median(recs):.2f} s, max {max(recs):.2f} s")
    finish("faults-stall", vars(a), runs, started, all(r["ok"] for r in runs))


if __name__ == "__main__":
    main()
