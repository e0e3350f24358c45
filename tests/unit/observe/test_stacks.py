"""``kill -USR1`` prints every thread's stack, named, and the process runs on
(worker/observe/stacks.py, installed by worker/tools/cli.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from worker.observe.stacks import format_stacks

ROOT = Path(__file__).resolve().parents[3]
HOLD_S = 6.0

# A process set up as `trt-worker run` sets itself up (the same install function), with a named
# thread parked, and its main thread blocked inside a C call that does not return to Python on
# a signal (a mutex another thread holds for HOLD_S): a Python-level handler could not run
# there until the call returned.
CHILD = f"""
import ctypes, threading, time
from worker.tools.cli import _install_stop_handlers

stop = threading.Event()
def parked_in_a_named_thread():
    stop.wait()
threading.Thread(target=parked_in_a_named_thread, name="parked-helper", daemon=True).start()
_install_stop_handlers(stop.set, 60.0)

libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # (zeroed: a default pthread mutex)
held = threading.Event()
def hold_the_mutex():
    libc.pthread_mutex_lock(mutex)
    held.set()
    time.sleep({HOLD_S})
    libc.pthread_mutex_unlock(mutex)
threading.Thread(target=hold_the_mutex, name="mutex-holder", daemon=True).start()
held.wait()
print("blocking", flush=True)
libc.pthread_mutex_lock(mutex)  # blocked_in_c
libc.pthread_mutex_unlock(mutex)
print("unblocked", flush=True)
while not stop.is_set():
    time.sleep(0.05)
"""


def _wait_for(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_usr1_prints_every_named_thread_at_once_and_the_process_runs_on(tmp_path: Path
                                                                         ) -> None:
    err_path, out_path = tmp_path / "stderr", tmp_path / "stdout"
    script = tmp_path / "child.py"  # (a file: the stacks show its source lines)
    script.write_text(CHILD)
    with err_path.open("w") as err, out_path.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=err,
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert _wait_for(lambda: "blocking" in out_path.read_text(), 30), \
            err_path.read_text()[-2000:]
        time.sleep(0.3)  # the main thread is in the C call now
        sent = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        assert _wait_for(lambda: "parked_in_a_named_thread" in err_path.read_text(), 3.0), \
            f"no stacks within 3 s of SIGUSR1:\n{err_path.read_text()[-3000:]}"
        took = time.monotonic() - sent
        dump = err_path.read_text()
        assert "unblocked" not in out_path.read_text() and took < HOLD_S - 1, \
            "the dump waited for the main thread to come back to Python"
        assert "Stacks at SIGUSR1" in dump
        assert 'Thread 0x' in dump and '"parked-helper" daemon' in dump
        assert '"mutex-holder" daemon' in dump
        assert 'Current thread 0x' in dump and '"MainThread"' in dump and "blocked_in_c" in dump

        # It runs on: the main thread goes on once the mutex is free, and a second signal
        # prints again.
        assert _wait_for(lambda: "unblocked" in out_path.read_text(), HOLD_S + 10)
        assert proc.poll() is None
        proc.send_signal(signal.SIGUSR1)
        assert _wait_for(lambda: err_path.read_text().count("Stacks at SIGUSR1") == 2, 5.0), \
            err_path.read_text()[-3000:]
        assert proc.poll() is None
        proc.terminate()  # (the stop handler: the main loop ends, exit 0)
        assert proc.wait(20) == 0, err_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_format_stacks_names_each_thread_and_leaves_out_its_caller() -> None:
    release = threading.Event()

    def waiting_for_release() -> None:
        release.wait(10)

    t = threading.Thread(target=waiting_for_release, name="named-waiter", daemon=True)
    t.start()
    try:
        text = format_stacks("Title")
    finally:
        release.set()
        t.join(5)
    assert text.startswith("Title (pid ")
    assert f'Thread 0x{t.ident:016x} "named-waiter" daemon (most recent call first):' in text
    assert "in waiting_for_release" in text and "release.wait(10)" in text
    assert f"0x{threading.get_ident():016x}" not in text, "the caller's own stack is noise"
    assert "Current thread" not in text


def test_a_shutdown_past_its_timeout_prints_the_stacks_and_exits_1(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        "import threading, time\n"
        "from worker.tools.cli import _install_stop_handlers\n"
        "_install_stop_handlers(lambda: None, 0.5)  # a stop that never finishes\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.05)  # draining_forever\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, err[-3000:]
    # The header log readers look for (tests/harness/faults/fleet.py), then the stacks.
    assert "Timeout (0:00:00.500000)!\n" in err
    assert "most recent call first" in err and '"MainThread"' in err
    assert "draining_forever" in err
