"""`trt-worker run --gpus`: one child per GPU with its own device, instance id and port,
SIGTERM passed on to all, and one child's failure stopping the rest."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from worker.config import load_config
from worker.exceptions import ConfigError
from worker.tools.gpus import child_argv, supervise, visible_gpus

# A stand-in worker: records what it was given, then runs until SIGTERM (exit 0) or exits
# with the code in FAIL_WITH when its device is the one named there.
CHILD = """
import json, os, signal, sys, time
out = os.path.join(sys.argv[1], os.environ["KTW_KAFKA__INSTANCE_ID"] + ".json")
keys = ("CUDA_VISIBLE_DEVICES", "KTW_KAFKA__INSTANCE_ID", "KTW_METRICS__PORT")
with open(out, "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
fail = os.environ.get("FAIL_WITH", "")
if fail and fail.split(":")[0] == os.environ["CUDA_VISIBLE_DEVICES"]:
    sys.exit(int(fail.split(":")[1]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.05)
"""


def test_devices_from_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus("all") == ["3", "5"]
    assert visible_gpus("1") == ["3"]
    with pytest.raises(ConfigError, match="only 2 GPU"):
        visible_gpus("3")
    with pytest.raises(ConfigError, match="count or 'all'"):
        visible_gpus("two")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match="no GPU found"):
        visible_gpus("all")


def test_child_argv_drops_only_the_supervisor_options() -> None:
    argv = ["/bin/trt-worker", "run", "--gpus", "all", "-c", "w.toml", "--gpus=2", "-b", "k:9",
            "--procs-per-gpu", "2", "--procs-per-gpu=3", "--mps"]
    assert child_argv(argv) == [sys.executable, "-m", "worker", "run", "-c", "w.toml",
                                "-b", "k:9"]


def _wait_for(folder: Path, n: int) -> None:
    deadline = time.monotonic() + 20
    while len(list(folder.glob("*.json"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def test_each_child_gets_its_gpu_id_and_port_and_sigterm_stops_all(tmp_path: Path) -> None:
    cfg = load_config(None, kafka={"instance_id": "pod-3"}, metrics={"port": 9500})

    def stop_when_started() -> None:
        _wait_for(tmp_path, 2)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's handler passes it on

    threading.Thread(target=stop_when_started, daemon=True).start()
    code = supervise(cfg, ["0", "1"], [sys.executable, "-c", CHILD, str(tmp_path)])
    assert code == 0
    seen = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")),
                  key=lambda e: e["CUDA_VISIBLE_DEVICES"])
    assert seen == [
        {"CUDA_VISIBLE_DEVICES": "0", "KTW_KAFKA__INSTANCE_ID": "pod-3-gpu0",
         "KTW_METRICS__PORT": "9500"},
        {"CUDA_VISIBLE_DEVICES": "1", "KTW_KAFKA__INSTANCE_ID": "pod-3-gpu1",
         "KTW_METRICS__PORT": "9501"},
    ]


def test_one_child_failing_stops_the_others_and_gives_its_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIL_WITH", "1:3")
    cfg = load_config(None, kafka={"instance_id": "h"})
    t0 = time.monotonic()
    code = supervise(cfg, ["0", "1"], [sys.executable, "-c", CHILD, str(tmp_path)])
    assert code == 3
    assert time.monotonic() - t0 < 20  # device 0 was stopped, not waited for


def test_several_processes_per_gpu_get_their_own_ids_and_ports(tmp_path: Path) -> None:
    cfg = load_config(None, kafka={"instance_id": "pod-3"}, metrics={"port": 9500})

    def stop_when_started() -> None:
        _wait_for(tmp_path, 4)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_started, daemon=True).start()
    code = supervise(cfg, ["4", "7"], [sys.executable, "-c", CHILD, str(tmp_path)], per_gpu=2)
    assert code == 0
    seen = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")),
                  key=lambda e: e["KTW_METRICS__PORT"])
    assert [(e["CUDA_VISIBLE_DEVICES"], e["KTW_KAFKA__INSTANCE_ID"], e["KTW_METRICS__PORT"])
            for e in seen] == [("4", "pod-3-gpu0-0", "9500"), ("4", "pod-3-gpu0-1", "9501"),
                               ("7", "pod-3-gpu1-0", "9502"), ("7", "pod-3-gpu1-1", "9503")]


def test_procs_per_gpu_needs_gpus_and_a_positive_count() -> None:
    from typer.testing import CliRunner

    from worker.tools.cli import app

    result = CliRunner().invoke(app, ["run", "-b", "127.0.0.1:9", "--procs-per-gpu", "2"])
    assert result.exit_code != 0
    assert "--procs-per-gpu and --mps need --gpus" in str(result.exception) + result.output
    result = CliRunner().invoke(app, ["run", "-b", "127.0.0.1:9", "--mps"])
    assert result.exit_code != 0
    assert "need --gpus" in str(result.exception) + result.output
    with pytest.raises(ConfigError, match="at least 1"):
        supervise(load_config(None), ["0"], [sys.executable, "-c", "pass"], per_gpu=0)
    with pytest.raises(ConfigError, match="no room for 4 processes"):
        supervise(load_config(None, metrics={"port": 65533}), ["0", "1"],
                  [sys.executable, "-c", "pass"], per_gpu=2)


def test_children_get_the_extra_environment(tmp_path: Path) -> None:
    """What --mps hands the children: the daemon's pipe and log folders."""
    child = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in "
             "('CUDA_MPS_PIPE_DIRECTORY', 'CUDA_VISIBLE_DEVICES')}, "
             "open(os.path.join(sys.argv[1], os.environ['CUDA_VISIBLE_DEVICES'] + '.json'), 'w'))")
    cfg = load_config(None, kafka={"instance_id": "h"})
    code = supervise(cfg, ["0", "1"], [sys.executable, "-c", child, str(tmp_path)],
                     env={"CUDA_MPS_PIPE_DIRECTORY": "/run/mps-pipe"})
    assert code == 0
    seen = sorted(json.loads(p.read_text())["CUDA_MPS_PIPE_DIRECTORY"]
                  for p in tmp_path.glob("*.json"))
    assert seen == ["/run/mps-pipe", "/run/mps-pipe"]
