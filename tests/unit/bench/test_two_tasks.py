"""The two-task bench's variants (a yield and whether moderation's streams are urgent) and
its full generation load."""

from __future__ import annotations

import json

import pytest

from bench.generation.two_tasks import full_load, parse_variants, timeline, worker_overrides


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
    gen = SimpleNamespace(lock=threading.Lock(), results={
        "gb-1": (1001.5, None), "gb-2": (1005.0, None), "ga-1": (1001.2, None)})
    t = timeline(mod, gen, "mb-", "gb-", 1000.0, 100.0,  # type: ignore[arg-type]
                 (1001.0, 1003.0), 25.0)
    assert t["slow_mod_jobs"] == [[0.0, 30.0], [1.5, 100.0]]
    assert t["gen_results_s"] == [0.5]


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
