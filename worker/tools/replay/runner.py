"""The replay: the worker loop (:class:`worker.loop.worker.Worker`) over the live rooms, with
the replay's parts (:mod:`worker.tools.replay.parts`): an assigned range instead of a group's
share, an idempotent producer of its own to the replay topic, a state file instead of commits.

Scoring goes through the task the live worker would serve with this config
(:func:`worker.tasks.registry.make_task`: open_nsfw, image-and-text policies, or
generation), admitting each consumed batch as the live loop does, so a replayed result is what
the live worker would answer now. Deadlines are ignored (no job expires): the question a replay
asks is what the model says, not whether the answer would have been in time. Rejected
records are counted by reason, and sent to a DLQ topic only with ``--dlq-topic``.

Progress is checkpointed to the state file every ``checkpoint_interval_s`` and at the end;
only acknowledged deliveries count as handled. See :mod:`worker.tools.replay.scan` for why a resume
after any interruption produces no duplicate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import structlog

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.kafka.admin import Admin
from worker.loop.backpressure import Backpressure
from worker.loop.build import LoopParts
from worker.loop.group.assignment import Assignment
from worker.loop.heap import HeapPolicy
from worker.loop.hold import PartitionHold
from worker.loop.hops import HopTimes
from worker.loop.intake import Intake
from worker.loop.stats import Stats
from worker.loop.worker import Worker
from worker.observe.spans import JobObserver
from worker.observe.vitals import Vitals
from worker.tasks.protocol import Task
from worker.tools.replay.parts import (
    NoGroup,
    RangeReader,
    ReplayCommitter,
    ReplayOutputs,
    ReplayStartup,
    owned,
)
from worker.tools.replay.progress import ReplayProgress
from worker.tools.replay.start import ReplayRequest, load_or_create
from worker.tools.replay.state import ReplayState

log = structlog.get_logger("replay")


@dataclass
class ReplaySummary:
    replay_id: str
    topic: str
    to_topic: str
    engine: str
    ranges: dict[int, tuple[int, int]]
    counts: Counter[str]
    resumed: bool
    recovered: int  # found already written by an interrupted run, not produced again
    handled_this_run: int
    elapsed_s: float
    finished: bool
    state: ReplayState = field(repr=False)


class ReplayRunner:
    def __init__(self, cfg: WorkerConfig, req: ReplayRequest, runner: Runner | None = None,
                 *, task: Task | None = None, admin: Admin | None = None) -> None:
        self.cfg, self.req = cfg, req
        self._stopping = threading.Event()
        self._admin = admin or Admin(cfg)
        # Validation and state first: a bad request fails before the model is even loaded.
        self.state, self.resumed = load_or_create(cfg, self._admin, req)
        # ``runner``: an open_nsfw runner shared with the caller (tests), left active;
        # ``task``: a task made by the caller (tests), else the one the live worker would run.
        if task is None:
            from worker.tasks.registry import make_task

            task = make_task(cfg, ignore_deadlines=True, runner=runner)
        self._task: Task = task
        self._worker = Worker(cfg, self._task, self._parts())

    def _parts(self) -> LoopParts:
        cfg, req, state = self.cfg, self.req, self.state
        stats, assignment = Stats(), Assignment()
        assignment.owned = owned(state)
        reader = RangeReader(cfg, state, req.rate, req.max_records)
        outputs = ReplayOutputs(cfg, req, state.replay_id, stats)
        total = sum(lg.end - lg.start for lg in state.partitions.values())
        self._progress = ReplayProgress(f"replay {req.topic}", total, 0, enabled=req.progress)
        self._committer = ReplayCommitter(cfg, req, state, outputs, reader, self._progress)
        self._progress.update(self._committer.done())
        self._startup = ReplayStartup(cfg, req, state, self.resumed, self._task, self._admin,
                                      self._committer, reader, self._stopping)
        # Reading over (the range's ends, --max-records): the loop stops, and drains.
        reader.on_end = self.stop
        return LoopParts(
            consumer=reader, committer=self._committer,
            intake=Intake(reader, assignment, self._committer, stats), outputs=outputs,
            assignment=assignment, backpressure=Backpressure(cfg.batch, stats),
            hold=PartitionHold(reader.pause, reader.resume,
                               max_uncommitted=cfg.batch.max_uncommitted_per_partition),
            membership=NoGroup(reader), startup=self._startup, stats=stats, vitals=Vitals(),
            heap=HeapPolicy(cfg.gc), hops=HopTimes(), observer=JobObserver())

    def stop(self) -> None:
        """Drain, checkpoint and return early (safe from signal handlers and other threads)."""
        self._stopping.set()
        self._worker.stop()

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> ReplaySummary:
        started = time.monotonic()
        try:
            with self._progress:
                self._worker.run()
        except BaseException:
            if not self._startup.opened:  # (the loop closes the task once it started)
                self._task.close()
            raise
        summary = ReplaySummary(
            self.state.replay_id, self.req.topic, self.req.to_topic, self.state.engine,
            _ranges(self.state), self.state.totals(), self.resumed, self._startup.recovered,
            self._committer.handled, time.monotonic() - started, self.state.finished,
            self.state,
        )
        log.info("replay_stopped", replay_id=summary.replay_id, finished=summary.finished,
                 handled=summary.handled_this_run, counts=dict(summary.counts))
        return summary


def _ranges(state: ReplayState) -> dict[int, tuple[int, int]]:
    return {p: (lg.start, lg.end) for p, lg in sorted(state.partitions.items())}
