"""kill -9 a worker at random points under load, many times (default 200 per guarantee).

    python -m bench.faults.kill9 [--kills 200] [--modes at-least-once,exactly-once]

Three `trt-worker run` processes (static membership) share six partitions under a steady feed
(every 20th job malformed); one at a time is SIGKILLed at a random point after it got its
partitions and restarted at once with the same instance id. Afterwards: at-least-once must have
>= 1 result per job, exactly-once exactly one per job for a read_committed reader (and one DLQ
record per bad job). Figures: losses, duplicates, aborted records, drain time.
"""

from __future__ import annotations

import argparse
import time

from bench.faults._run import add_modes, audit_ok, broker, finish, log_dir, model_env, modes
from tests.harness.faults import run_kill9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--rate", type=float, default=1000.0, help="jobs per second fed")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--max-delay-s", type=float, default=2.5,
                   help="a kill lands 0.1..this many seconds after the target got partitions")
    p.add_argument("--seed", type=int, default=200)
    add_modes(p)
    a = p.parse_args()
    started = time.monotonic()
    runs = []
    with broker() as (bootstrap, _):
        for mode in modes(a.modes):
            f = run_kill9(bootstrap, log_dir(f"kill9-{mode}"), mode=mode, kills=a.kills,
                          seed=a.seed, instances=a.instances, partitions=a.partitions,
                          rate_per_s=a.rate, max_delay_s=a.max_delay_s,
                          env=model_env(a.model))
            f["ok"] = (f["drained"] and audit_ok(f, mode) and f["results"]["missing"] == 0
                       and f["dlq"]["missing"] == 0 and f["offsets_committed_to_end"]
                       and (mode == "at-least-once" or (f["results"]["duplicates"] == 0
                                                        and f["dlq"]["duplicates"] == 0)))
            runs.append(f)
            print(f"{mode}: {a.kills} kills, missing {f['results']['missing']}, duplicates "
                  f"{f['results']['duplicates']} (dlq {f['dlq']['duplicates']}), aborted "
                  f"records {f['aborted_result_records']}, content faults {f['content_faults']}, "
                  f"order inversions {f['order_inversions']}, ok={f['ok']}", flush=True)
    finish("faults-kill9", vars(a), runs, started, all(r["ok"] for r in runs))


if __name__ == "__main__":
    main()
