"""MpsDaemon: starts the control daemon with private pipe and log folders, checks it listens,
hands those folders on, quits it and removes them; a missing or failing daemon is a one-line
ConfigError. The real daemon needs an NVIDIA driver (tests/gpu/test_mps_gpu.py); here a stand-in
program on PATH records how it was called."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from worker.exceptions import ConfigError
from worker.tools.mps import CONTROL, OWNER, PREFIX, MpsDaemon

# Appends {argv, stdin, pipe dir, visible GPUs} per call to $MPS_CALLS; exits MPS_FAIL's code on
# "-d"; with MPS_MUTE set, fails every get_server_list (a daemon that started but does not answer).
STAND_IN = f"""#!{sys.executable}
import json, os, sys
stdin = "" if "-d" in sys.argv else sys.stdin.read()
with open(os.environ["MPS_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": stdin,
                         "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                         "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
if "get_server_list" in stdin and os.environ.get("MPS_MUTE"):
    sys.exit(5)
if "-d" in sys.argv and os.environ.get("MPS_FAIL"):
    sys.stderr.write("An instance of this daemon is already running\\n")
    sys.exit(int(os.environ["MPS_FAIL"]))
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / CONTROL
    prog.write_text(STAND_IN)
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("MPS_CALLS", str(calls))
    # The daemons' folders in a temporary directory of the test's own: another run's folders
    # in the real one must not meet this test's orphan reaping.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return calls


def _calls(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_start_hands_on_private_folders_and_stop_quits(stand_in: Path) -> None:
    daemon = MpsDaemon()
    with daemon as env:
        pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        assert pipe.is_dir() and Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert pipe.parent.name.startswith(PREFIX)
        assert (pipe.parent / OWNER).read_text() == str(os.getpid())
    assert not pipe.parent.exists()
    assert [(c["argv"], c["stdin"], c["pipe"]) for c in _calls(stand_in)] == [
        (["-d"], "", str(pipe)), ([], "get_server_list\n", str(pipe)), ([], "quit\n", str(pipe))]


def test_a_daemon_that_does_not_start_is_a_config_error(stand_in: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPS_FAIL", "1")
    daemon = MpsDaemon()
    with pytest.raises(ConfigError, match=r"did not start \(exit 1\): An instance of this daemon"):
        daemon.start()
    assert daemon.root is None
    assert len(_calls(stand_in)) == 1  # never asked to quit what did not start


def test_no_daemon_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=f"{CONTROL} not found"):
        MpsDaemon().start()


def test_the_daemon_sees_exactly_the_gpus_in_use(stand_in: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    with MpsDaemon(["3", "5"]) as env:
        assert "CUDA_VISIBLE_DEVICES" not in env  # each child gets its own position
    started, *rest = _calls(stand_in)
    assert started["argv"] == ["-d"] and started["visible"] == "3,5"
    assert all(c["visible"] == "3,5,6" for c in rest)  # the commands: this process's own


def test_run_gives_each_child_its_position_under_the_daemon(
        stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`trt-worker run --gpus all --mps`: the daemon gets the GPUs' ids, the children their
    positions (the MPS server renumbers from 0) and the daemon's folders."""
    from typer.testing import CliRunner

    import worker.tools.gpus as gpus
    from worker.tools.cli import app

    seen: dict[str, object] = {}

    def supervise(cfg: object, devices: list[str], argv: list[str], per_gpu: int = 1,
                  env: dict[str, str] | None = None) -> int:
        seen.update(devices=devices, per_gpu=per_gpu, env=env, argv=argv)
        return 0

    monkeypatch.setattr(gpus, "supervise", supervise)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    result = CliRunner().invoke(app, ["run", "-b", "127.0.0.1:9", "--gpus", "all",
                                      "--procs-per-gpu", "2", "--mps"])
    assert result.exit_code == 0, result.output
    assert seen["devices"] == ["0", "1"] and seen["per_gpu"] == 2
    env = seen["env"]
    assert isinstance(env, dict) and "CUDA_MPS_PIPE_DIRECTORY" in env
    assert "--mps" not in seen["argv"]  # type: ignore[operator]
    assert _calls(stand_in)[0]["visible"] == "3,5"


def test_a_daemon_that_does_not_answer_is_quit_and_reported(
        stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPS_MUTE", "1")
    daemon = MpsDaemon()
    with pytest.raises(ConfigError, match=r"does not answer \(exit 5\)"):
        daemon.start()
    assert daemon.root is None
    assert [c["stdin"] for c in _calls(stand_in)] == ["", "get_server_list\n", "quit\n"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _earlier_folder(name: str, owner: int | None) -> Path:
    root = Path(tempfile.gettempdir()) / f"{PREFIX}{name}"
    (root / "pipe").mkdir(parents=True)
    (root / "log").mkdir()
    if owner is not None:
        (root / OWNER).write_text(str(owner))
    return root


def test_a_start_quits_the_daemons_of_supervisors_that_died(stand_in: Path) -> None:
    """A supervisor killed outright never quit its daemon: the next start does, and removes
    its folder; daemons of live supervisors, and folders without an owner, are left alone."""
    orphan = _earlier_folder("orphan", _dead_pid())
    alive = _earlier_folder("alive", os.getppid())
    ownerless = _earlier_folder("ownerless", None)
    daemon = MpsDaemon()
    env = daemon.start()
    daemon.stop()
    assert not orphan.exists() and alive.is_dir() and ownerless.is_dir()
    calls = [(c["argv"], c["stdin"], c["pipe"]) for c in _calls(stand_in)]
    assert calls[0] == ([], "quit\n", str(orphan / "pipe"))
    assert [c[2] for c in calls[1:]] == [env["CUDA_MPS_PIPE_DIRECTORY"]] * 3
