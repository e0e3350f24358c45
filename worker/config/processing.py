"""The ``[commit]``, ``[processing]``, ``[gc]`` and ``[log]`` sections: delivery guarantee,
commits, task, the process's garbage collector."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from worker.config.base import Section
from worker.config.names import task_names


def _joined(value: Any) -> Any:
    """A TOML or JSON list of task names is taken as their comma-separated form."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return value


# One task name, or several separated by commas (worker.config.names.task_names).
TaskNames = Annotated[str, BeforeValidator(_joined), BeforeValidator(task_names)]


class CommitSettings(Section):
    interval_ms: float = Field(1_000.0, ge=0)
    drain_timeout_s: float = Field(30.0, gt=0)
    # After SIGTERM, a worker still running this long prints every thread's stack and exits
    # non-zero (uncommitted work is redone by the next owner): a hang in shutdown, e.g. a
    # consumer close that never returns, ends with a diagnosis instead of an orchestrator's
    # SIGKILL. Keep it below the orchestrator's grace period.
    shutdown_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _shutdown_covers_drain(self) -> CommitSettings:
        if self.shutdown_timeout_s <= self.drain_timeout_s:
            raise ValueError("shutdown_timeout_s must exceed drain_timeout_s")
        return self


class ProcessingSettings(Section):
    """Delivery guarantee. ``at-least-once``: results and offsets are separate writes, so a
    crash can repeat results. ``exactly-once``: results, DLQ records and the consumed offsets
    are written in one Kafka transaction per commit interval; read them with
    ``isolation.level=read_committed``."""

    guarantee: Literal["at-least-once", "exactly-once"] = "at-least-once"
    # What this process serves (worker.tasks.registry): moderation jobs from ``topics`` or
    # text-to-image jobs from ``generation.topics``, or several tasks at once, comma-separated
    # ("moderation,generation") or a list: one loop per task on its own thread, each in its
    # own consumer group (worker.config.tasks.per_task says which).
    task: TaskNames = "moderation"
    # With several tasks: the longest a task whose registry entry yields the GPU (generation)
    # waits before each step of its own while another task's batches are in flight
    # (worker.tasks.gpu_share). 0: it never waits (moderation's latency is kept by
    # gpu_free_sms and gpu_priority instead; the 5 ms wait, measured without free SMs, cost
    # generation 8-26 points of its share: docs/two-tasks.md). Moot with one task.
    gpu_yield_ms: float = Field(0.0, ge=0, le=1_000)
    # With several tasks: the tasks that do not yield (moderation) put their own CUDA streams
    # at the device's highest priority, so their kernels are dispatched before the queued
    # steps of the ones that do. "auto": only where generation leaves no SMs free
    # (gpu_free_sms 0, generation on the CPU, or a backend that cannot partition; a green
    # context the driver refuses later, at the engines' load, is not seen). With SMs
    # free, the priority also sends moderation's blocks onto generation's SMs ahead of its
    # own: on two H100s at 2,000 jobs/s with 16 free, generation made 3.15-3.2 images/s
    # with it and 3.2-3.4 without, moderation's p99 no shorter; with none free it kept the
    # p99 at 40 against 177 ms (docs/two-tasks.md).
    # Moot with one task.
    gpu_priority: Literal["auto"] | bool = "auto"
    # With several tasks: SMs the kernels of the tasks that yield (generation) never run on,
    # kept free for the others' (moderation's): a priority only orders kernels that wait, and
    # a running UNet kernel keeps its SMs until it ends, so without free SMs a moderation
    # kernel waits for it. Generation's engines run in a CUDA green context of the rest,
    # rounded down to the device's granularity (8 SMs on Hopper: 16 of an H100's 132 leave
    # it 112); torch and aoti backends on CUDA. On an H100 at 2,000 moderation jobs/s beside
    # generation with pauses between its batches, 16 took moderation's p99 from 31-41 ms to
    # 15.5-23.7 ms, generation's images/s from 84-86% to 76-83% of its rate alone on every SM;
    # beside generation with eight jobs outstanding the p99 was 37-54 ms with 16, 17.7 ms with
    # 32 (generation at 80% and 72%), and at full load 264-291 ms with 16 (generation at
    # 75-77%: docs/two-tasks.md). 0: generation may use every SM. Moot with one task, and
    # with generation on the CPU.
    gpu_free_sms: int = Field(16, ge=0, le=1024)
    # With several tasks and gpu_free_sms: the tasks that do not yield (moderation) run their
    # GPU pipelines on those free SMs only, so the two tasks never share an SM: generation's
    # kernels no longer wait for moderation's either, and moderation's batches run on the
    # fewer SMs (20 of an H100's 132 with the default 16, too few for 2,000 jobs/s of
    # thumbnails on an H100; 48 free, 52 SMs, kept p99 under 25 ms there: docs/two-tasks.md),
    # so size gpu_free_sms to moderation's load. Models without a pipeline of their own
    # (text, CLIP) run on every SM as before. Moot where generation runs on the CPU.
    gpu_disjoint_sms: bool = False
    # The longest one batch (decode + inference + results) may take. A transaction stays open
    # for about one commit interval plus one batch, so exactly-once requires
    # kafka.transaction_timeout_ms >= 2 * (commit.interval_ms + max_batch_ms); slower batches
    # are logged as errors.
    max_batch_ms: float = Field(10_000.0, gt=0)
    # Crash-loop breaker (worker/loop/poison.py): a record that killed this many processes
    # (an OOM kill, a native crash, a sticky CUDA error) is dead-lettered by reference with
    # reason ``poison``; the count is kept in the offset commits' metadata. 0 turns it off;
    # 1 is refused: the first death is ambiguous (whatever was in flight), only isolated
    # deaths name the record.
    poison_max_attempts: int = Field(3, ge=0, le=1000)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks served, in the order given (the first keeps kafka.group_id)."""
        return tuple(self.task.split(","))

    @model_validator(mode="after")
    def _poison_attempts(self) -> ProcessingSettings:
        if self.poison_max_attempts == 1:
            raise ValueError("poison_max_attempts must be 0 (off) or at least 2")
        return self


class GcSettings(Section):
    """CPython's cyclic garbage collector in the worker's process (worker.loop.heap). While a
    collection runs no other thread runs Python code; a full one walks the whole heap, which a
    GPU worker fills with torch and its engines before the first job."""

    # Once the engines are warm, collect once and move every object alive then out of the
    # collector's sight (gc.freeze): full collections walk only what the loop made since.
    freeze_after_warm_up: bool = True
    # Tracked allocations (net of frees) between young collections; Python's default is 700,
    # which a backlog of held jobs crosses every few hundred jobs. 0 leaves Python's value.
    young_threshold: int = Field(10_000, ge=0, le=1_000_000)


class LogSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"
