"""Every thread's Python stack, on ``kill -USR1 <pid>`` (the worker runs on) and when a shutdown
outlasts its timeout (worker/tools/cli.py).

The stacks are read by a regular Python thread holding the GIL, from
:func:`sys._current_frames`, and each is copied before anything is formatted (formatting reads
source lines, and file reads let other threads run). Never by faulthandler from a signal: its
dump walks other threads' frames without the GIL, and in CI it crashed a worker (exit -11) on
the frame of a decode thread that was still running.

How the signal reaches that thread: the signal's Python-level handler does nothing; the
interpreter's own C-level handler writes the signal's number to a wake-up pipe
(:func:`signal.set_wakeup_fd`) the moment it arrives, whatever the main thread is doing, even
blocked in a C call that never returns to Python (where a Python-level handler would never
run). A daemon thread, "stack-dump", waits on the pipe and prints. Where something else already
holds the process's wake-up fd, the Python-level handler writes to the pipe instead (it then
runs only once the main thread runs Python again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import TextIO

_installed: set[int] = set()


def format_stacks(title: str, current: int | None = None) -> str:
    """Every thread's stack, most recent call first as faulthandler prints them, each headed by
    the thread's name; ``current`` (a thread ident) is headed "Current thread". The calling
    thread's own stack is left out unless it is ``current``."""
    me = threading.get_ident()
    frames = sys._current_frames()
    named = {t.ident: t for t in threading.enumerate()}
    taken = [(ident, traceback.StackSummary.extract(traceback.walk_stack(frame),
                                                    lookup_lines=False))
             for ident, frame in frames.items() if ident != me or ident == current]
    del frames  # (frames of finished calls are not kept alive past this)
    out = [f"{title} (pid {os.getpid()}, {len(taken)} threads)\n"]
    for ident, stack in sorted(taken, key=lambda x: x[0] == current):
        thread = named.get(ident)
        name = f'"{thread.name}"{" daemon" if thread.daemon else ""}' if thread else "(unnamed)"
        head = "Current thread" if ident == current else "Thread"
        out.append(f"\n{head} 0x{ident:016x} {name} (most recent call first):\n")
        out.extend(stack.format())
    return "".join(out)


def write_stacks(title: str, current: int | None = None, stream: TextIO | None = None) -> None:
    """:func:`format_stacks` onto ``stream`` (stderr), in one write, flushed."""
    out = stream if stream is not None else sys.stderr
    if out is None:  # (no stderr at all: nowhere to say it)
        return
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr
        out.write(format_stacks(title, current))
        out.flush()


def install_stack_dump(signum: int = signal.SIGUSR1) -> None:
    """From now on ``signum`` prints every thread's stack to stderr and the process runs on.
    Call from the main thread (Python's rule for signal handlers); a second call is a no-op."""
    if signum in _installed:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C-level handler must never block
    main = threading.main_thread().ident

    def wait_and_dump() -> None:
        while True:
            try:
                got = os.read(read_end, 512)
            except OSError:
                return
            if not got:
                return
            if signum not in got:  # (the pipe also carries the other signals' numbers)
                continue
            try:
                write_stacks(f"Stacks at {signal.Signals(signum).name}", current=main)
            except Exception as exc:  # noqa: BLE001 - the next signal must still be answered
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"stack dump failed: {type(exc).__name__}: {exc}\n")

    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    takes_wakeup = previous == -1
    if not takes_wakeup:  # someone else's: leave theirs in place
        signal.set_wakeup_fd(previous)

    def handler(number: int, frame: FrameType | None) -> None:
        if not takes_wakeup:
            with contextlib.suppress(OSError):  # a full pipe: a dump is pending anyway
                os.write(write_end, bytes([number]))

    threading.Thread(target=wait_and_dump, name="stack-dump", daemon=True).start()
    signal.signal(signum, handler)
    _installed.add(signum)
