"""Image-and-text moderation: a job's parts batched per engine, decided by its policy.

:class:`PolicyModerationTask` is the :class:`worker.tasks.protocol.Task` a worker serves when
``[moderation.policies]`` are configured. Each model a policy runs is a plug-in
(:mod:`worker.tasks.moderation.models`: open_nsfw, the text model, CLIP); each makes parts of a
job (its image, its text chunks, ...), and each part kind has its own
:class:`worker.tasks.batcher.DynamicBatcher`, so text batches and image batches form
independently; a job's result waits for all of its parts (see
:mod:`worker.tasks.moderation.parts`). Intake: ``check`` (unknown policy, nothing to score,
a model's own check -> DLQ), then ``add``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected, UnknownPolicy
from worker.exceptions import NothingToScore as NothingToScore  # re-exported: defined here before
from worker.exceptions import TextTooLong as TextTooLong
from worker.tasks.batched import make_batcher
from worker.tasks.batcher import DynamicBatcher
from worker.tasks.moderation.models.base import Finished, ModerationModel
from worker.tasks.moderation.open_nsfw import Pending, moderation_headers
from worker.tasks.moderation.part_runner import Models, decide
from worker.tasks.moderation.parts import JobState, Part, job_text
from worker.tasks.moderation.scoring.policies import Decision
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, admit_each, source_ref
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, encode_result
from worker.wire.moderation_jobs import ModerationJob, ModerationResult
from worker.wire.records import SourceRecord, TopicPartitionKey


@dataclass(slots=True)
class PolicyOutcome:
    pending: Pending
    result: ModerationResult | None = None
    decision: Decision | None = None  # rule and models run, for the result's wire fields
    rejection: JobRejected | None = None


class PolicyModerationTask:
    """``models``: the plug-ins by name (every model the policies run); closed with the task
    unless ``own_models`` is False."""

    def __init__(self, cfg: WorkerConfig, policies: Mapping[str, PolicySettings],
                 models: Mapping[str, ModerationModel], *, expire_deadlines: bool = True,
                 own_models: bool = True) -> None:
        self.cfg, self.policies = cfg, policies
        missing = sorted({m for p in policies.values() for m in p.models} - set(models))
        if missing:
            raise ValueError(f"policies run models {missing}: pass their plug-ins")
        self.models = Models(models)
        self._own_models = own_models
        self.topics = TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq)
        self.model_id = "+".join(sorted(self.models.profiles())) or "moderation"
        self.on_batch_done: Callable[[float, int, str, int], None] | None = None  # not told
        self._decode_limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        b = cfg.batch
        self._batchers: dict[str, DynamicBatcher[Part]] = {
            kind: make_batcher(b, profiles, expire_deadlines=expire_deadlines)
            for kind, profiles in self.models.profiles().items()}
        self._pool = ThreadPoolExecutor(b.max_in_flight_batches, thread_name_prefix="mm-batch")
        self._in_flight: list[Future[list[Finished]]] = []
        self._states: dict[int, JobState] = {}  # id(pending) -> state, until answered

    @property
    def engine_hash(self) -> str:
        return "+".join(self.models.identity(m)[1] for m in self.models.by_name)

    # -- lifecycle ------------------------------------------------------------------------
    def warm_up(self) -> None:
        # The text and CLIP engines were activated (and the policies' labels embedded) when
        # they were made; the open_nsfw runner warms up here like the plain task's.
        for model in self.models.by_name.values():
            model.warm_up()

    def ready(self) -> bool:
        return all(model.ready() for model in self.models.by_name.values())

    def unavailable(self) -> str | None:
        return None  # outages here still answer their parts "error" (worker/tasks/moderation)

    def close(self) -> None:
        from worker.tasks.moderation.models import close_models

        try:
            self._pool.shutdown(wait=True)
        finally:
            if self._own_models:
                close_models(self.models.by_name)

    # -- intake ---------------------------------------------------------------------------
    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        def one(record: SourceRecord, value: bytes, epoch: int) -> None:
            job = decode_moderation_job(value, self._decode_limits)
            self.check(job)
            self.add(Pending(source_ref(record), job, batch.consumed_at, record, epoch))

        return admit_each(batch, self.cfg.limits.max_message_bytes, one)

    def check(self, job: ModerationJob) -> None:
        """Raise what goes to the DLQ: an unknown policy, nothing the policy's models can
        score, a model's own refusal (e.g. too many text chunks)."""
        policy = self.policies.get(job.policy)
        if policy is None:
            known = ", ".join(sorted(self.policies))
            raise UnknownPolicy(f"policy {job.policy!r} is not configured (known: {known})")
        planned = self._plan(policy, job)
        if not planned:
            has_text = job_text(job) is not None
            given = " and ".join(k for k, v in (("image", job.image), ("text", has_text)) if v)
            raise NothingToScore(f"policy {job.policy!r} runs {policy.models}; the job has "
                                 f"{given or 'neither image nor text'}: nothing to score")
        for model in planned:
            model.check(job)

    def add(self, p: Pending) -> None:
        """Queue a checked job's parts (``check`` first: it raises what goes to the DLQ)."""
        state = JobState(p, self.policies[p.job.policy])
        parts = [part for model in self._plan(state.policy, p.job) for part in model.parts(state)]
        state.outstanding = len(parts)
        self._states[id(p)] = state
        for part in parts:
            self._batchers[part.kind].add(part)

    def _plan(self, policy: PolicySettings, job: ModerationJob) -> list[ModerationModel]:
        """The policy's models this job can feed, in the policy's order."""
        return [m for m in map(self.models.by_name.__getitem__, policy.models) if m.feeds(job)]

    # -- schedule / collect ---------------------------------------------------------------
    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        # The task counts its own free in-flight slots (one pool for every engine).
        return [self._answer(o) for o in self.step(now, now_ms, force=force)]

    def collect(self, *, block: bool) -> list[Answer]:
        return [self._answer(o) for o in self.finished(block=block)]

    def step(self, now: float, now_ms: int, *, force: bool = False) -> list[PolicyOutcome]:
        """Release due batches into free in-flight slots; the outcomes of jobs found expired."""
        out: list[PolicyOutcome] = []
        for kind, batcher in self._batchers.items():
            free = self.cfg.batch.max_in_flight_batches - len(self._in_flight)
            due = batcher.schedule(now, now_ms, limit=max(free, 0), force=force)
            for part in due.expired:
                part.state.expired = True
                out += self._finish(part.state, now_ms)
            for batch in due.batches:
                self._in_flight.append(self._pool.submit(self.models.run, kind, batch))
        return out

    def finished(self, *, block: bool) -> list[PolicyOutcome]:
        """The outcomes of jobs whose last part finished (wait for every batch if ``block``)."""
        out, pending = [], []
        for fut in self._in_flight:
            if not (block or fut.done()):
                pending.append(fut)
                continue
            for part, value in fut.result():  # an exception here is a bug: let it stop us
                state = part.state
                if state.finished:
                    continue
                state.outstanding -= 1
                state.apply(part, value)
                if state.failed or state.outstanding == 0:
                    out += self._finish(state, int(time.time() * 1e3))
        self._in_flight = pending
        return out

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        self.drop(lambda p: p.partition_key in keys)

    def drop(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        """Drop queued jobs matching ``predicate`` (revoked partitions); computing parts of
        theirs are ignored when they finish."""
        dropped = [s for s in self._states.values() if predicate(s.pending)]
        for state in dropped:
            state.finished = True
            self._forget(state)
        return [s.pending for s in dropped]

    def held(self) -> int:
        """Jobs held: queued or computing (the loop drains until this is zero)."""
        return len(self._states)

    def in_flight(self) -> int:
        return len(self._in_flight)

    def wait(self, timeout: float) -> None:
        """Block until a batch in flight finishes, or ``timeout`` seconds."""
        if self._in_flight:
            wait(self._in_flight, timeout=timeout, return_when=FIRST_COMPLETED)

    # -- answers --------------------------------------------------------------------------
    def _forget(self, state: JobState) -> None:
        for batcher in self._batchers.values():
            batcher.remove(lambda part: part.state is state)
        self._states.pop(id(state.pending), None)

    def _finish(self, state: JobState, now_ms: int) -> list[PolicyOutcome]:
        if state.finished:
            return []
        state.finished = True
        self._forget(state)
        p = state.pending
        if state.rejection is not None:
            return [PolicyOutcome(p, rejection=state.rejection)]
        result, decision = decide(self.models, state, now_ms)
        return [PolicyOutcome(p, result=result, decision=decision)]

    @staticmethod
    def _answer(o: PolicyOutcome) -> Answer:
        p = o.pending
        if o.rejection is not None or o.result is None:
            return Answer(p.ref, p.record, p.epoch, p.job.id, rejection=o.rejection)
        r = o.result
        return Answer(p.ref, p.record, p.epoch, r.id, r.status.value, r.id.encode(),
                      encode_result(r),
                      moderation_headers(r.model_id, r.engine_hash, r.schema_version))
