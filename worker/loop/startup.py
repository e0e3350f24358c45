"""What a worker does before its first step: wait for its topics, then open the Kafka clients
while the task warms up.

A topic missing or refused at start-up is waited out (``kafka.topics_wait_s``), readiness off
with the reason and liveness kept: an exit would only be restarted into the same refusal.
The clients open in a thread while the task warms up (their waits hold no GIL): a new
idempotent producer's first send waits about half a second for its producer id, and
exactly-once's ``init_transactions`` waits for the coordinator. The group is joined only
once warm, by the loop: no partition waits on a cold worker.

Exactly-once's WRITE on its transactional id can only be checked by ``init_transactions``
(worker.kafka.topics says why), so its refusal surfaces when the clients open; it is waited
out the same way, under the same budget: both are a grant (or a name) the cluster's operator
has yet to provide, and one setting says how long start-up may wait for them, together.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import structlog

from worker.config import WorkerConfig
from worker.exceptions import TopicNotAuthorized, UnknownTopic, one_line
from worker.kafka import Consumer
from worker.kafka.topics import check_topics
from worker.loop.commit.base import Committer
from worker.observe.vitals import Vitals
from worker.tasks.protocol import Task

log = structlog.get_logger("worker")
# The longest wait between two start-up checks of a topic that is missing or refused.
TOPICS_RETRY_MAX_S = 30.0

Check = Callable[[], None]


class Startup:
    def __init__(self, cfg: WorkerConfig, task: Task, consumer: Consumer, committer: Committer,
                 vitals: Vitals, check: Check | None = None) -> None:
        self.cfg, self._task, self._consumer, self._committer = cfg, task, consumer, committer
        self._vitals = vitals
        topics = task.topics
        self._check = check or (lambda: check_topics(cfg, topics.jobs, topics.results,
                                                     topics.dlq))
        # Seconds waited so far, by both waits: ``kafka.topics_wait_s`` bounds their sum.
        self._waited_s = 0.0

    def wait_for_topics(self, stop: threading.Event) -> bool:
        """The start-up check of the topics, waited out while one is missing or refused;
        False when ``stop`` was set meanwhile."""
        return self._wait_out(self._check, stop, event="topics_unavailable")

    def _wait_out(self, attempt: Check, stop: threading.Event, *, event: str,
                  first: UnknownTopic | TopicNotAuthorized | None = None) -> bool:
        """Call ``attempt`` until it raises no missing or refused topic (or transactional
        id), 1, 2, 4 ... 30 s apart, readiness off with the reason; False when ``stop`` was
        set meanwhile; the last refusal raised once ``kafka.topics_wait_s`` is spent.
        ``first``: the refusal of an attempt already made."""
        wait_for = self.cfg.kafka.topics_wait_s
        t0 = time.monotonic() - self._waited_s
        tries = 0
        try:
            while True:
                self._vitals.beat = time.monotonic()
                try:
                    if first is not None:
                        exc, first = first, None
                        raise exc
                    attempt()
                except (UnknownTopic, TopicNotAuthorized) as exc:
                    waited = time.monotonic() - t0
                    if wait_for is not None and waited >= wait_for:
                        raise
                    tries += 1
                    retry_s = min(TOPICS_RETRY_MAX_S, 2.0 ** (tries - 1))
                    if wait_for is not None:
                        retry_s = max(0.0, min(retry_s, wait_for - waited))
                    self._vitals.waiting = f"start-up waits: {one_line(exc, 250)}"
                    log.error(event, error=one_line(exc, 500), attempt=tries,
                              waited_s=round(waited, 1), retry_in_s=retry_s,
                              give_up_after_s=wait_for)
                    if stop.wait(retry_s):
                        return False
                    continue
                self._vitals.waiting = None
                return True
        finally:
            if tries:  # (a check that passed at once waited for nothing)
                self._waited_s = time.monotonic() - t0

    def open_while_warming(self, stop: threading.Event) -> bool:
        """Warm the task up while the clients open; a failure of either closes the clients
        and raises (the warm-up's error first). A transactional id the broker refuses is
        waited out as a refused topic is; False when ``stop`` was set meanwhile (the clients
        closed)."""
        startup, t = self._vitals.startup, time.monotonic()
        with ThreadPoolExecutor(1, thread_name_prefix="clients-open") as pool:
            opened = pool.submit(self._open_clients)
            try:
                self._task.warm_up()
            except BaseException:
                self._close_unused(opened)
                raise
        startup["warm_up_s"] = round(time.monotonic() - t, 2)
        # The task can answer: readiness names what start-up still waits for, not a cold engine.
        self._vitals.warm = True
        refused = opened.exception()
        if isinstance(refused, TopicNotAuthorized):
            # The committer's own refusal: nothing else was opened (see _open_clients).
            try:
                if not self._wait_out(self._committer.start, stop,
                                      event="transactional_id_refused", first=refused):
                    self._close_unused(opened)
                    return False
                t = time.monotonic()
                self._consumer.open(on_commit=self._committer.on_commit)
            except BaseException:
                self._close_unused(opened)
                raise
            startup["clients_s"] = round(time.monotonic() - t, 2)
            return True
        if refused is not None:  # raised here, after the clients are closed
            self._close_unused(opened)
        startup["clients_s"] = opened.result()
        return True

    def _open_clients(self) -> float:
        t = time.monotonic()
        self._committer.start()
        self._consumer.open(on_commit=self._committer.on_commit)
        return round(time.monotonic() - t, 2)

    def _close_unused(self, opened: Future[float]) -> None:
        """Once the opening thread has ended, close whatever it opened, quietly, so that the
        first error is the one reported."""
        wait([opened])
        with contextlib.suppress(Exception):
            self._consumer.close(timeout_s=1.0)
        with contextlib.suppress(Exception):
            self._committer.close(failed=True)
