"""Prometheus metrics, read from the loop's own counters when Prometheus scrapes.

A custom collector rather than Counter/Histogram objects updated per record: the loop already
counts everything (:class:`worker.loop.stats.Stats`, the hop histograms, :class:`Vitals`), and
the per-record path stays free of metric locks. Names follow Prometheus conventions: base units,
``_total`` counters, ``_seconds`` durations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from worker.loop.refusal import RESOURCES, refusal_of
from worker.observe import events, gpu
from worker.observe.buckets import Buckets
from worker.observe.health import Health
from worker.observe.vitals import Vitals
from worker.tasks.gpu_share import GpuShare

PREFIX = "trt_worker"


class Observed(Protocol):
    """What the collector reads of a worker (worker.loop.worker.Worker)."""

    cfg: Any  # worker.config.WorkerConfig
    task: Any  # worker.tasks.protocol.Task
    committer: Any  # worker.loop.commit.base.Committer
    backpressure: Any  # worker.loop.backpressure.Backpressure
    hold: Any  # worker.loop.hold.PartitionHold
    stats: Any  # worker.loop.stats.Stats
    hops: Any  # worker.loop.hops.HopTimes
    heap: Any  # worker.loop.heap.HeapPolicy
    vitals: Vitals


def _info(w: Observed) -> dict[str, str]:
    from worker import __version__
    from worker.tasks.registry import task_entry

    cfg = w.cfg
    backend = task_entry(cfg.processing.task).backend(cfg)
    return {"model_id": str(w.task.model_id), "engine_hash": str(w.task.engine_hash),
            "backend": str(backend), "version": __version__, "task": cfg.processing.task,
            "guarantee": cfg.processing.guarantee, "instance_id": cfg.kafka.instance_id}


def _histogram(name: str, doc: str, label: str, per: dict[str, Buckets]) -> Metric:
    family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])
    for key, b in sorted(per.items()):
        family.add_metric([key], b.cumulative(), b.sum)
    return family


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class WorkerCollector(Collector):
    def __init__(self, worker: Observed, health: Health) -> None:
        self.worker, self.health, self.topic = worker, health, worker.task.topics.jobs

    def collect(self) -> Iterator[Metric]:
        yield from self.loop_metrics()
        yield from self.process_metrics()

    def process_metrics(self) -> Iterator[Metric]:
        """What the process has once, however many task loops it runs: log events, the
        collector's pauses, the GPUs."""
        errors = CounterMetricFamily(f"{PREFIX}_errors",
                                     "Warning and error log events, by event name.",
                                     labels=["kind"])
        for kind, n in sorted(events.COUNTS.items()):
            errors.add_metric([kind], n)
        yield errors
        yield _histogram("gc_pause_seconds", "Garbage collector pauses (no other thread runs "
                         "Python code meanwhile), by generation.", "generation",
                         self.worker.heap.pauses)
        yield from gpu.metrics(PREFIX)

    def loop_metrics(self) -> Iterator[Metric]:
        """What one task loop has of its own."""
        w, s, v = self.worker, self.worker.stats, self.worker.vitals
        info = InfoMetricFamily(PREFIX, "What this worker serves and how.")
        info.add_metric([], _info(w))
        yield info
        consumed = CounterMetricFamily(f"{PREFIX}_records_consumed", "Records consumed.",
                                       labels=["topic"])
        consumed.add_metric([self.topic], s.consumed)
        yield consumed
        yield _counter("results", "Results produced (expired jobs included).", s.results)
        dead = CounterMetricFamily(f"{PREFIX}_dead_lettered",
                                   "Records dead-lettered, by reason.", labels=["reason"])
        for reason, n in sorted(s.dead_by_reason.items()):
            dead.add_metric([reason], n)
        yield dead
        yield _counter("expired", "Jobs answered as expired (past their deadline).", s.expired)
        yield _histogram("hop_seconds", "Time per hop of a job's trip (worker.loop.hops).",
                         "hop", w.hops.buckets)
        yield _histogram("batch_size", "Jobs per engine batch.", "profile", v.batch_size)
        yield _histogram("batch_fill_ratio", "Jobs per batch over the profile's capacity.",
                         "profile", v.batch_fill)
        yield _histogram("engine_seconds", "Time per batch from submit to outcome.", "profile",
                         v.engine_seconds)
        yield _gauge("pending_records", "Records consumed and not finished.",
                     w.committer.pending())
        yield _gauge("held_bytes", "Bytes of the records consumed and not finished.",
                     w.committer.held_bytes())
        yield _gauge("uncommitted_records", "Records consumed past the committed positions, "
                     "finished or not, all partitions: what a restart would repeat (bounded per "
                     "partition by batch.max_uncommitted_per_partition).",
                     float(sum(w.committer.uncommitted().values())))
        yield _gauge("paused", "1 while the intake is held back (backpressure).",
                     float(w.backpressure.paused))
        yield _counter("pauses", "Times the intake was held back (backpressure).", s.pauses)
        yield _gauge("held_partitions", "Partitions paused with too many records consumed past "
                     "their committed position, or all of them while backpressure is overfull "
                     "(worker.loop.hold).", float(len(w.hold.held)))
        yield _gauge("outputs_blocked", "1 while outputs cannot go out: the cluster does not "
                     "answer, or an output topic refuses records (ACLs, deleted).",
                     float(w.committer.blocked() is not None))
        refused = GaugeMetricFamily(f"{PREFIX}_consumer_refused", "1 while the broker's ACLs "
                                    "refuse the consumer READ on the jobs topic or on the group "
                                    "(worker.loop.refusal).", labels=["resource"])
        now_refused = (r.refused() if (r := refusal_of(w)) is not None else {})
        for resource in RESOURCES:
            refused.add_metric([resource], float(resource in now_refused))
        yield refused
        rebalances = CounterMetricFamily(f"{PREFIX}_rebalances", "Rebalance events.",
                                         labels=["event"])
        for event in ("assigned", "revoked", "lost"):
            rebalances.add_metric([event], v.rebalances[event])
        yield rebalances
        txn = CounterMetricFamily(f"{PREFIX}_transactions", "Transactions (exactly-once).",
                                  labels=["outcome"])
        totals = w.committer.totals()
        txn.add_metric(["committed"], totals.get("txn_commits", 0))
        txn.add_metric(["aborted"], totals.get("txn_aborts", 0))
        yield txn
        lag = GaugeMetricFamily(f"{PREFIX}_consumer_lag_records",
                                "High watermark minus committed offset, per owned partition.",
                                labels=["topic", "partition"])
        for (topic, partition), n in sorted(v.lag.items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        yield _gauge("ready", "1 while /readyz answers 200.", float(self.health.ready().ok))
        yield _gauge("last_step_timestamp_seconds", "Unix time of the loop's last step.",
                     time.time() - (time.monotonic() - v.beat))


class TasksCollector(Collector):
    """The metrics of a process serving several tasks: each loop's own families once, their
    samples labelled ``task``; the process's families once, unlabelled."""

    def __init__(self, collectors: Mapping[str, WorkerCollector],
                 share: GpuShare | None = None) -> None:
        self.collectors, self.share = dict(collectors), share

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for task, collector in self.collectors.items():
            for family in collector.loop_metrics():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                into.samples += [sample._replace(labels={**sample.labels, "task": task})
                                 for sample in family.samples]
        yield from merged.values()
        yield from next(iter(self.collectors.values())).process_metrics()
        if self.share is not None:
            yield _counter("gpu_yields", "Steps of a yielding task (generation) that waited "
                           "for another task's batches in flight (worker.tasks.gpu_share).",
                           self.share.yields)
            yield _counter("gpu_yield_seconds", "Time those steps waited, together.",
                           self.share.waited_s)
