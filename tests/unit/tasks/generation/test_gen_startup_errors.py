"""A generation worker this machine cannot run stops with one line naming the setting to change
and exit code 2, like every configuration error of `trt-worker run`, never with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines.exceptions import BackendUnavailable
from worker.config.generation import GenerationSettings
from worker.exceptions import ConfigError
from worker.tasks.generation.blobs import LocalBlobStore
from worker.tasks.generation.task import GenerationTask


class _Unloadable:
    """Engines whose backend cannot load here (what the torch runner raises without CUDA)."""

    def __init__(self) -> None:
        self.runners: dict[str, object] = {}
        self.model_id = "fake"

    def activate(self) -> None:
        raise BackendUnavailable("torch backend needs CUDA; none is available")

    def deactivate(self) -> None:
        """Never activated: nothing to release."""


def test_a_backend_that_cannot_load_at_warm_up_is_a_config_error() -> None:
    task = GenerationTask(GenerationSettings(random_weights="tiny", device="cuda:0"),
                          _Unloadable(), LocalBlobStore(Path("/nonexistent")),  # type: ignore[arg-type]
                          own_engines=False)
    try:
        with pytest.raises(ConfigError) as err:
            task.warm_up()
    finally:
        task.close()
    message = str(err.value)
    assert message.startswith("generation.backend = 'torch' on generation.device = 'cuda:0' "
                              "cannot run here: torch backend needs CUDA")
    assert "\n" not in message
    assert isinstance(err.value.__cause__, BackendUnavailable)


def test_run_with_a_cuda_device_and_none_visible_exits_2_with_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the generation task needs the gen extra (torch)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KTW_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {
        "CUDA_VISIBLE_DEVICES": "",  # no GPU, whatever the machine has
        "KTW_GENERATION__RANDOM_WEIGHTS": "tiny", "KTW_GENERATION__DEVICE": "cuda",
        "KTW_ENGINES__CACHE_DIR": str(tmp_path / "engines"), "KTW_METRICS__PORT": "0",
        # No broker listens there: the device must be refused before any Kafka client.
        "KTW_KAFKA__TOPICS_WAIT_S": "5",
    }
    cmd = [sys.executable, "-c", "from worker.tools.cli import main; main()",
           "run", "--task", "generation", "--bootstrap-servers", "127.0.0.1:9"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the worker did not stop on its device setting: {exc.stderr!r}")
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out and "╭" not in out, out
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: generation.device = 'cuda' but no CUDA device is visible: set "
                     "generation.device = 'cpu' (or 'auto')"], out
