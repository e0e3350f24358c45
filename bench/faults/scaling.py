"""Scale 1 -> 3 -> 1 workers under load, repeatedly.

    python -m bench.faults.scaling [--repeats 3] [--phase-s 30] [--modes ...]
"""

from __future__ import annotations

import argparse
import time

from bench.faults._run import add_modes, audit_ok, broker, finish, log_dir, model_env, modes
from tests.harness.faults import run_scaling


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=1000.0, help="jobs per second fed")
    p.add_argument("--partitions", type=int, default=6)
    add_modes(p)
    a = p.parse_args()
    started = time.monotonic()
    runs = []
    with broker() as (bootstrap, _):
        for mode in modes(a.modes):
            for i in range(a.repeats):
                f = run_scaling(bootstrap, log_dir(f"scaling-{mode}-{i}"), mode=mode,
                                rate_per_s=a.rate, partitions=a.partitions, phase_s=a.phase_s,
                                env=model_env(a.model))
                f["ok"] = (audit_ok(f, mode) and f["drained"]
                           and set(f["exit_codes"].values()) == {0}
                           and f["results"]["missing"] == 0 and f["dlq"]["missing"] == 0
                           and (mode == "at-least-once" or f["results"]["duplicates"] == 0))
                runs.append(f)
                print(f"{mode} #{i}: missing {f['results']['missing']}, duplicates "
                      f"{f['results']['duplicates']}, per worker {f['results_per_worker']}, "
                      f"ok={f['ok']}", flush=True)
    finish("faults-scaling", vars(a), runs, started, all(r["ok"] for r in runs))


if __name__ == "__main__":
    main()
