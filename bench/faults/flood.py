"""Malformed-input flood: N bad jobs of every corpus class mixed with good ones.

    python -m bench.faults.flood [--bad 10000] [--good 300] [--modes ...]
"""

from __future__ import annotations

import argparse
import time

from bench.faults._run import add_modes, audit_ok, broker, finish, log_dir, model_env, modes
from tests.harness.faults import run_flood


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bad", type=int, default=10_000)
    p.add_argument("--good", type=int, default=300)
    add_modes(p)
    a = p.parse_args()
    started = time.monotonic()
    runs = []
    with broker() as (bootstrap, _):
        for mode in modes(a.modes):
            f = run_flood(bootstrap, log_dir(f"flood-{mode}"), mode=mode, n_bad=a.bad,
                          n_good=a.good, env=model_env(a.model))
            f["ok"] = (audit_ok(f, mode) and f["drained"] and f["worker_survived"]
                       and f["exit_code"] == 0
                       and f["dlq"]["missing"] == 0 and not f["dlq_wrong_reason"]
                       and f["results"]["missing"] == 0 and f["results_not_ok"] == 0)
            runs.append(f)
            print(f"{mode}: {f['bad_jobs']} bad in {f['elapsed_s']} s, dlq {f['dlq']}, "
                  f"results {f['results']}, ok={f['ok']}", flush=True)
    finish("faults-flood", vars(a), runs, started, all(r["ok"] for r in runs))


if __name__ == "__main__":
    main()
