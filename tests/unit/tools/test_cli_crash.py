"""The trt-worker command prints the Python stack when the process dies in native code."""

from __future__ import annotations

import subprocess
import sys

# `trt-worker` with a command that dies in native code (a null read through ctypes), the way a
# GPU library or torch's package loader crashed the worker on the H200.
_CRASH = """
import ctypes, sys
from worker.tools import cli

@cli.app.command("crash-for-test")
def crash() -> None:
    ctypes.string_at(0)

sys.argv = ["trt-worker", "crash-for-test"]
cli.main()
"""


def test_a_native_crash_prints_the_python_stack() -> None:
    proc = subprocess.run([sys.executable, "-c", _CRASH], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode != 0
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "in crash" in proc.stderr  # the frame that crashed, by name
