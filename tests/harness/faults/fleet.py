"""A fleet of `trt-worker run` processes (kill -9, SIGTERM, restart with the same instance id)
and what their JSON logs say (events, why one exited, its final totals)."""

from __future__ import annotations

import collections
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.harness.workers import WorkerProcess, worker_env
from worker.config import WorkerConfig

# --- worker fleet -------------------------------------------------------------------------------


class Fleet:
    """`trt-worker run` processes by instance id; restarts reuse the id (as a StatefulSet does).

    Use as a context manager: every process still running at exit is killed, so a failing test
    never leaks a worker.
    """

    def __init__(self, cfg: WorkerConfig, log_dir: Path, **env: str) -> None:
        self.cfg, self.log_dir, self.env = cfg, log_dir, env
        self.procs: dict[str, WorkerProcess] = {}  # the latest process of each instance
        self.every: list[WorkerProcess] = []
        self.stopped: set[str] = set()  # instances stopped on purpose (SIGTERM)
        self._helpers: list[Any] = []  # feeders and watchers to halt on the way out
        self.starts: collections.Counter[str] = collections.Counter()
        self.exit_codes: list[tuple[str, int]] = []

    def start(self, instance: str, **env: str) -> WorkerProcess:
        self.starts[instance] += 1
        self.stopped.discard(instance)
        full = worker_env(self.cfg, KTW_KAFKA__INSTANCE_ID=instance, **{**self.env, **env})
        proc = WorkerProcess(full, self.log_dir / f"{instance}-{self.starts[instance]}.log")
        self.procs[instance] = proc
        self.every.append(proc)
        return proc

    def kill9(self, instance: str) -> None:
        self.procs[instance].kill9()

    def terminate(self, instance: str, timeout: float = 90.0) -> int:
        proc = self.procs[instance]
        self.stopped.add(instance)
        proc.terminate()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.dump_stacks()
            tail = proc.log_tail()
            proc.kill9()
            raise AssertionError(f"{instance} did not exit within {timeout:.0f} s of SIGTERM; "
                                 f"its log ends (stacks at SIGUSR1):\n{tail}") from None
        self.exit_codes.append((instance, code))
        return code

    def assigned(self, instance: str) -> bool:
        return "partitions_assigned" in self.procs[instance].log_text()

    def wait_assigned(self, instance: str, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        proc = self.procs[instance]
        while time.monotonic() < deadline:
            if self.assigned(instance):
                return True
            if proc.proc.poll() is not None:
                raise AssertionError(f"{instance} exited {proc.proc.returncode}:\n"
                                     + proc.log_text()[-3000:])
            time.sleep(0.1)
        return False

    def alive(self) -> Iterator[str]:
        return (i for i, p in self.procs.items() if p.proc.poll() is None)

    def all_alive(self) -> bool:
        """Every instance not stopped on purpose is running (waits stop early if one died)."""
        return all(p.proc.poll() is None for i, p in self.procs.items() if i not in self.stopped)

    def own(self, *helpers: Any) -> None:
        """Threads (Feeder, TopicWatcher) halted on exit, so a failing run leaks nothing."""
        self._helpers.extend(helpers)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        for helper in self._helpers:
            helper.halt()
        for proc in self.every:
            if proc.proc.poll() is None:
                proc.kill9()



def log_records(text: str) -> Iterator[dict[str, Any]]:
    """The structured lines of a worker's JSON log, parsed (other lines skipped)."""
    import json

    for line in text.splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                continue


def log_events(text: str) -> collections.Counter[str]:
    """How often each structured event occurs in a worker's JSON log."""
    return collections.Counter(record.get("event", "?") for record in log_records(text))


# What a worker's log says when it stopped badly: its own failure events, a Python traceback's
# last line, or faulthandler's "Timeout" header (a drain that outlived shutdown_timeout_s).
_EXIT_CLUES = re.compile(r'"event": "(worker_failed|shutdown_failed|consumer_close_failed)"'
                         r'|^Timeout \(|^\w+(Error|Exception)\b')


def exit_reason(text: str) -> str:
    """One line saying why a worker exited non-zero, for the first line of a test's failure
    message (CI shows little more than that line)."""
    clues = [line for line in text.splitlines() if _EXIT_CLUES.search(line)]
    return clues[-1][:400] if clues else "no failure event in its log"


def stopped_totals(text: str) -> dict[str, Any]:
    """The counters of a worker's final ``worker_stopped`` line ({} if it never got there)."""
    import json

    for line in reversed(text.splitlines()):
        if line.startswith("{") and '"worker_stopped"' in line:
            return dict(json.loads(line))
    return {}
