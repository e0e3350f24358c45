"""The two-task targets: moderation's p99 beside generation and generation's share kept, of
its own alone and of generation alone on every SM."""

from __future__ import annotations

from typing import Any

import pytest

from bench.generation.two_tasks_pool import on_every_sm, pool, targets, variant_name


def _hdr(ms: list[float]) -> str:
    from bench.frames_e2e import _histogram

    h = _histogram()
    for x in ms:
        h.record_value(int(x * 1e3))
    return str(h.encode().decode())


def _run(settings: dict[str, str], *, alone: float, beside: float, p99: float,
         lat: list[float] | None = None) -> dict[str, Any]:
    lat = lat or [p99]
    return {"gpu_yield_ms": 0.0, "gpu_priority": True, "settings": settings,
            "generation_alone": {"images_per_s": alone},
            "moderation_alone": {"latency": {"p99_ms": 5.0}, "latency_hdr": _hdr([5.0])},
            "both": {"moderation": {"latency": {"p99_ms": p99}, "latency_hdr": _hdr(lat)},
                     "generation": {"images_per_s": beside}}}


def _record(runs: list[dict[str, Any]], gpu: str = "H100",
            common: dict[str, str] | None = None, gen_outstanding: int = 4) -> dict[str, Any]:
    return {"env": {"gpu": gpu, "commit": "abc"}, "provenance": {"dirty": False},
            "params": {"worker_config_overrides": common or {}, "mod_rate": 2000.0,
                       "gen_outstanding": gen_outstanding}, "runs": runs}


EVERY_SM = {"processing.gpu_free_sms": "0"}
DISJOINT_48 = {"processing.gpu_free_sms": "48", "processing.gpu_disjoint_sms": "true"}


def test_every_sm_is_gpu_free_sms_zero_on_the_variant_or_for_the_whole_call() -> None:
    assert on_every_sm(_run(EVERY_SM, alone=4, beside=3, p99=9), {})
    assert on_every_sm(_run({}, alone=4, beside=3, p99=9), {"processing.gpu_free_sms": "0"})
    assert not on_every_sm(_run({}, alone=4, beside=3, p99=9), {})
    assert not on_every_sm(_run(DISJOINT_48, alone=4, beside=3, p99=9),
                           {"processing.gpu_free_sms": "0"})


def test_a_variant_meets_both_only_against_generation_alone_on_every_sm() -> None:
    runs = [_run(EVERY_SM, alone=4.0, beside=3.0, p99=40.0),
            _run(DISJOINT_48, alone=3.0, beside=2.9, p99=20.0)]
    out = targets(runs, {})
    assert out["every_sm_reference"] == 4.0
    every, disjoint = out["runs"]
    # 2.9 is 97% of its own partitioned alone but 72.5% of what generation does on every SM.
    assert disjoint["kept_of_own_alone"] == pytest.approx(0.967, abs=1e-3)
    assert disjoint["kept_of_every_sm_alone"] == pytest.approx(0.725)
    assert disjoint["meets_both"] is False
    assert every["kept_of_every_sm_alone"] == 0.75 and every["meets_both"] is False


def test_without_an_every_sm_run_the_share_is_unknown_not_met() -> None:
    out = targets([_run(DISJOINT_48, alone=3.0, beside=2.9, p99=20.0),
                   _run({}, alone=3.0, beside=2.9, p99=30.0)], {})
    assert out["every_sm_reference"].startswith("none")
    assert [r["meets_both"] for r in out["runs"]] == [None, False]


@pytest.mark.parametrize(("priority", "word"), [(True, "on"), (False, "off"), ("auto", "auto")])
def test_a_variant_names_its_priority(priority: bool | str, word: str) -> None:
    run = _run(EVERY_SM, alone=4.0, beside=3.4, p99=24.0) | {"gpu_priority": priority}
    assert variant_name(run) == f"yield 0 ms, priority {word}, processing.gpu_free_sms 0"


def test_both_met() -> None:
    out = targets([_run(EVERY_SM, alone=4.0, beside=3.4, p99=24.0)], {})
    assert out["runs"][0]["meets_both"] is True


def test_pooling_adds_the_latencies_of_each_variant_across_records() -> None:
    fast = [10.0] * 99 + [12.0]
    slow = [10.0] * 90 + [60.0] * 10
    a = _record([_run(DISJOINT_48, alone=3.0, beside=2.9, p99=12.0, lat=fast),
                 _run(EVERY_SM, alone=4.0, beside=3.5, p99=12.0, lat=fast)])
    b = _record([_run(DISJOINT_48, alone=3.2, beside=3.1, p99=60.0, lat=slow)])
    out = pool([a, b])
    v = out["variants"][variant_name(a["runs"][0])]
    assert v["runs"] == 2 and v["p99_ms_per_run"] == [12.0, 60.0]
    # 200 jobs, 10 at 60 ms: the pooled p99 is 60 ms, not the median of the runs' p99s.
    assert v["moderation_beside_pooled"]["n"] == 200
    assert v["moderation_beside_pooled"]["p99_ms"] == pytest.approx(60.0, rel=1e-2)
    assert v["kept_of_every_sm_alone_median"] == 0.75 and v["meets_both"] is False
    assert out["every_sm_reference"] == 4.0


def test_records_of_different_gpus_are_not_pooled() -> None:
    with pytest.raises(ValueError, match="one GPU model"):
        pool([_record([], gpu="H100"), _record([], gpu="H200")])


def test_records_of_different_loads_are_not_pooled() -> None:
    # Generation alone is faster with more jobs outstanding: a share read against another
    # load's reference would be wrong.
    with pytest.raises(ValueError, match="one load only"):
        pool([_record([], gen_outstanding=4), _record([], gen_outstanding=8)])
