"""worker.loop.task_threads.TaskThreads: several loops, one thread each; stop stops all, one
failing stops (drains) the others and the failure names its task. Fake loops, no broker."""

from __future__ import annotations

import threading
import time

import pytest

from worker.exceptions import TaskLoopFailed, WorkerError
from worker.loop.task_threads import TaskThreads


class FakeLoop:
    """Runs until stopped, then 'drains' (recorded); or fails after ``fail_after_s``."""

    def __init__(self, fail_after_s: float | None = None) -> None:
        self.fail_after_s = fail_after_s
        self._stop = threading.Event()
        self.started = threading.Event()
        self.drained = False
        self.thread: str | None = None

    def run(self) -> None:
        self.thread = threading.current_thread().name
        self.started.set()
        if self.fail_after_s is not None:
            time.sleep(self.fail_after_s)
            raise RuntimeError("sticky CUDA error")
        self._stop.wait(30)
        assert self._stop.is_set()
        self.drained = True

    def stop(self) -> None:
        self._stop.set()


def _run_in_background(loops: TaskThreads) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            loops.run()
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, errors


def test_each_loop_runs_on_its_own_thread_and_stop_stops_them_all() -> None:
    a, b = FakeLoop(), FakeLoop()
    loops = TaskThreads({"moderation": a, "generation": b})
    t, errors = _run_in_background(loops)
    assert a.started.wait(5) and b.started.wait(5)
    assert {a.thread, b.thread} == {"loop-moderation", "loop-generation"}
    loops.stop()  # (what the SIGTERM handler calls)
    t.join(5)
    assert not t.is_alive() and errors == []
    assert a.drained and b.drained


def test_a_failing_loop_stops_the_other_which_drains_and_the_error_names_the_task() -> None:
    mod, gen = FakeLoop(), FakeLoop(fail_after_s=0.1)
    loops = TaskThreads({"moderation": mod, "generation": gen})
    t0 = time.monotonic()
    with pytest.raises(TaskLoopFailed, match="the generation loop failed: RuntimeError: "
                                             "sticky CUDA error") as info:
        loops.run()
    assert time.monotonic() - t0 < 5
    assert mod.drained, "the healthy loop was stopped and drained, not abandoned"
    assert info.value.task == "generation"
    assert isinstance(info.value, WorkerError)  # the CLI exits 2 with its message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_the_first_failure_is_the_one_named() -> None:
    first, second = FakeLoop(fail_after_s=0.05), FakeLoop(fail_after_s=0.5)
    with pytest.raises(TaskLoopFailed) as info:
        TaskThreads({"moderation": first, "generation": second}).run()
    assert info.value.task == "moderation"


def test_a_loop_that_ends_on_its_own_ends_the_others() -> None:
    class Quits(FakeLoop):
        def run(self) -> None:
            self.started.set()

    other = FakeLoop()
    TaskThreads({"moderation": Quits(), "generation": other}).run()
    assert other.drained


def test_the_others_stopped_for_a_failure_are_reported_once_not_for_a_signal() -> None:
    own_stops: list[int] = []
    with pytest.raises(TaskLoopFailed):
        TaskThreads({"moderation": FakeLoop(), "generation": FakeLoop(fail_after_s=0.05)},
                    on_own_stop=lambda: own_stops.append(1)).run()
    assert own_stops == [1], "a failure arms the caller's drain bound"
    asked = TaskThreads({"moderation": FakeLoop(), "generation": FakeLoop()},
                        on_own_stop=lambda: own_stops.append(2))
    threading.Timer(0.1, asked.stop).start()
    asked.run()
    assert own_stops == [1], "a stop asked for (SIGTERM) is bounded by its handler already"
