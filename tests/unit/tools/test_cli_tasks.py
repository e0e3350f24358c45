"""`trt-worker run --task moderation,generation` as a process, its loops faked: SIGTERM stops
(drains) both, exit 0; one failing stops the other and the exit (2) names the failed task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# The command with build_workers handing it fake loops that print what happens to them.
_RUN = """
import sys, threading, time
from worker.loop import build
from worker.observe import attach
from worker.tools import cli

said = threading.Lock()

def say(line):  # (one line at a time: the loops print from two threads)
    with said:
        sys.stdout.write(line + chr(10))
        sys.stdout.flush()

class Loop:
    def __init__(self, name, fail):
        self.name, self.fail, self.stopped = name, fail, threading.Event()
    def run(self):
        say(self.name + " started")
        if self.fail:
            time.sleep(0.3)
            raise RuntimeError("sticky CUDA error")
        self.stopped.wait(60)
        if self.name == hanging:  # a drain that never ends
            time.sleep(60)
        say(self.name + " drained")
    def stop(self):
        self.stopped.set()

failing, hanging = sys.argv[1], sys.argv[2]
build.build_workers = lambda cfg: {n: Loop(n, n == failing) for n in cfg.processing.tasks}
attach.observe_all = lambda workers: None
sys.argv = ["trt-worker", "run", "--task", "moderation,generation", "-b", "127.0.0.1:9"]
cli.main()
"""


def _start(failing: str, hanging: str = "", **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _RUN, failing, hanging],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def test_sigterm_stops_and_drains_both_loops() -> None:
    proc = _start(failing="")
    assert proc.stdout is not None
    seen = {proc.stdout.readline().strip() for _ in range(2)}
    assert seen == {"moderation started", "generation started"}
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert set(out.split("\n")) >= {"moderation drained", "generation drained"}


def test_a_failing_loop_stops_the_other_and_the_exit_names_it() -> None:
    proc = _start(failing="generation")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "moderation drained" in out
    assert "error: the generation loop failed: RuntimeError: sticky CUDA error" in err


def test_the_drain_after_a_failure_is_bounded_by_the_shutdown_timeout() -> None:
    proc = _start(failing="generation", hanging="moderation",
                  KTW_COMMIT__DRAIN_TIMEOUT_S="0.5", KTW_COMMIT__SHUTDOWN_TIMEOUT_S="1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Stacks at the shutdown timeout" in err and "moderation drained" not in out
