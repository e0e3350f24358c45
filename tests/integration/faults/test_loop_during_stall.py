"""The worker loop keeps stepping while the broker is frozen (at-least-once).

The steady loop commits offsets asynchronously. It used to commit synchronously, and a commit
sent just before the broker froze held the loop (and every batch behind it) until the broker
answered again: in the 30 s stall test a batch of one job "took" 30 s. Now the loop goes on
consuming what was prefetched, computing, and serving callbacks; the commit's outcome arrives
later through ``on_commit``. Revoke and shutdown still commit synchronously.
"""

from __future__ import annotations

import time

import pytest

from tests.harness.faults import Feeder, TopicWatcher, stall_after
from tests.harness.workers import ThreadedWorker, fresh_topics, worker_config
from worker.devkit.local_kafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PAUSE_S = 4.0  # below the 6 s session timeout: the member stays in the group


@pytest.mark.timeout(240)
def test_loop_keeps_stepping_while_the_broker_is_frozen(local_kafka: LocalKafka) -> None:
    bootstrap = local_kafka.bootstrap_servers
    topics = fresh_topics(bootstrap, 3)
    cfg = worker_config(bootstrap, topics, commit={"interval_ms": 300},
                        batch={"max_batch_size": 4})
    running = ThreadedWorker(cfg)
    worker = running.worker
    steps: list[tuple[float, float]] = []  # (start, end) of every loop step
    real_step = worker.step

    def timed_step() -> None:
        t0 = time.monotonic()
        try:
            real_step()
        finally:
            steps.append((t0, time.monotonic()))

    worker.step = timed_step  # type: ignore[method-assign]
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=20.0, prefix="ls-")
    watcher = TopicWatcher(bootstrap, topics.results)
    try:
        with running:  # on the way out: drains, checks the thread ended, re-raises its failure
            feeder.start()
            watcher.start()
            # Results just delivered when the broker freezes: a commit is due within an
            # interval.
            t_pause, t_resume = stall_after(local_kafka, watcher, results=40, stall_s=PAUSE_S,
                                            timeout=90, failed=lambda: running.error)
            feeder.stop()
            assert watcher.wait_for(set(feeder.good), 90), "jobs left unanswered after the stall"
    finally:
        feeder.halt()
        watcher.stop()
    # A commit was due within one interval of the freeze (results had just been delivered); a
    # synchronous one would have held a single step across the rest of the pause.
    window = (t_pause + 1.0, t_resume - 0.2)
    inside = [s for s in steps if s[0] >= window[0] and s[1] <= window[1]]
    longest = max((end - start for start, end in steps if end > t_pause and start < t_resume),
                  default=0.0)
    assert len(inside) >= 10, (len(inside), round(longest, 2))
    assert longest < PAUSE_S / 2, round(longest, 2)
