"""The two-task bench's variants (a yield and whether moderation's streams are urgent) and
its full generation load."""

from __future__ import annotations

import json

import pytest

from bench.generation.two_tasks import (
    full_load,
    gen_stages,
    parse_variants,
    timeline,
    worker_overrides,
)


def test_variants_name_a_yield_and_a_priority_each() -> None:
    assert parse_variants("0:off,0:on,5:on,0:auto", "5") == [
        (0.0, False, {}), (0.0, True, {}), (5.0, True, {}), (0.0, "auto", {})]


def test_without_variants_each_yield_runs_with_the_default_priority() -> None:
    assert parse_variants(None, "0,5") == [(0.0, "auto", {}), (5.0, "auto", {})]


def test_an_auto_priority_reaches_the_worker_as_auto() -> None:
    (variant,) = parse_variants("0:auto", "0")
    assert worker_overrides({}, variant, {})["processing.gpu_priority"] == "auto"


def test_a_variant_without_on_or_off_is_refused() -> None:
    with pytest.raises(ValueError, match="YIELD_MS:on"):
        parse_variants("5", "5")


def test_a_variant_may_carry_settings_of_its_own_worker() -> None:
    assert parse_variants("0:on,0:on+generation.png_threads=1+batch.max_delay_ms=2",
                          "5") == [(0.0, True, {}), (0.0, True, {
                              "generation.png_threads": "1",
                              "batch.max_delay_ms": "2"})]


@pytest.mark.parametrize("item", ["0:on+delay=2", "0:on+batch.max_delay_ms"])
def test_a_setting_without_its_section_or_value_is_refused(item: str) -> None:
    with pytest.raises(ValueError, match=r"SECTION\.KEY=VALUE"):
        parse_variants(item, "5")


def test_the_timeline_keeps_slow_moderation_jobs_and_generation_arrivals() -> None:
    import threading
    from types import SimpleNamespace

    # rate 100/s from 1000.0: job i is due at 1000 + i / 100
    mod = SimpleNamespace(lock=threading.Lock(), results={
        "mb-0": (1000.010, None),    # due 1000.00, 10 ms: before the window
        "mb-100": (1001.030, None),  # due 1001.00, 30 ms: slow
        "mb-101": (1001.015, None),  # due 1001.01, 5 ms: fast
        "mb-250": (1002.600, None),  # due 1002.50, 100 ms: slow
        "mb-400": (1004.500, None),  # due 1004.00: past the window
        "ma-7": (1001.9, None)})     # another phase's job
    gen = SimpleNamespace(lock=threading.Lock(), timings={}, results={
        "gb-1": (1001.5, None), "gb-2": (1005.0, None), "ga-1": (1001.2, None)})
    t = timeline(mod, gen, "mb-", "gb-", 1000.0, 100.0,  # type: ignore[arg-type]
                 (1001.0, 1003.0), 25.0)
    assert t["slow_mod_jobs"] == [[0.0, 30.0], [1.5, 100.0]]
    assert t["gen_results_s"] == [0.5]


def test_a_batchs_stages_are_laid_back_to_back_from_its_results_arrival() -> None:
    timings = {"queue": 900.0, "engines_wait": 0.0, "text": 10.0, "denoise": 2000.0,
               "vae": 400.0, "moderation": 20.0, "png": 70.0, "total": 3400.0}
    stages = [(name, round(a, 3), round(b, 3)) for name, a, b in gen_stages(100.0, timings)]
    # queue and total are not stages; a stage of 0 ms takes no time
    assert stages == [("text", 97.5, 97.51), ("denoise", 97.51, 99.51), ("vae", 99.51, 99.91),
                      ("moderation", 99.91, 99.93), ("png", 99.93, 100.0)]


def test_the_timeline_counts_slow_jobs_by_the_generation_stage_running_when_due() -> None:
    import threading
    from types import SimpleNamespace

    # rate 100/s from 1000.0: job i is due at 1000 + i / 100
    mod = SimpleNamespace(lock=threading.Lock(), results={
        "mb-120": (1001.4, None),   # due 1001.2 (the first batch's denoising): 200 ms
        "mb-165": (1001.95, None),  # due 1001.65 (VAE): 300 ms
        "mb-175": (1002.05, None),  # due 1001.75 (VAE): 300 ms
        "mb-195": (1002.05, None),  # due 1001.95 (PNG): 100 ms
        "mb-250": (1002.58, None),  # due 1002.5 (the next batch's denoising): 80 ms
        "mb-280": (1002.85, None),  # due 1002.8, after both batches: 50 ms
        "mb-130": (1001.31, None)})  # fast
    timings = {"queue": 50.0, "text": 100.0, "denoise": 500.0, "vae": 300.0, "png": 100.0}
    # the next batch, waiting for the engines while this one's VAE and PNGs run
    later = {"queue": 10.0, "engines_wait": 600.0, "text": 100.0, "denoise": 500.0}
    gen = SimpleNamespace(lock=threading.Lock(),
                          timings={"gb-1": timings, "gb-2": dict(timings, queue=60.0),
                                   "gb-3": later},
                          results={"gb-1": (1002.0, None), "gb-2": (1002.003, None),
                                   "gb-3": (1002.6, None)})
    t = timeline(mod, gen, "mb-", "gb-", 1000.0, 100.0,  # type: ignore[arg-type]
                 (1001.0, 1003.0), 25.0)
    # one entry per batch (its results share their stages; laid out from the first to
    # arrive), in seconds from the window's start
    assert t["gen_stages"] == [
        [["text", 0.0, 0.1], ["denoise", 0.1, 0.6], ["vae", 0.6, 0.9], ["png", 0.9, 1.0]],
        [["engines_wait", 0.4, 1.0], ["text", 1.0, 1.1], ["denoise", 1.1, 1.6]]]
    # the VAE and PNG jobs are the first batch's, though the next one waits for the engines
    assert t["slow_by_gen_stage"] == {
        "denoise": {"n": 2, "p50_ms": 140.0, "max_ms": 200.0},
        "none": {"n": 1, "p50_ms": 50.0, "max_ms": 50.0},
        "png": {"n": 1, "p50_ms": 100.0, "max_ms": 100.0},
        "vae": {"n": 2, "p50_ms": 300.0, "max_ms": 300.0}}


def test_the_timeline_without_stage_timings_has_no_stages() -> None:
    import threading
    from types import SimpleNamespace

    mod = SimpleNamespace(lock=threading.Lock(), results={"mb-120": (1001.4, None)})
    gen = SimpleNamespace(lock=threading.Lock(), timings={}, results={"gb-1": (1002.0, None)})
    t = timeline(mod, gen, "mb-", "gb-", 1000.0, 100.0,  # type: ignore[arg-type]
                 (1001.0, 1003.0), 25.0)
    assert "gen_stages" not in t and "slow_by_gen_stage" not in t
    assert t["gen_results_s"] == [1.0]


def test_a_variants_generation_settings_go_into_the_generation_section() -> None:
    (variant,) = parse_variants("5:off+generation.vae_batch_sizes=[1]+generation.backend=torch"
                                "+batch.max_delay_ms=2", "5")
    out = worker_overrides({"model.backend": "torch"}, variant,
                           {"random_weights": "sd15", "vae_batch_sizes": [1, 2, 4]})
    assert json.loads(out.pop("generation")) == {"random_weights": "sd15",
                                                 "vae_batch_sizes": [1], "backend": "torch"}
    assert out["processing.gpu_yield_ms"] == "5.0" and out["processing.gpu_priority"] == "false"
    assert out["batch.max_delay_ms"] == "2" and out["model.backend"] == "torch"
    assert not any(k.startswith("generation.") for k in out)


def test_full_load_keeps_two_batches_of_one_image_jobs_outstanding() -> None:
    assert full_load({}) == 32  # the default budget, 16 images a batch
    assert full_load({"max_images_per_batch": 4}) == 8
