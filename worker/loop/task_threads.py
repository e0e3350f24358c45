"""Several task loops in one process (``processing.task = "moderation,generation"``), each on a
thread of its own, one CUDA context and one process's warm engines between them.

The calling thread (the main one: it takes the signals) waits. :meth:`TaskThreads.stop`
stops every loop; each drains and commits what it finished, as a single loop does on
SIGTERM. A loop that fails stops the others the same way (they have done nothing wrong:
their finished work is committed, not redone by the next owner), and :meth:`TaskThreads.run`
then raises :class:`~worker.exceptions.TaskLoopFailed` naming the task that failed first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from worker.exceptions import TaskLoopFailed

log = structlog.get_logger("worker")
# How often the waiting thread looks up from its wait (signal handlers run in between).
WAKE_S = 0.2


class Loop(Protocol):
    """What is asked of a loop (worker.loop.worker.Worker)."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


class TaskThreads:
    def __init__(self, loops: Mapping[str, Loop],
                 on_own_stop: Callable[[], None] | None = None) -> None:
        """``on_own_stop``: called when a loop ended unasked and the others are stopped for
        it (the command line bounds their drain with the shutdown timeout, as after a
        SIGTERM)."""
        self.loops = dict(loops)
        self._on_own_stop = on_own_stop
        self._asked = False  # stop() was called (a signal, or the caller)
        self._lock = threading.Lock()
        self._ended = threading.Event()  # a loop's thread ended (set again by each)
        self._failed: list[tuple[str, BaseException]] = []  # in the order they failed
        self._threads = {name: threading.Thread(target=self._serve, args=(name, loop),
                                                name=f"loop-{name}", daemon=True)
                         for name, loop in self.loops.items()}

    def stop(self) -> None:
        """Every loop drains and exits (safe from signal handlers and other threads)."""
        self._asked = True
        for loop in self.loops.values():
            loop.stop()

    def run(self) -> None:
        """Serve until every loop ended; raise TaskLoopFailed if one failed."""
        for thread in self._threads.values():
            thread.start()
        stopping = False
        while any(t.is_alive() for t in self._threads.values()):
            self._ended.wait(WAKE_S)
            self._ended.clear()
            if not stopping and any(not t.is_alive() for t in self._threads.values()):
                # One loop ended (failed, or stopped on its own): the process ends, so the
                # others finish and commit their work now rather than be killed mid-batch.
                stopping = True
                if not self._asked:
                    log.warning("task_loops_stopping",
                                ended=[n for n, t in self._threads.items() if not t.is_alive()],
                                failed=[name for name, _ in self._failed])
                    if self._on_own_stop is not None:
                        self._on_own_stop()
                self.stop()
        if self._failed:
            task, error = self._failed[0]
            raise TaskLoopFailed(task, error) from error

    def _serve(self, name: str, loop: Loop) -> None:
        try:
            loop.run()
        except BaseException as exc:  # noqa: BLE001 - raised again by run(), naming the task
            with self._lock:
                self._failed.append((name, exc))
        finally:
            self._ended.set()
