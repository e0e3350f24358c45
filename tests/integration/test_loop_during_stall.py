"""The worker loop keeps stepping while the broker is frozen (at-least-once).

The steady loop commits offsets asynchronously. It used to commit synchronously, and a commit
sent just before the broker froze held the loop (and every batch behind it) until the broker
answered again: in the 30 s stall test a batch of one job "took" 30 s. Now the loop goes on
consuming what was prefetched, computing, and serving callbacks; the commit's outcome arrives
later through ``on_commit``. Revoke and shutdown still commit synchronously.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.faults import Feeder, TopicWatcher, stall_after
from tests.integration.support import fresh_topics, worker_config
from worker.local_kafka import LocalKafka
from worker.service import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PAUSE_S = 4.0  # below the 6 s session timeout: the member stays in the group


@pytest.mark.timeout(240)
def test_loop_keeps_stepping_while_the_broker_is_frozen(local_kafka: LocalKafka) -> None:
    bootstrap = local_kafka.bootstrap_servers
    topics = fresh_topics(bootstrap, 3)
    cfg = worker_config(bootstrap, topics, commit={"interval_ms": 300},
                        batch={"max_batch_size": 4})
    worker = Worker(cfg)
    steps: list[tuple[float, float]] = []  # (start, end) of every loop step
    real_step = worker.step

    def timed_step() -> None:
        t0 = time.monotonic()
        try:
            real_step()
        finally:
            steps.append((t0, time.monotonic()))

    worker.step = timed_step  # type: ignore[method-assign]
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the test thread
            failure.append(exc)

    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=20.0, prefix="ls-")
    watcher = TopicWatcher(bootstrap, topics.results)
    thread = threading.Thread(target=run, name="worker", daemon=True)
    thread.start()
    try:
        feeder.start()
        watcher.start()
        # Results just delivered when the broker freezes: a commit is due within an interval.
        t_pause, t_resume = stall_after(local_kafka, watcher, results=40, stall_s=PAUSE_S,
                                        timeout=90, failed=lambda: failure)
        feeder.stop()
        assert watcher.wait_for(set(feeder.good), 90), "jobs left unanswered after the stall"
    finally:
        feeder.halt()
        watcher.stop()
        worker.stop()
        thread.join(60)
    assert not thread.is_alive(), "worker did not stop"
    if failure:
        raise failure[0]
    # A commit was due within one interval of the freeze (results had just been delivered); a
    # synchronous one would have held a single step across the rest of the pause.
    window = (t_pause + 1.0, t_resume - 0.2)
    inside = [s for s in steps if s[0] >= window[0] and s[1] <= window[1]]
    longest = max((end - start for start, end in steps if end > t_pause and start < t_resume),
                  default=0.0)
    assert len(inside) >= 10, (len(inside), round(longest, 2))
    assert longest < PAUSE_S / 2, round(longest, 2)
