"""A bench window's view of the worker's histograms: what was observed between two scrapes."""

from __future__ import annotations

from bench.worker_metrics import delta, parse


def _exposition(gen2: list[int], gen2_sum: float, engine: list[int]) -> str:
    les = ["0.001", "0.01", "0.1", "+Inf"]
    lines = ["# HELP trt_worker_gc_pause_seconds pauses",
             "# TYPE trt_worker_gc_pause_seconds histogram"]
    for le, c in zip(les, gen2, strict=True):
        lines.append(f'trt_worker_gc_pause_seconds_bucket{{generation="2",le="{le}"}} {c}')
    lines += [f'trt_worker_gc_pause_seconds_count{{generation="2"}} {gen2[-1]}',
              f'trt_worker_gc_pause_seconds_sum{{generation="2"}} {gen2_sum}',
              "# HELP trt_worker_engine_seconds engine",
              "# TYPE trt_worker_engine_seconds histogram"]
    for le, c in zip(les, engine, strict=True):
        lines.append(f'trt_worker_engine_seconds_bucket{{profile="gpu",le="{le}"}} {c}')
    lines += [f'trt_worker_engine_seconds_count{{profile="gpu"}} {engine[-1]}',
              'trt_worker_engine_seconds_sum{profile="gpu"} 1.0',
              "# HELP trt_worker_results results", "# TYPE trt_worker_results counter",
              "trt_worker_results_total 5"]
    return "\n".join(lines) + "\n"


def test_the_window_counts_new_observations_and_bounds_the_largest() -> None:
    before = parse(_exposition([3, 4, 4, 4], 0.002, [0, 10, 10, 10]))
    after = parse(_exposition([3, 5, 6, 6], 0.095, [0, 10, 10, 10]))
    d = delta(before, after)
    # One pause <= 10 ms and one in (10, 100] ms came; nothing new for the engine.
    assert d == {"gc_pause_seconds": {"generation=2": {
        "n": 2, "sum": 0.093, "p50_le": 0.01, "p99_le": 0.1, "max_le": 0.1}}}


def test_the_quantile_bounds_follow_the_new_observations_only() -> None:
    # 100 new observations: 98 at <= 1 ms, one in (1, 10] ms, one in (10, 100] ms; the 400
    # before the window, all slow, do not count.
    before = parse(_exposition([0, 0, 400, 400], 20.0, [0, 0, 0, 0]))
    after = parse(_exposition([98, 99, 500, 500], 20.2, [0, 0, 0, 0]))
    d = delta(before, after)["gc_pause_seconds"]["generation=2"]
    assert (d["n"], d["p50_le"], d["p99_le"], d["max_le"]) == (100, 0.001, 0.01, 0.1)


def test_an_observation_past_the_last_bound_reads_inf() -> None:
    before = parse(_exposition([0, 0, 0, 0], 0.0, [0, 0, 0, 0]))
    after = parse(_exposition([0, 0, 0, 1], 0.5, [0, 0, 0, 0]))
    assert delta(before, after)["gc_pause_seconds"]["generation=2"]["max_le"] == "+Inf"


def test_a_worker_that_did_not_answer_is_said_so() -> None:
    assert "error" in delta(None, parse(_exposition([0, 0, 0, 0], 0.0, [0, 0, 0, 0])))
