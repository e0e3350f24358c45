"""Wiring a :class:`~worker.loop.worker.Worker` from the config: every collaborator the loop
steps is made here and handed over in :class:`LoopParts`, so the loop builds nothing itself and
its unit tests hand it fakes (tests/unit/loop/test_worker_step.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.config import WorkerConfig
from worker.exceptions import ConfigError
from worker.kafka import Consumer, member_consumer_settings
from worker.kafka.clients import common_settings
from worker.loop.backpressure import Backpressure
from worker.loop.commit.base import Committer, make_committer
from worker.loop.group.assignment import Assignment
from worker.loop.group.membership import Membership, StaticFencing
from worker.loop.group.orphans import OrphanWatch
from worker.loop.group.rejoin import ClusterProbe, Rejoin
from worker.loop.heap import HeapPolicy
from worker.loop.hold import PartitionHold
from worker.loop.hops import HopTimes
from worker.loop.intake import Intake
from worker.loop.output import CloudEvents, OutputBuilder
from worker.loop.poison import PoisonGuard
from worker.loop.startup import Startup
from worker.loop.stats import Stats
from worker.observe.spans import JobObserver, make_spans
from worker.observe.vitals import Vitals
from worker.tasks.protocol import Task
from worker.wire.records import SourceRecord

# Called with each consumed batch's records before the task sees them (a test hook only).
BeforeAdmit = Callable[[Sequence[SourceRecord]], None]


@dataclass
class LoopParts:
    """What the loop steps, besides the task. ``consumer`` is used for the subscription and
    its close; everything else the loop needs of Kafka goes through the other parts."""

    consumer: Any  # worker.kafka.Consumer
    committer: Committer
    intake: Any  # worker.loop.intake.Intake
    outputs: Any  # worker.loop.output.OutputBuilder
    assignment: Assignment
    backpressure: Backpressure
    hold: PartitionHold
    membership: Any  # worker.loop.group.membership.Membership
    startup: Any  # worker.loop.startup.Startup
    stats: Stats
    vitals: Vitals
    heap: HeapPolicy
    hops: HopTimes
    observer: JobObserver
    poison: PoisonGuard | None = None
    before_admit: BeforeAdmit | None = None


def build_worker(cfg: WorkerConfig, task: Task | None = None) -> Any:
    """A :class:`~worker.loop.worker.Worker` for ``cfg`` (the task from the registry unless
    given)."""
    from worker.loop.worker import Worker

    if not cfg.kafka.bootstrap_servers:
        raise ConfigError("kafka.bootstrap_servers is empty (set KAFKA_BOOTSTRAP_SERVERS)")
    t0 = time.monotonic()
    if task is None:
        from worker.tasks.registry import make_task

        task = make_task(cfg)
    vitals = Vitals()  # heartbeat, warm-up, rebalances, batches, lag (worker.observe)
    vitals.startup["task_built_s"] = round(time.monotonic() - t0, 2)
    return Worker(cfg, task, build_parts(cfg, task, vitals))


def build_workers(cfg: WorkerConfig) -> dict[str, Any]:
    """A worker per task ``cfg`` serves, by task name (worker.config.tasks.per_task gives
    each its config). With several, their tasks share the GPU by priority
    (worker.tasks.gpu_share): tasks whose registry entry yields wait for the others."""
    from worker.config.tasks import per_task
    from worker.tasks.batched import BatchedTask
    from worker.tasks.gpu_share import GpuShare
    from worker.tasks.registry import task_entry

    configs = per_task(cfg)
    share = (GpuShare(cfg.processing.gpu_yield_ms / 1e3, cfg.processing.gpu_free_sms,
                      disjoint=cfg.processing.gpu_disjoint_sms,
                      priority=cfg.processing.gpu_priority)
             if len(configs) > 1 else None)
    workers: dict[str, Any] = {}
    try:
        for name, task_cfg in configs.items():
            workers[name] = build_worker(task_cfg)
        # The yielding tasks first: the others keep to the SMs those leave free
        # (processing.gpu_disjoint_sms) only once those do.
        for name in sorted(workers, key=lambda n: not task_entry(n).yields_gpu):
            task = workers[name].task
            if share is not None and isinstance(task, BatchedTask):
                task.share_gpu(share, yields=task_entry(name).yields_gpu)
    except BaseException:
        for built in workers.values():  # (their engines and consumers: not left open)
            try:
                built.task.close()
            finally:
                built.parts.consumer.close()
        raise
    return workers


def build_parts(cfg: WorkerConfig, task: Task, vitals: Vitals | None = None) -> LoopParts:
    vitals = vitals or Vitals()
    stats, hops, assignment = Stats(), HopTimes(), Assignment()
    consumer = Consumer(member_consumer_settings(cfg, on_stats=vitals.on_stats))
    outputs = OutputBuilder(
        task.topics, cfg.kafka.client_id, stats,
        dlq_inline_max_bytes=cfg.limits.dlq_inline_max_bytes,
        cloudevents=(CloudEvents(cfg.processing.task, cfg.kafka.group_id)
                     if cfg.kafka.cloudevents else None))
    committer = make_committer(cfg, consumer, assignment, task.remove, hops, outputs)
    committer.on_committed = vitals.note_committed  # (exactly-once: the lag)
    committer.on_wait = vitals.alive
    # A record that kills the process is dead-lettered after so many deaths (poison.py).
    poison = (PoisonGuard(cfg.processing.poison_max_attempts,
                          cfg.batch.max_batch_size * cfg.batch.max_in_flight_batches,
                          consumer, committer, outputs)
              if cfg.processing.poison_max_attempts else None)
    return LoopParts(
        consumer=consumer, committer=committer,
        intake=Intake(consumer, assignment, committer, stats), outputs=outputs,
        assignment=assignment, backpressure=Backpressure(cfg.batch, stats),
        hold=PartitionHold(consumer.pause, consumer.resume,
                           max_uncommitted=cfg.batch.max_uncommitted_per_partition),
        membership=_membership(cfg, consumer, task.topics.jobs),
        startup=Startup(cfg, task, consumer, committer, vitals),
        stats=stats, vitals=vitals, heap=HeapPolicy(cfg.gc), hops=hops,
        observer=make_spans(cfg) or JobObserver(), poison=poison,
        before_admit=_kill_hook(os.environ.get("KTW_TEST_KILL_ON_KEY")))


def _membership(cfg: WorkerConfig, consumer: Consumer, jobs: str) -> Membership:
    # A lost consumer that stays lost once the cluster answers is replaced (loop/group/rejoin.py).
    rejoin = Rejoin(ClusterProbe(common_settings(cfg.kafka)))
    # Static members only: partitions left to nobody by a member killed mid-rebalance. A
    # revoke callback finishes the batches in flight, then flushes and commits (each bounded
    # by drain_timeout_s): the orphan watch waits that out too.
    revoke_bound_s = (2 * cfg.commit.drain_timeout_s + cfg.batch.max_in_flight_batches
                      * cfg.processing.max_batch_ms / 1e3)
    orphans = (OrphanWatch(common_settings(cfg.kafka), cfg.kafka.group_id, jobs,
                           cfg.kafka.session_timeout_ms, revoke_bound_s)
               if cfg.kafka.static_membership else None)
    fencing = (StaticFencing(common_settings(cfg.kafka), cfg.kafka.group_id,
                             cfg.kafka.instance_id, cfg.kafka.session_timeout_ms)
               if cfg.kafka.static_membership else None)
    return Membership(consumer, jobs, rejoin, orphans, fencing)


def _kill_hook(key: str | None) -> BeforeAdmit | None:
    """TEST HOOK, set only by tests (tests/integration/faults/test_poison.py through
    KTW_TEST_KILL_ON_KEY): the process kills itself (SIGKILL, as a cgroup OOM kill does)
    when it takes a job with this key."""
    if not key:
        return None
    wanted = key.encode()

    def hook(records: Sequence[SourceRecord]) -> None:
        if any(r.key == wanted for r in records):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
