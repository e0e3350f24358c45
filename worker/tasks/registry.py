"""Which task a worker process serves, built from its config (:func:`make_served_task`).

- ``processing.task = "generation"``: text-to-image jobs from ``generation.topics``.
- ``processing.task = "moderation"`` (default) with ``[moderation.policies]``: image-and-text
  moderation; every policy (``model.policies`` too) runs through the
  :class:`worker.tasks.moderation.multimodal.MultimodalTask`, which batches each engine separately.
- otherwise: open_nsfw moderation, the GPU pipeline task on the torch backend.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from engines.backends.base import Runner
from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.config.policies import ModelName
from worker.exceptions import SchemaViolation
from worker.tasks.batched import BatchedTask, make_batcher
from worker.tasks.batcher import Batch
from worker.tasks.moderation.multimodal import MultimodalOutcome, MultimodalTask
from worker.tasks.moderation.open_nsfw import ModerationTask, Outcome, Pending
from worker.tasks.moderation.part_runner import Engines
from worker.tasks.protocol import Answer, ConsumedBatch, Task, TaskTopics, admit_each, source_ref
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, encode_result
from worker.wire.moderation_jobs import RESULT_SCHEMA, ModerationJob, ModerationResult
from worker.wire.records import Headers, SourceRecord, TopicPartitionKey

if TYPE_CHECKING:  # generation's modules load only in a generation worker
    from worker.tasks.generation.task import GenerationOutcome, GenerationPending, GenerationTask
    from worker.wire.generation_jobs import GenerationResult


def _value(record: SourceRecord) -> bytes:
    if record.value is None:  # the loop rejects tombstones before admitting
        raise SchemaViolation("record has no value (tombstone)")
    return record.value


def _headers(model_id: str, engine_hash: str) -> Headers:
    return [("ktw.schema", RESULT_SCHEMA.encode()), ("ktw.model", model_id.encode()),
            ("ktw.engine", engine_hash.encode())]


class ModerationCore:
    """open_nsfw moderation (:class:`ModerationTask` or its GPU pipeline subclass)."""

    def __init__(self, cfg: WorkerConfig, runner: Runner, task: ModerationTask,
                 profiles: tuple[Profile, ...], *, own_runner: bool = True) -> None:
        self.runner, self.task, self.profiles = runner, task, profiles
        self.model_id = task.model_id
        self._own_runner = own_runner  # False: a runner shared with others stays active
        self._limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        self._headers: Headers = []

    @property
    def engine_hash(self) -> str:
        return self.task.engine_hash

    def warm_up(self) -> None:
        self.runner.activate()
        self.task.warm_up(self.profiles)
        # Every result of this task carries the same headers: build them once.
        self._headers = _headers(self.model_id, self.engine_hash)

    def ready(self) -> bool:
        return self.task.pipeline_ready()

    def pending(self, record: SourceRecord, epoch: int, consumed_at: float) -> Pending:
        job = decode_moderation_job(_value(record), self._limits)
        self.task.check_policy(job)
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
                 engines: Engines, image: ModerationCore | None) -> None:
        self.topics, self.task, self.engines, self.image = topics, task, engines, image
        self.model_id = "+".join(sorted(engines.profiles())) or "moderation"
        self.on_batch_done: Callable[[float, int], None] | None = None  # per engine: not told
        self._limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        self._max_message_bytes = cfg.limits.max_message_bytes

    @property
    def engine_hash(self) -> str:
        present: tuple[tuple[ModelName, object], ...] = (
            ("open_nsfw", self.image), ("text", self.engines.text), ("clip", self.engines.clip))
        return "+".join(self.engines.identity(m)[1] for m, on in present if on is not None)

    def warm_up(self) -> None:
        # The text and CLIP engines were activated (and the policies' labels embedded) when
        # they were made; the open_nsfw runner warms up here like the plain task's.
        if self.image is not None:
            self.image.warm_up()

    def ready(self) -> bool:
        return self.image is None or self.image.ready()

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        def one(record: SourceRecord, value: bytes, epoch: int) -> None:
            job: ModerationJob = decode_moderation_job(value, self._limits)
            self.task.check(job)
            self.task.add(Pending(source_ref(record), job, batch.consumed_at, record, epoch))

        return admit_each(batch, self._max_message_bytes, one)

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
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
        from worker.tasks.moderation.setup import close_engines

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
                      encode_result(r), _headers(r.model_id, r.engine_hash))


def _image_core(cfg: WorkerConfig, runner: Runner | None) -> ModerationCore:
    """open_nsfw: its runner built here, or ``runner`` (shared: left active at close)."""
    from worker.engine_setup import engine_plan, make_runner
    from worker.tasks.moderation.open_nsfw_gpu import make_task

    if runner is None:
        runner, plan = make_runner(cfg)
        own = True
    else:
        plan, own = engine_plan(cfg), False
    return ModerationCore(cfg, runner, make_task(cfg, runner, plan.spec, plan.profiles),
                          plan.profiles, own_runner=own)


def _multimodal(cfg: WorkerConfig, topics: TaskTopics, runner: Runner | None,
                expire_deadlines: bool) -> MultimodalServed:
    from worker.tasks.moderation.served_policies import effective_policies, models_needed
    from worker.tasks.moderation.setup import make_engines

    policies = effective_policies(cfg)
    if "open_nsfw" not in models_needed(policies):
        engines = make_engines(cfg, policies)
        return MultimodalServed(cfg, topics, MultimodalTask(
            cfg, policies, engines, expire_deadlines=expire_deadlines), engines, None)
    image = _image_core(cfg, runner)
    task = image.task
    engines = make_engines(cfg, policies, image_profiles=image.profiles,
                           image_hash=lambda: task.engine_hash)
    return MultimodalServed(cfg, topics, MultimodalTask(
        cfg, policies, engines, task, expire_deadlines=expire_deadlines), engines, image)


class GenerationCore:
    """Text-to-image generation (:class:`worker.tasks.generation.task.GenerationTask`)."""

    def __init__(self, task: GenerationTask) -> None:
        self.task = task
        self.model_id = task.model_id

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
                     runner: Runner | None = None) -> Task:
    """The task this process serves (engines built or loaded from the cache, not activated:
    :meth:`Task.warm_up` does that). ``ignore_deadlines``: the batchers never expire a
    job (replay asks what the model says now, not whether it would have been in time).
    ``runner``: an open_nsfw runner to share (moderation only), left active at close."""
    expire = not ignore_deadlines
    if cfg.processing.task == "generation":
        from worker.tasks.generation.setup import make_generation_task

        g = cfg.generation.topics
        gen = make_generation_task(cfg)
        batcher = make_batcher(cfg.batch, gen.batcher_profiles(),
                               max_batch_size=gen.max_jobs_per_batch, expire_deadlines=expire)
        return BatchedTask(TaskTopics(g.jobs, g.results, g.dlq), GenerationCore(gen), batcher,
                           max_message_bytes=cfg.limits.max_message_bytes)
    topics = TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq)
    if cfg.moderation.policies:
        return _multimodal(cfg, topics, runner, expire)
    core = _image_core(cfg, runner)
    return BatchedTask(topics, core, make_batcher(cfg.batch, core.profiles,
                                                  expire_deadlines=expire),
                       max_message_bytes=cfg.limits.max_message_bytes)
