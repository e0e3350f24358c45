"""`trt-worker demo --task generation` (its function) against the real broker, on this machine's
defaults: with only the brokers and topics configured, the worker resolves its device (the CPU
without CUDA, warm-up by first use), answers both demo jobs well inside a minute and the PNGs
land in the output folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from tests.harness.workers import fresh_topics, worker_config
from worker.tools.demo_generation import PROMPTS, TINY_SIDE, run_generation_demo

MISSING = [m for m in ("torch", "tokenizers", "safetensors") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(MISSING), reason=f"needs the gen extra ({', '.join(MISSING)} "
                                             "missing): pip install 'kafka-trt-worker[gen]'"),
]

# "Well under a minute" from the jobs' send to the last answer: 2 jobs of 20 steps at 256x256
# took ~6 s on the 2-core VM; a worker warming every shape first (or 512x512 jobs) takes minutes.
ANSWER_BUDGET_S = 30.0


def test_generation_demo_answers_its_jobs_on_the_default_device(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    # Nothing about the device, warm-up, sizes or weights: the demo's and the machine's defaults.
    cfg = worker_config(
        kafka_bootstrap, topics, engines={"cache_dir": str(tmp_path / "engines")},
        generation={"topics": {"jobs": topics.jobs, "results": topics.results,
                               "dlq": topics.dlq},
                    "blob": {"local_dir": str(tmp_path / "blobs")}},
        metrics={"port": 0})
    out = tmp_path / "images"
    console = Console(record=True, width=200)
    run = run_generation_demo(cfg, out_dir=out, timeout_s=120, console=console)

    assert run.ok, console.export_text()
    assert run.answer_s < ANSWER_BUDGET_S, console.export_text()
    if not run.device.startswith("cuda"):
        assert run.warm_up == "first_use"
    results = [run.answers.results[i] for i in run.ids]
    assert len(results) == len(PROMPTS)
    assert all(r["random_weights"] for r in results)
    files = sorted(out.glob("*.png"))
    assert len(files) == len(PROMPTS)
    for f in files:
        with Image.open(f) as im:
            assert im.size == (TINY_SIDE, TINY_SIDE)
    assert str(out) in console.export_text()
