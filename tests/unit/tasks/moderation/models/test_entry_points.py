"""A model outside the worker's folder is known through an entry point alone: an installed
distribution naming its ModelPackage record in ``kafka_trt_worker.moderation_models``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness.plugins import TINY, write_plugin_dist

REPO = Path(__file__).resolve().parents[5]

# A fresh interpreter: what a `trt-worker` process sees at start-up with the distribution
# installed (the entry points are read when the models registry is imported).
PROBE = """
import json
from worker.config import load_config
from worker.tasks.moderation import models
cfg = load_config(None, moderation={"policies": {"shade": {
    "models": ["tiny"], "labels": {"bright": {"review": 0.3, "block": 0.6}}}}})
shade = cfg.moderation.policies["shade"]
print(json.dumps({"models": list(models.MODELS), "policy": shade.models}))
"""


def _run(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(REPO)])}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, text=True,
                          capture_output=True, timeout=120)


def test_an_entry_point_makes_a_model_known_to_the_registry_and_the_config(
    tmp_path: Path
) -> None:
    done = _run(write_plugin_dist(tmp_path, TINY))
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"models": ["open_nsfw", "text", "clip", "tiny"]' in done.stdout
    assert '"policy": ["tiny"]' in done.stdout


def test_without_the_distribution_the_model_is_unknown(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode != 0
    assert "tiny" in done.stderr


def test_a_plug_in_that_fails_to_load_is_named(tmp_path: Path) -> None:
    done = _run(write_plugin_dist(tmp_path, {"broken": "no_such_module.anywhere:PACKAGE"}))
    assert done.returncode != 0
    assert "moderation model plug-in 'broken' (no_such_module.anywhere:PACKAGE) failed" \
        in done.stderr


def test_an_entry_point_naming_something_else_is_refused(tmp_path: Path) -> None:
    done = _run(write_plugin_dist(tmp_path, {"tiny": "tests.unit.tasks.moderation.tiny_model:"
                                                     "__doc__"}))
    assert done.returncode != 0
    assert "is not a ModelPackage named 'tiny'" in done.stderr
