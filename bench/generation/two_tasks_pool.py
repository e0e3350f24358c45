"""The two-task targets over two-task records (bench/generation/two_tasks.py): moderation's
p99 beside generation at full load (<= 25 ms) and generation's images/s beside moderation as a
share of its images/s alone (>= 80%).

"Alone" is read two ways, both kept: the same worker's generation alone (its own partition
included: with ``processing.gpu_free_sms`` generation keeps off those SMs alone too), and
generation alone on every SM, the figure a user of generation alone would get. The second
needs a variant with ``processing.gpu_free_sms=0`` (set on it or by ``--set``) in the records;
without one it is null and says so.

``targets(record)`` is written into each two-task record; ``python
bench/generation/two_tasks_pool.py RECORD...`` pools records of one GPU model per variant (the
moderation latencies' HdrHistograms added, generation's figures listed) and writes the pooled
record (``two-tasks-pooled[-LABEL]``) with the records it read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, provenance, write

P99_TARGET_MS = 25.0
KEPT_TARGET = 0.80
FREE_SMS = "processing.gpu_free_sms"
# What a call offered both tasks: records that differ in any of these measured other loads
# (generation alone with 8 jobs outstanding made 5.0 images/s where 4 made 4.3 on one H100).
LOAD_PARAMS = ("mod_rate", "gen_outstanding", "steps", "partitions", "gen_json",
               "worker_config_overrides")


def variant_name(run: dict[str, Any]) -> str:
    """A run's variant as the bench prints it (yield, priority: on, off or auto, its own
    settings)."""
    priority = run["gpu_priority"]
    word = priority if isinstance(priority, str) else ("on" if priority else "off")
    return f"yield {run['gpu_yield_ms']:g} ms, priority {word}" + "".join(
        f", {k} {v}" for k, v in sorted(run.get("settings", {}).items()))


def on_every_sm(run: dict[str, Any], common: dict[str, str]) -> bool:
    """Whether the run's generation had every SM: gpu_free_sms 0, on the variant or common."""
    value = run.get("settings", {}).get(FREE_SMS, common.get(FREE_SMS))
    return value is not None and int(value) == 0


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def _judge(p99_ms: float | None, kept: float | None) -> bool | None:
    """Both targets met (True), either missed (False), or not known (None: no every-SM
    figure, and the p99 target met)."""
    if p99_ms is None or p99_ms > P99_TARGET_MS:
        return False
    if kept is None:
        return None
    return kept >= KEPT_TARGET


def every_sm_alone(runs: list[dict[str, Any]], common: dict[str, str]) -> list[float]:
    return [r["generation_alone"]["images_per_s"] for r in runs
            if on_every_sm(r, common) and r.get("generation_alone")]


def _reference(alone_all: list[float], where: str) -> tuple[dict[str, Any], float | None]:
    """The targets, the every-SM alone figures and their median (the reference a share is
    read against), or the reason there is none."""
    ref = statistics.median(alone_all) if alone_all else None
    return {"p99_target_ms": P99_TARGET_MS, "kept_target": KEPT_TARGET,
            "every_sm_alone_images_per_s": alone_all,
            "every_sm_reference": ref if ref is not None else (
                f"none: no run with {FREE_SMS}=0 in {where}")}, ref


def targets(runs: list[dict[str, Any]], common: dict[str, str]) -> dict[str, Any]:
    """Per run: moderation's p99 beside generation and generation's share kept, of its own
    alone and of the median every-SM alone of these runs."""
    head, ref = _reference(every_sm_alone(runs, common), "this call")
    rows = []
    for r in runs:
        both = r.get("both") or {}
        p99 = (both.get("moderation") or {}).get("latency", {}).get("p99_ms")
        gen = (both.get("generation") or {}).get("images_per_s")
        kept_every = _ratio(gen, ref)
        rows.append({
            "variant": variant_name(r), "moderation_p99_ms": p99,
            "generation_images_per_s": gen,
            "kept_of_own_alone": _ratio(gen, (r.get("generation_alone") or {}).get(
                "images_per_s")),
            "kept_of_every_sm_alone": kept_every, "meets_both": _judge(p99, kept_every)})
    return {**head, "runs": rows}


def pool(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant over ``records`` (one GPU model): moderation's latencies beside generation
    and alone pooled, the per-run p99s, generation's figures and shares kept (of the median
    every-SM alone over all the records)."""
    from hdrh.histogram import HdrHistogram

    from bench.frames_e2e import _histogram, hist_summary

    gpus = {r["env"].get("gpu") for r in records}
    if len(gpus) != 1:
        raise ValueError(f"records of one GPU model only, not {sorted(map(str, gpus))}")
    loads = {json.dumps({k: r["params"].get(k) for k in LOAD_PARAMS}, sort_keys=True)
             for r in records}
    if len(loads) != 1:
        raise ValueError(f"records of one load only ({', '.join(LOAD_PARAMS)}), not "
                         f"{sorted(loads)}")
    head, ref = _reference([x for r in records for x in every_sm_alone(
        r["runs"], r["params"].get("worker_config_overrides", {}))], "these records")
    out: dict[str, Any] = {}
    for run in (run for r in records for run in r["runs"]):
        if not run.get("both"):
            continue
        v = out.setdefault(variant_name(run), {
            "runs": 0, "_both": _histogram(), "_alone": _histogram(), "p99_ms_per_run": [],
            "generation_alone": [], "generation_beside": []})
        v["runs"] += 1
        v["_both"].add(HdrHistogram.decode(run["both"]["moderation"]["latency_hdr"]))
        v["_alone"].add(HdrHistogram.decode(run["moderation_alone"]["latency_hdr"]))
        v["p99_ms_per_run"].append(run["both"]["moderation"]["latency"]["p99_ms"])
        v["generation_alone"].append(run["generation_alone"]["images_per_s"])
        v["generation_beside"].append(run["both"]["generation"]["images_per_s"])
    for v in out.values():
        both, alone = v.pop("_both"), v.pop("_alone")
        v["moderation_beside_pooled"] = hist_summary(both)
        v["moderation_alone_pooled"] = hist_summary(alone)
        beside = statistics.median(v["generation_beside"])
        v["kept_of_own_alone_median"] = _ratio(beside, statistics.median(
            v["generation_alone"]))
        v["kept_of_every_sm_alone_median"] = _ratio(beside, ref)
        v["meets_both"] = _judge(v["moderation_beside_pooled"].get("p99_ms"),
                                 v["kept_of_every_sm_alone_median"])
    return {"gpu": gpus.pop(), **head, "variants": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    records = [json.loads(p.read_text()) for p in args.records]
    pooled = pool(records)
    for name, v in pooled["variants"].items():
        print(f"{name}: {v['runs']} runs, beside p99 pooled "
              f"{v['moderation_beside_pooled'].get('p99_ms')} ms (per run "
              f"{v['p99_ms_per_run']}), generation beside {v['generation_beside']}, kept of "
              f"own alone {v['kept_of_own_alone_median']}, of every-SM alone "
              f"{v['kept_of_every_sm_alone_median']}: meets both {v['meets_both']}")
    record = {"bench": "two-tasks-pooled", "env": environment(), "provenance": provenance(),
              "sources": [{"file": p.name, "commit": r["env"].get("commit"),
                           "dirty": r.get("provenance", {}).get("dirty"),
                           "time": r["env"].get("time")}
                          for p, r in zip(args.records, records, strict=True)],
              **pooled}
    path = write("two-tasks-pooled" + (f"-{args.label}" if args.label else ""), record,
                 args.out)
    print(f"record {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
