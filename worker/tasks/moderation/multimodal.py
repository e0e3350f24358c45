"""Image-and-text moderation: a job's parts batched per engine, decided by its policy.

Composition, not a rewrite: open_nsfw parts run through the existing
:class:`worker.tasks.moderation.open_nsfw.ModerationTask` (its decode, preprocessing and padding),
fed a copy
of the job under the always-present ``default`` policy; only its ``nsfw``/``sfw`` scores are
used. Text chunks, CLIP images and CLIP captions run on their own engines. Each engine has its
own :class:`worker.tasks.batcher.DynamicBatcher`, so text batches and image batches form
independently, and a job's result waits for all of its parts (see worker.tasks.moderation.parts).
The service drives it like the batcher + task pair it has today: ``check`` at intake (unknown
policy, nothing to score -> DLQ), ``add``, ``step`` (release due batches, answer expired jobs),
``collect`` (finished jobs), ``remove`` on revoke.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected, UnknownPolicy
from worker.exceptions import NothingToScore as NothingToScore  # re-exported: defined here before
from worker.exceptions import TextTooLong as TextTooLong
from worker.tasks.batched import make_batcher
from worker.tasks.batcher import Batch, DynamicBatcher
from worker.tasks.moderation.open_nsfw import Outcome, Pending
from worker.tasks.moderation.part_runner import Engines, Finished, PartRunner, decide
from worker.tasks.moderation.parts import JobState, Part, PartKind, image_part, plan_models
from worker.tasks.moderation.policies import Decision
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status


class ImageScorer(Protocol):
    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]: ...


@dataclasses.dataclass(slots=True)
class MultimodalOutcome:
    pending: Pending
    result: ModerationResult | None = None
    decision: Decision | None = None  # rule and models run, for the result's wire fields
    rejection: JobRejected | None = None


class MultimodalTask:
    def __init__(self, cfg: WorkerConfig, policies: Mapping[str, PolicySettings],
                 engines: Engines, image_scorer: ImageScorer | None = None, *,
                 expire_deadlines: bool = True) -> None:
        self.cfg, self.policies, self.engines = cfg, policies, engines
        self._image_scorer = image_scorer
        self._runner = PartRunner(cfg, engines, self._score_images)
        b = cfg.batch
        self._batchers: dict[PartKind, DynamicBatcher[Part]] = {
            kind: make_batcher(b, profiles, expire_deadlines=expire_deadlines)
            for kind, profiles in engines.profiles().items()}
        if "open_nsfw" in self._batchers and image_scorer is None:
            raise ValueError("a policy runs open_nsfw: pass the image scorer (ModerationTask)")
        self._pool = ThreadPoolExecutor(b.max_in_flight_batches, thread_name_prefix="mm-batch")
        self._in_flight: list[Future[list[Finished]]] = []
        self._states: dict[int, JobState] = {}  # id(pending) -> state, until answered

    # -- intake ---------------------------------------------------------------------------
    def check(self, job: ModerationJob) -> None:
        policy = self.policies.get(job.policy)
        if policy is None:
            known = ", ".join(sorted(self.policies))
            raise UnknownPolicy(f"policy {job.policy!r} is not configured (known: {known})")
        has_text = bool(job.text and job.text.strip())
        if not plan_models(policy, bool(job.image), has_text):
            given = " and ".join(k for k, v in (("image", job.image), ("text", has_text)) if v)
            raise NothingToScore(f"policy {job.policy!r} runs {policy.models}; the job has "
                                 f"{given or 'neither image nor text'}: nothing to score")
        if has_text and "text" in policy.models and self.engines.text is not None:
            n = len(self.engines.text.tokenizer.chunks(job.text or ""))
            if n > self.cfg.moderation.text.max_chunks:
                raise TextTooLong(f"text makes {n} chunks, over moderation.text.max_chunks "
                                  f"{self.cfg.moderation.text.max_chunks}")

    def add(self, p: Pending) -> None:
        """Queue a checked job's parts (``check`` first: it raises what goes to the DLQ)."""
        state = JobState(p, self.policies[p.job.policy])
        parts = self._parts(state)
        state.outstanding = len(parts)
        self._states[id(p)] = state
        for part in parts:
            self._batchers[part.kind].add(part)

    def _parts(self, state: JobState) -> list[Part]:
        job, parts = state.pending.job, list[Part]()
        has_text = bool(job.text and job.text.strip())
        for model in plan_models(state.policy, bool(job.image), has_text):
            if model == "open_nsfw":
                parts.append(image_part(state))
            elif model == "text":
                parts += self._runner.text_parts(state, job.text or "")
            else:
                parts += self._runner.clip_parts(state, job.text if has_text else None)
        return parts

    # -- schedule / collect ---------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def wait(self, timeout: float) -> None:
        """Block until a batch in flight finishes, or ``timeout`` seconds."""
        if self._in_flight:
            wait(self._in_flight, timeout=timeout, return_when=FIRST_COMPLETED)

    def __len__(self) -> int:
        """Jobs held: queued or computing (the service drains until this is zero)."""
        return len(self._states)

    def step(self, now: float, now_ms: int, *, force: bool = False
             ) -> list[MultimodalOutcome]:
        """Release due batches into free in-flight slots; answer jobs found expired."""
        out: list[MultimodalOutcome] = []
        for kind, batcher in self._batchers.items():
            free = self.cfg.batch.max_in_flight_batches - len(self._in_flight)
            due = batcher.schedule(now, now_ms, limit=max(free, 0), force=force)
            for part in due.expired:
                part.state.expired = True
                out += self._finish(part.state, now_ms)
            for batch in due.batches:
                self._in_flight.append(self._pool.submit(self._runner.run, kind, batch))
        return out

    def collect(self, *, block: bool) -> list[MultimodalOutcome]:
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
                self._runner.apply(part, value)
                if state.failed or state.outstanding == 0:
                    out += self._finish(state, int(time.time() * 1e3))
        self._in_flight = pending
        return out

    def remove(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        """Drop queued jobs matching ``predicate`` (revoked partitions); computing parts of
        theirs are ignored when they finish."""
        dropped = [s for s in self._states.values() if predicate(s.pending)]
        for state in dropped:
            state.finished = True
            self._forget(state)
        return [s.pending for s in dropped]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _forget(self, state: JobState) -> None:
        for batcher in self._batchers.values():
            batcher.remove(lambda part: part.state is state)
        self._states.pop(id(state.pending), None)

    def _finish(self, state: JobState, now_ms: int) -> list[MultimodalOutcome]:
        if state.finished:
            return []
        state.finished = True
        self._forget(state)
        p = state.pending
        if state.rejection is not None:
            return [MultimodalOutcome(p, rejection=state.rejection)]
        result, decision = decide(self.engines, state, now_ms)
        return [MultimodalOutcome(p, result=result, decision=decision)]

    # -- open_nsfw through the existing task ----------------------------------------------
    def _score_images(self, batch: Batch[Part]) -> list[Finished]:
        assert self._image_scorer is not None  # checked in __init__
        copies = [dataclasses.replace(part.state.pending, job=dataclasses.replace(
            part.state.pending.job, policy="default")) for part in batch.items]
        outcomes = self._image_scorer.submit(
            Batch(batch.profile, copies, batch.padded_size)).result()
        by_copy = {id(c): part for c, part in zip(copies, batch.items, strict=True)}
        done: list[Finished] = []
        for o in outcomes:
            part = by_copy[id(o.pending)]
            if o.rejection is not None:
                done.append((part, o.rejection))
            elif o.result is None or o.result.status is not Status.OK:
                done.append((part, (o.result.error if o.result else None) or "image failed"))
            else:
                done.append((part, dict(o.result.scores)))
        return done
