"""Two py-spy speedscope profiles of the worker side by side: samples per function, per thread.

`bash bench/device_kafka.sh profile` / `profile-before` (with ``PYSPY_FLAGS=--gil``, so a
sample is taken only from the thread holding the GIL) record every process of one
bench/moderation/kafka_e2e.py run. This takes the worker process of each (the one whose
threads include ``batch_*``: the bench's own processes have none), groups its threads by kind
(``batch_0``..``batch_3`` count as ``batch``) and prints, per kind, the functions with the most
samples in either profile: ``--inclusive`` counts a function when it is anywhere on the stack,
otherwise only where the sample was taken. At 200 samples/s, 200 samples are one second of
GIL time: divided by the jobs of the run, what each job costs the process's one GIL.

    python bench/moderation/profile_diff.py BEFORE.speedscope.json AFTER.speedscope.json \
        [--inclusive] [--top 30]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def _thread_kind(profile_name: str) -> str:
    # py-spy names a profile 'Process <pid> Thread <tid> "<name>"'.
    name = profile_name.split('"')[1] if '"' in profile_name else ""
    return "batch" if name.startswith("batch_") else (name or "main")


def worker_threads(path: Path, inclusive: bool) -> dict[str, Counter[str]]:
    """Samples per function, by thread kind, of the profile's worker process."""
    doc: dict[str, Any] = json.loads(path.read_text())
    frames = doc["shared"]["frames"]
    by_pid: dict[str, list[dict[str, Any]]] = {}
    for prof in doc["profiles"]:
        parts = prof["name"].split()
        if len(parts) > 1 and parts[0] == "Process":
            by_pid.setdefault(parts[1], []).append(prof)
    workers = [profs for profs in by_pid.values()
               if any(_thread_kind(p["name"]) == "batch" for p in profs)]
    if len(workers) != 1:
        raise SystemExit(f"{path}: {len(workers)} processes with batch threads, expected one")
    out: dict[str, Counter[str]] = {}
    for prof in workers[0]:
        counts = out.setdefault(_thread_kind(prof["name"]), Counter())
        for stack in prof["samples"]:
            if not stack:
                continue
            picked = stack if inclusive else stack[-1:]
            names = {f"{frames[i]['name']} {Path(frames[i].get('file', '')).name}"
                     for i in picked}
            counts.update(names)  # a set: recursion counts a function once per sample
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--inclusive", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    before = worker_threads(args.before, args.inclusive)
    after = worker_threads(args.after, args.inclusive)
    for kind in sorted(set(before) | set(after)):
        b, a = before.get(kind, Counter()), after.get(kind, Counter())
        total_b = sum(b.values()) if not args.inclusive else max(b.values(), default=0)
        total_a = sum(a.values()) if not args.inclusive else max(a.values(), default=0)
        print(f"== {kind}: {total_b} samples before, {total_a} after")
        for name in sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))[:args.top]:
            print(f"  {b[name]:6d} {a[name]:6d}  {name[:110]}")


if __name__ == "__main__":
    main()
