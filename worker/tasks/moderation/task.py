"""Moderation: one task, every policy, each job's parts batched per engine.

Each model a policy runs (:mod:`worker.tasks.moderation.models`: open_nsfw, the text model,
CLIP, ...) makes parts of a job (its image, its text chunks, its image and caption), and each
part kind has its own :class:`worker.tasks.batcher.DynamicBatcher` in front of its model's
engine, so image rows, text chunks and image-text pairs batch independently
(:class:`worker.tasks.batched.BatchedTask`, which also isolates failing batches). A job's
result waits for all of its parts (:mod:`worker.tasks.moderation.parts`) and is assembled in
one place (:mod:`worker.tasks.moderation.results`). A policy that runs open_nsfw alone (every
``model.policies`` entry) is a policy like any other, through the same path.

Intake: decode, then refuse (to the DLQ) an unknown policy, a job none of its policy's models
can feed, and what a model refuses itself (e.g. too many text chunks).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeAlias

import structlog

from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected, UnknownPolicy
from worker.tasks.batched import BatchedTask
from worker.tasks.batcher import Batch
from worker.tasks.gpu_share import GpuShare
from worker.tasks.moderation.models.base import Finished, ModerationModel
from worker.tasks.moderation.parts import JobState, Part, Pending, mark_started
from worker.tasks.moderation.results import job_result, moderation_headers, nothing_to_score
from worker.tasks.protocol import Answer, source_ref
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, encode_result
from worker.wire.moderation_jobs import ModerationJob, ModerationResult
from worker.wire.records import Headers, SourceRecord, TopicPartitionKey

log = structlog.get_logger("worker.tasks.moderation")

# What a batch's thread hands back: each part with its value, and the results it assembled.
Ran: TypeAlias = tuple[list[Finished], dict[int, ModerationResult]]


class ModerationTask(BatchedTask[Part]):
    """``models``: every model the policies run, by name; closed with the task unless
    ``own_models`` is False. ``single_model_v1``: answer v1 jobs in the open_nsfw-only
    worker's form (:mod:`worker.tasks.moderation.results`)."""

    def __init__(self, cfg: WorkerConfig, policies: Mapping[str, PolicySettings],
                 models: Mapping[str, ModerationModel], *, own_models: bool = True,
                 single_model_v1: bool = False) -> None:
        self.cfg, self.policies = cfg, dict(policies)
        missing = sorted({m for p in policies.values() for m in p.models} - set(models))
        if missing:
            raise ValueError(f"policies run models {missing}: pass them")
        self.models = dict(models)
        self.by_kind: dict[str, ModerationModel] = {}
        for model in self.models.values():
            for kind in model.profiles():
                if kind in self.by_kind:
                    raise ValueError(f"part kind {kind!r} of model {model.name!r} is already "
                                     f"{self.by_kind[kind].name!r}'s")
                self.by_kind[kind] = model
        self._own_models = own_models
        self._single_model_v1 = single_model_v1
        self.model_id = "+".join(sorted(self.by_kind)) or "moderation"
        self._decode_limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        # One orchestrating thread per batch in flight, whatever its kind.
        self._pool = ThreadPoolExecutor(cfg.batch.max_in_flight_batches,
                                        thread_name_prefix="batch")
        self._states: dict[int, JobState] = {}  # id(pending) -> state, until answered
        self._headers: dict[tuple[str, str, int], Headers] = {}

    def profiles(self) -> dict[str, tuple[Any, ...]]:
        """Every part kind with its engine's profiles (a batcher each)."""
        return {kind: profiles for model in self.models.values()
                for kind, profiles in model.profiles().items()}

    @property
    def engine_hash(self) -> str:
        return "+".join(m.identity()[1] for m in self.models.values())

    # -- lifecycle ------------------------------------------------------------------------
    def share_gpu(self, share: GpuShare, *, yields: bool) -> None:
        super().share_gpu(share, yields=yields)
        if yields:
            return
        log.info("gpu_priority", on=share.urgent, setting=share.priority,
                 free_sms=share.left_free)
        if share.urgent:
            for model in self.models.values():
                model.prefer_gpu()
        if share.disjoint and share.left_free:
            kept = [name for name, model in self.models.items()
                    if model.use_free_sms(share.left_free)]
            log.info("gpu_disjoint_sms", models=kept, free_sms=share.left_free,
                     on_every_sm=sorted(set(self.models) - set(kept)))

    def warm_up(self) -> None:
        for model in self.models.values():
            model.warm_up()

    def ready(self) -> bool:
        return all(model.ready() for model in self.models.values())

    def close(self) -> None:
        from worker.tasks.moderation.models import close_models

        try:
            self._pool.shutdown(wait=True)
        finally:
            if self._own_models:
                close_models(self.models)

    # -- intake ---------------------------------------------------------------------------
    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float
               ) -> Pending:
        job = decode_moderation_job(value, self._decode_limits)
        plan = self.check(job)
        return Pending(source_ref(record), job, consumed_at, record, epoch, plan)

    def check(self, job: ModerationJob) -> tuple[ModerationModel, ...]:
        """The policy's models that score ``job``, in the policy's order; raise what goes to
        the DLQ: an unknown policy, nothing the policy's models can score, a model's own
        refusal (e.g. too many text chunks)."""
        policy = self.policies.get(job.policy)
        if policy is None:
            known = ", ".join(sorted(self.policies))
            raise UnknownPolicy(f"policy {job.policy!r} is not configured (known: {known})")
        planned = tuple(m for m in map(self.models.__getitem__, policy.models) if m.feeds(job))
        if not planned:
            raise nothing_to_score(job, policy.models)
        for model in planned:
            model.check(job)
        return planned

    def _queue(self, admitted: Any) -> None:
        p: Pending = admitted
        state = JobState(p, self.policies[p.job.policy])
        parts = [part for model in p.plan for part in model.parts(state)]
        state.outstanding = state.parts = len(parts)
        self._add(parts)
        self._states[id(p)] = state

    def kind_of(self, p: Part) -> str:
        return p.kind

    # -- a batch --------------------------------------------------------------------------
    def submit(self, batch: Batch[Part]) -> Future[Ran]:
        return self._pool.submit(self._run, batch)

    def _run(self, batch: Batch[Part]) -> Ran:
        for part in batch.items:
            mark_started(part.state)
        kind = batch.items[0].kind
        finished = self.by_kind[kind].run(kind, batch)
        return finished, self._assembled(finished)

    def _assembled(self, finished: list[Finished]) -> dict[int, ModerationResult]:
        """The results of the jobs these parts complete alone (a job of one part: an image
        under an open_nsfw-only policy, the video-frame case), by id(part), made here on the
        batch thread: the loop thread, whose per-job work sets one process's rate, then only
        encodes them. Nothing else touches a one-part job's state while its part computes;
        if its partition is lost meanwhile, the loop drops the result unread. A job of
        several parts is assembled by the loop when its last part is in."""
        out: dict[int, ModerationResult] = {}
        for part, value in finished:
            state = part.state
            if state.parts == 1 and not isinstance(value, JobRejected) and not state.finished:
                out[id(part)] = job_result(state, self.models, 0,
                                           single_model_v1=self._single_model_v1,
                                           values={part.model: {part.key: value}})
        return out

    # -- answers --------------------------------------------------------------------------
    def _settle(self, outcomes: Any, started: float, done: float) -> list[Answer]:
        answers: list[Answer] = []
        finished, assembled = outcomes  # (Ran: what _run returned)
        now_ms = int(time.time() * 1e3)  # (what an expired job's result names)
        for part, value in finished:
            state = part.state
            if state.finished:
                continue  # its job was answered (a part refused, expired) or its partition left
            state.outstanding -= 1
            result = assembled.get(id(part))
            if result is None:
                state.apply(part, value)
            if result is not None or state.failed or state.outstanding == 0:
                answers += self._finish(state, now_ms, started, done, result)
        return answers

    def _expire(self, items: list[Part], now_ms: int) -> list[Answer]:
        answers: list[Answer] = []
        for part in items:
            part.state.expired = True
            answers += self._finish(part.state, now_ms)
        return answers

    def _reject(self, p: Part, rejection: JobRejected) -> list[Answer]:
        p.state.rejection = rejection
        return self._finish(p.state, int(time.time() * 1e3))

    def _finish(self, state: JobState, now_ms: int, started: float = 0.0, done: float = 0.0,
                result: ModerationResult | None = None) -> list[Answer]:
        """The job's answer; ``result``: already assembled (see :meth:`_assembled`)."""
        if state.finished:
            return []
        self._forget(state)
        p = state.pending
        if state.rejection is not None:
            return [Answer(p.ref, p.record, p.epoch, p.job.id, rejection=state.rejection)]
        if result is None:
            result = job_result(state, self.models, now_ms,
                                single_model_v1=self._single_model_v1)
        a = self._answer(p, result)
        a.consumed_at, a.batched_at, a.done_at = p.consumed_at, started, done
        return [a]

    def _forget(self, state: JobState) -> None:
        """The job is answered (or its partition left): its queued parts go, its computing
        ones are ignored when they finish."""
        state.finished = True
        if state.outstanding > 0:
            for batcher in self.batchers.values():
                batcher.remove(lambda part: part.state is state)
        self._states.pop(id(state.pending), None)

    def expired_result(self, p: Part, now_ms: int) -> ModerationResult:
        p.state.expired = True
        return job_result(p.state, self.models, now_ms, single_model_v1=self._single_model_v1)

    def encode(self, result: ModerationResult) -> tuple[bytes, Headers]:
        # Results of one model set and contract version carry the same headers: built once.
        key = (result.model_id, result.engine_hash, result.schema_version)
        headers = self._headers.get(key)
        if headers is None:
            headers = self._headers[key] = moderation_headers(*key)
        return encode_result(result), headers

    # -- the loop's bookkeeping -----------------------------------------------------------
    def remove(self, keys: set[TopicPartitionKey]) -> None:
        for state in [s for s in self._states.values() if s.pending.partition_key in keys]:
            self._forget(state)
        super().remove(keys)

    def _dropped(self, items: list[Part]) -> None:
        super()._dropped(items)
        for part in items:  # left unanswered for the partition's next owner
            if not part.state.finished:
                self._forget(part.state)

    def held(self) -> int:
        """Jobs held: queued or computing (the loop drains until this is zero)."""
        self.batchers  # noqa: B018 - raises if not served
        return len(self._states)
