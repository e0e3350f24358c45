"""Running a batch of parts on its model, and turning a complete job into its result.

Everything here loops over the model plug-ins (:mod:`worker.tasks.moderation.models`): no
model is named.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from engines.exceptions import InferenceFailed
from engines.profiles import Profile
from worker.exceptions import TaskFailed, one_line
from worker.tasks.batched import stops_the_worker
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import Finished, ModerationModel
from worker.tasks.moderation.parts import JobState, Part, PartFailed, mark_started
from worker.tasks.moderation.scoring.policies import Decision, ScoresByModel, evaluate
from worker.wire.moderation_jobs import ModerationResult, Status, Verdict

log = structlog.get_logger("worker")


class Models:
    """The model plug-ins a task runs, by name (in registry order) and by part kind."""

    def __init__(self, models: Mapping[str, ModerationModel]) -> None:
        self.by_name = dict(models)
        self.by_kind: dict[str, ModerationModel] = {}
        for model in self.by_name.values():
            for kind in model.profiles():
                if kind in self.by_kind:
                    raise ValueError(f"part kind {kind!r} of model {model.name!r} is already "
                                     f"{self.by_kind[kind].name!r}'s")
                self.by_kind[kind] = model

    def profiles(self) -> dict[str, tuple[Profile, ...]]:
        """Every part kind with its engine's profiles."""
        return {kind: profiles for model in self.by_name.values()
                for kind, profiles in model.profiles().items()}

    def identity(self, model: str) -> tuple[str, str]:
        """(model id, engine hash) for a result."""
        return self.by_name[model].identity()

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        """Off the loop's thread: the batch's parts with their values.

        A model that raises anything but InferenceFailed has a bug on some input. The batch is
        split in halves until the parts that raise are alone; each of those gets a TaskFailed
        (its job is dead-lettered as internal_error, to redrive once fixed) instead of the
        exception stopping the task at the same offset on every restart."""
        for part in batch.items:
            mark_started(part.state)
        try:
            return self.by_kind[kind].run(kind, batch)
        except InferenceFailed as exc:
            return [(p, PartFailed(str(exc))) for p in batch.items]
        except MemoryError:
            raise
        except Exception as exc:  # a bug on some input: pinned on its job below, never lost
            if stops_the_worker(exc):
                raise
            items = list(batch.items)
            if len(items) == 1:
                why = one_line(f"{type(exc).__name__}: {exc}")
                log.error("part_failed_alone", kind=kind, job_id=items[0].state.pending.job.id,
                          error=why)
                return [(items[0], TaskFailed(f"the {kind} model failed on this job: {why}"))]
            halves = (items[:len(items) // 2], items[len(items) // 2:])
            return [done for half in halves for done in self.run(
                kind, Batch(batch.profile, half, batch.profile.padded(len(half))))]


def scores_of(models: Models, state: JobState) -> ScoresByModel:
    """Each model's scores of a complete job, under the job's policy."""
    policy = state.pending.job.policy
    return {name: models.by_name[name].scores(policy, values)
            for name, values in state.values.items()}


def decide(models: Models, state: JobState, now_ms: int
           ) -> tuple[ModerationResult, Decision | None]:
    p, now = state.pending, time.monotonic()
    started = state.started or now
    timings = {"queue": (started - p.consumed_at) * 1e3, "infer": (now - started) * 1e3,
               "total": (now - p.consumed_at) * 1e3}

    def result(status: Status, model_id: str = "-", engine_hash: str = "-", *,
               verdict: Verdict | None = None, scores: dict[str, float] | None = None,
               error: str | None = None, rule: str | None = None,
               models_run: tuple[str, ...] = ()) -> ModerationResult:
        return ModerationResult(id=p.job.id, status=status, policy=p.job.policy,
                                model_id=model_id, engine_hash=engine_hash, source=p.ref,
                                timings_ms=timings, verdict=verdict, scores=scores or {},
                                error=error, rule=rule, models=models_run,
                                schema_version=p.job.schema_version)

    if state.expired:
        late = now_ms - (p.job.deadline_ms or now_ms)
        return result(Status.EXPIRED, error=f"deadline passed {late} ms before all parts of "
                                            "the job reached their engines"), None
    if state.error is not None:
        return result(Status.ERROR, error=state.error), None
    decision = evaluate(state.policy, scores_of(models, state))
    ids = [models.identity(m) for m in decision.models_run]
    return result(Status.OK, "+".join(i for i, _ in ids), "+".join(h for _, h in ids),
                  verdict=decision.verdict, scores=decision.label_scores,
                  rule=decision.rule, models_run=decision.models_run), decision
