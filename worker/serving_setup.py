"""Which task a worker process serves, built from its config (:func:`make_served_task`).

- ``processing.task = "generation"``: text-to-image jobs from ``generation.topics``.
- ``processing.task = "moderation"`` (default) with ``[moderation.policies]``: image-and-text
  moderation; every policy (``model.policies`` too) runs through the
  :class:`worker.multimodal.MultimodalTask`, which batches each engine separately.
- otherwise: open_nsfw moderation, the GPU pipeline task on the torch backend.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from engines.backends.base import Runner
from engines.profiles import Profile
from worker.batcher import Batch, DynamicBatcher
from worker.codec import DecodeLimits, decode_moderation_job, encode_result
from worker.config import WorkerConfig
from worker.dlq import Headers, SourceRecord
from worker.exceptions import SchemaViolation
from worker.jobs import RESULT_SCHEMA, ModerationJob, ModerationResult
from worker.moderation import ModerationTask, Outcome, Pending
from worker.multimodal import MultimodalOutcome, MultimodalTask
from worker.multimodal_run import Engines
from worker.offsets import TopicPartitionKey
from worker.serving import Answer, BatchedTask, ServedTask, TaskTopics, source_ref

if TYPE_CHECKING:  # generation's modules load only in a generation worker
    from worker.generation.jobs import GenerationResult
    from worker.generation.task import GenerationOutcome, GenerationPending, GenerationTask


def _batcher(cfg: WorkerConfig, profiles: tuple[Profile, ...]) -> DynamicBatcher[Pending]:
    b = cfg.batch
    return DynamicBatcher(profiles, max_batch_size=b.max_batch_size,
                          max_delay_s=b.max_delay_ms / 1e3, max_pad_fraction=b.max_pad_fraction)


def _value(record: SourceRecord) -> bytes:
    if record.value is None:  # the loop rejects tombstones before admitting
        raise SchemaViolation("record has no value (tombstone)")
    return record.value


def _headers(result: ModerationResult) -> Headers:
    return [("ktw.schema", RESULT_SCHEMA.encode()), ("ktw.model", result.model_id.encode()),
            ("ktw.engine", result.engine_hash.encode())]


class ModerationCore:
    """open_nsfw moderation (:class:`ModerationTask` or its GPU pipeline subclass)."""

    def __init__(self, cfg: WorkerConfig, runner: Runner, task: ModerationTask,
                 profiles: tuple[Profile, ...], *, own_runner: bool = True,
                 ignore_deadlines: bool = False) -> None:
        self.runner, self.task, self.profiles = runner, task, profiles
        self.model_id = task.model_id
        self._own_runner = own_runner  # False: a runner shared with others stays active
        self.ignore_deadlines = ignore_deadlines
        self._limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        self._headers: Headers = []

    @property
    def engine_hash(self) -> str:
        return self.task.engine_hash

    def warm_up(self) -> None:
        self.runner.activate()
        self.task.warm_up(self.profiles)
        # Every result of this task carries the same headers: build them once.
        self._headers = [("ktw.schema", RESULT_SCHEMA.encode()),
                         ("ktw.model", self.model_id.encode()),
                         ("ktw.engine", self.engine_hash.encode())]

    def ready(self) -> bool:
        return self.task.pipeline_ready()

    def pending(self, record: SourceRecord, epoch: int, consumed_at: float) -> Pending:
        job = decode_moderation_job(_value(record), self._limits)
        self.task.check_policy(job)
        if self.ignore_deadlines:
            job = replace(job, deadline_ms=None)
        return Pending(source_ref(record), job, consumed_at, record, epoch)

    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]:
        return self.task.submit(batch)

    def expired_result(self, p: Pending, now_ms: int) -> ModerationResult:
        return self.task.expired_result(p, now_ms)

    def encode(self, result: ModerationResult) -> tuple[bytes, Headers]:
        return encode_result(result), self._headers

    def close(self) -> None:
        try:
            self.task.close()
        finally:
            if self._own_runner:
                self.runner.deactivate()


class MultimodalServed:
    """Image-and-text moderation: :class:`MultimodalTask` batches each engine itself."""

    def __init__(self, cfg: WorkerConfig, topics: TaskTopics, task: MultimodalTask,
                 engines: Engines, image: ModerationCore | None, *,
                 ignore_deadlines: bool = False) -> None:
        self.topics, self.task, self.engines, self.image = topics, task, engines, image
        self.ignore_deadlines = ignore_deadlines
        self.model_id = "+".join(sorted(engines.profiles())) or "moderation"
        self.on_batch_done: Callable[[float, int], None] | None = None  # per engine: not told
        self._limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)

    @property
    def engine_hash(self) -> str:
        parts = []
        if self.image is not None:
            parts.append(self.image.engine_hash)
        if self.engines.text is not None:
            parts.append(self.engines.text.runner.engine_hash)
        if self.engines.clip is not None:
            parts.append(self.engines.identity("clip")[1])
        return "+".join(parts)

    def warm_up(self) -> None:
        # The text and CLIP engines were activated (and the policies' labels embedded) when
        # they were made; the open_nsfw runner warms up here like the plain task's.
        if self.image is not None:
            self.image.warm_up()

    def ready(self) -> bool:
        return self.image is None or self.image.ready()

    def admit(self, record: SourceRecord, epoch: int, consumed_at: float) -> None:
        job: ModerationJob = decode_moderation_job(_value(record), self._limits)
        self.task.check(job)
        if self.ignore_deadlines:
            job = replace(job, deadline_ms=None)
        self.task.add(Pending(source_ref(record), job, consumed_at, record, epoch))

    def step(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        # The task counts its own free in-flight slots (one pool for every engine).
        return [self._answer(o) for o in self.task.step(now, now_ms, force=force)]

    def collect(self, *, block: bool) -> list[Answer]:
        return [self._answer(o) for o in self.task.collect(block=block)]

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        self.task.remove(lambda p: p.partition_key in keys)

    def held(self) -> int:
        return len(self.task)

    def in_flight(self) -> int:
        return self.task.in_flight

    def wait(self, timeout: float) -> None:
        self.task.wait(timeout)

    def close(self) -> None:
        from worker.multimodal_setup import close_engines

        try:
            self.task.close()
        finally:
            try:
                close_engines(self.engines)
            finally:
                if self.image is not None:
                    self.image.close()

    @staticmethod
    def _answer(o: MultimodalOutcome) -> Answer:
        p = o.pending
        if o.rejection is not None or o.result is None:
            return Answer(p.ref, p.record, p.epoch, p.job.id, rejection=o.rejection)
        r = o.result
        return Answer(p.ref, p.record, p.epoch, r.id, r.status.value, r.id.encode(),
                      encode_result(r), _headers(r))


def _image_core(cfg: WorkerConfig, runner: Runner | None, ignore_deadlines: bool
                ) -> ModerationCore:
    """open_nsfw: its runner built here, or ``runner`` (shared: left active at close)."""
    from worker.engine_setup import engine_plan, make_runner
    from worker.moderation_gpu import make_task

    if runner is None:
        runner, plan = make_runner(cfg)
        own = True
    else:
        plan, own = engine_plan(cfg), False
    return ModerationCore(cfg, runner, make_task(cfg, runner, plan.spec, plan.profiles),
                          plan.profiles, own_runner=own, ignore_deadlines=ignore_deadlines)


def _multimodal(cfg: WorkerConfig, topics: TaskTopics, runner: Runner | None,
                ignore_deadlines: bool) -> MultimodalServed:
    from worker.multimodal_setup import make_engines
    from worker.policy_registry import effective_policies, models_needed

    policies = effective_policies(cfg)
    if "open_nsfw" not in models_needed(policies):
        engines = make_engines(cfg, policies)
        return MultimodalServed(cfg, topics, MultimodalTask(cfg, policies, engines), engines,
                                None, ignore_deadlines=ignore_deadlines)
    image = _image_core(cfg, runner, ignore_deadlines)
    task = image.task
    engines = make_engines(cfg, policies, image_profiles=image.profiles,
                           image_hash=lambda: task.engine_hash)
    return MultimodalServed(cfg, topics, MultimodalTask(cfg, policies, engines, task), engines,
                            image, ignore_deadlines=ignore_deadlines)


class GenerationCore:
    """Text-to-image generation (:class:`worker.generation.task.GenerationTask`)."""

    def __init__(self, task: GenerationTask, *, ignore_deadlines: bool = False) -> None:
        self.task = task
        self.model_id = task.model_id
        self.ignore_deadlines = ignore_deadlines

    @property
    def engine_hash(self) -> str:
        hashes = self.task.engines.engine_hashes()
        return ",".join(f"{k}={v}" for k, v in sorted(hashes.items()))

    def warm_up(self) -> None:
        self.task.warm_up()

    def ready(self) -> bool:
        return True

    def pending(self, record: SourceRecord, epoch: int, consumed_at: float
                ) -> GenerationPending:
        p = self.task.pending(_value(record), source_ref(record), record, consumed_at)
        p.epoch = epoch
        if self.ignore_deadlines:
            p.job = replace(p.job, deadline_ms=None)
        return p

    def submit(self, batch: Batch[GenerationPending]) -> Future[list[GenerationOutcome]]:
        return self.task.submit(batch)

    def expired_result(self, p: GenerationPending, now_ms: int) -> GenerationResult:
        return self.task.expired_result(p, now_ms)

    def encode(self, result: GenerationResult) -> tuple[bytes, Headers]:
        return self.task.encode_result(result), list(self.task.headers(result))

    def close(self) -> None:
        self.task.close()


def make_served_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                     runner: Runner | None = None) -> ServedTask:
    """The task this process serves (engines built or loaded from the cache, not activated:
    :meth:`ServedTask.warm_up` does that). ``ignore_deadlines``: jobs' deadlines are dropped at
    intake (replay asks what the model says now, not whether it would have been in time).
    ``runner``: an open_nsfw runner to share (moderation only), left active at close."""
    if cfg.processing.task == "generation":
        from worker.generation.setup import jobs_per_batch, make_generation_task

        g = cfg.generation.topics
        gen = make_generation_task(cfg)
        batcher: DynamicBatcher[GenerationPending] = DynamicBatcher(
            gen.batcher_profiles(), max_batch_size=jobs_per_batch(cfg),
            max_delay_s=cfg.batch.max_delay_ms / 1e3, max_pad_fraction=cfg.batch.max_pad_fraction)
        return BatchedTask(TaskTopics(g.jobs, g.results, g.dlq),
                           GenerationCore(gen, ignore_deadlines=ignore_deadlines), batcher)
    topics = TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq)
    if cfg.moderation.policies:
        return _multimodal(cfg, topics, runner, ignore_deadlines)
    core = _image_core(cfg, runner, ignore_deadlines)
    return BatchedTask(topics, core, _batcher(cfg, core.profiles))
